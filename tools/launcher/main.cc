// gradzip-run -n N [--link RATE[,DELAY] [--ranks-per-node M]] [--port P] [--grace S] [--env K=V] -- CMD ARGS...
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "comm/security/job_token.h"
#include "tools/launcher/launcher.h"
#include "tools/launcher/netns_placement.h"

namespace {

void usage(FILE* f) {
  std::fputs(
      "usage: gradzip-run -n N [--link RATE[,DELAY] [--ranks-per-node M]] [--port P] [--grace SECONDS]\n"
      "                   [--env KEY=VALUE]... -- CMD [ARGS...]\n"
      "       gradzip-run --cleanup\n"
      "\n"
      "Starts N ranks of CMD on this machine with the torchrun environment\n"
      "(MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,\n"
      "LOCAL_WORLD_SIZE), prefixes every output line with \"[rank] \", and stops\n"
      "every rank (SIGTERM, then SIGKILL after the grace period) when one fails.\n"
      "Exits 0 when all ranks exit 0, else with the first failing rank's code.\n"
      "Each job gets a random GRADZIP_JOB_TOKEN (unless one is set), so that only\n"
      "its ranks can use its rendezvous store. No rank outlives gradzip-run, even\n"
      "when it is killed with SIGKILL.\n"
      "\n"
      "  -n, --nproc N      number of ranks (required)\n"
      "  --port P           MASTER_PORT (default: a free port)\n"
      "  --grace SECONDS    time between SIGTERM and SIGKILL, 0..3600 (default 5)\n"
      "  --env KEY=VALUE    extra environment for every rank (repeatable). A GRADZIP_JOB_TOKEN given\n"
      "                     here or in the environment must be at least 16 characters of random\n"
      "                     data; an empty or guessable one (whitespace, few distinct characters,\n"
      "                     mostly repeats, runs like 0123456789abcdef or copies like abcabc) is\n"
      "                     refused, as the ranks would refuse it\n"
      "\n"
      "Emulated cluster (root and iproute2 needed):\n"
      "  --link RATE[,DELAY]  each rank in its own network namespace, joined to a switch\n"
      "                     (a bridge) by a link shaped to RATE each way (tc tbf), e.g. 1gbit,\n"
      "                     10gbit, 100mbit; DELAY adds one-way latency between ranks (tc netem,\n"
      "                     e.g. 50us, 1ms; refused when the kernel lacks netem). Ranks get\n"
      "                     MASTER_ADDR = rank 0's address, UCX_TLS=tcp, UCX_NET_DEVICES and\n"
      "                     GLOO_SOCKET_IFNAME = eth0, UCX eager sends (--env overrides them;\n"
      "                     docs/cluster.md). Everything it makes is deleted when the job ends,\n"
      "                     fails or is interrupted.\n"
      "  --ranks-per-node M M ranks per node: they share one namespace (their traffic to each other\n"
      "                     unshaped, like ranks on one machine); nodes are joined by links of RATE.\n"
      "                     N must be a multiple of M. Ranks get LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
      "                     GROUP_RANK and GRADZIP_NODE of their node (default 1)\n"
      "  --mtu BYTES        link MTU (default 9000: jumbo frames, as on cluster networks)\n"
      "  --burst BYTES      tbf bucket (default 4 ms at RATE, within 64 KiB..2 MiB)\n"
      "  --verbose          print every ip/tc command\n"
      "  --cleanup          delete namespaces left by gradzip-run processes that are gone, and exit\n",
      f);
}

int parse_int(const char* s, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!*s || *end || v < 0 || v > 1 << 20) {
    std::fprintf(stderr, "gradzip-run: %s must be a non-negative integer, got '%s'\n", what, s);
    std::exit(2);
  }
  return static_cast<int>(v);
}

// Seconds between SIGTERM and SIGKILL: a finite number in [0, 3600].
std::chrono::milliseconds parse_grace(const char* s) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (!*s || *end || !std::isfinite(v) || v < 0 || v > 3600) {
    std::fprintf(stderr, "gradzip-run: --grace must be a number of seconds in [0, 3600], got '%s'\n", s);
    std::exit(2);
  }
  return std::chrono::milliseconds(static_cast<long long>(std::llround(v * 1000)));
}

}  // namespace

int main(int argc, char** argv) {
  gz::launcher::LaunchOptions o;
  o.ranks = 0;
  std::string link, mtu, burst;
  int per_node = 0;
  bool verbose = false, cleanup = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gradzip-run: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--") {
      ++i;
      break;
    } else if (a == "-n" || a == "--nproc" || a == "--nproc-per-node") {
      o.ranks = parse_int(value("-n"), "-n");
    } else if (a == "--port") {
      o.port = parse_int(value("--port"), "--port");
    } else if (a == "--grace") {
      o.grace = parse_grace(value("--grace"));
    } else if (a == "--env") {
      const std::string kv = value("--env");
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::fprintf(stderr, "gradzip-run: --env takes KEY=VALUE, got '%s'\n", kv.c_str());
        return 2;
      }
      o.env[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else if (a == "--link") {
      link = value("--link");
    } else if (a == "--ranks-per-node") {
      per_node = parse_int(value("--ranks-per-node"), "--ranks-per-node");
      if (per_node < 1) {
        std::fprintf(stderr, "gradzip-run: --ranks-per-node must be at least 1\n");
        return 2;
      }
    } else if (a == "--mtu") {
      mtu = value("--mtu");
    } else if (a == "--burst") {
      burst = value("--burst");
    } else if (a == "--verbose") {
      verbose = true;
    } else if (a == "--cleanup") {
      cleanup = true;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "gradzip-run: unknown option '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    } else {
      break;  // the command starts here (no "--")
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (cleanup) {
    try {
      const auto tools = gz::launcher::check_prerequisites();
      const int n = gz::launcher::cleanup_stale(tools, true);
      std::fprintf(stderr, "gradzip-run: deleted %d stale network namespace(s)\n", n);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gradzip-run: %s\n", e.what());
      return 1;
    }
  }
  if (o.ranks < 1 || o.command.empty()) {
    usage(stderr);
    return 2;
  }
  // The token the job will run with, when the user gives one: a weak one is
  // refused before any rank starts, by the rule the ranks would refuse it by
  // (docs/comm.md, "Trust").
  {
    const auto given = o.env.find("GRADZIP_JOB_TOKEN");
    const char* from_env = std::getenv("GRADZIP_JOB_TOKEN");
    const bool set = given != o.env.end() || (from_env && *from_env);
    const std::string token = given != o.env.end() ? given->second : (from_env ? from_env : "");
    const char* where = given != o.env.end() ? "--env GRADZIP_JOB_TOKEN" : "GRADZIP_JOB_TOKEN";
    if (const std::string why = set ? gz::job_token_weakness(token) : std::string(); !why.empty()) {
      std::fprintf(stderr, "gradzip-run: %s %s; the ranks would refuse it: %s, or leave it unset for a fresh one\n",
                   where, why.c_str(), gz::kJobTokenAdvice);
      return 2;
    }
  }
  if (link.empty() && (!mtu.empty() || !burst.empty() || per_node)) {
    std::fprintf(stderr, "gradzip-run: --mtu, --burst and --ranks-per-node shape --link; give --link too\n");
    return 2;
  }
  if (per_node && o.ranks % per_node != 0) {
    std::fprintf(stderr, "gradzip-run: -n %d is not a multiple of --ranks-per-node %d\n", o.ranks, per_node);
    return 2;
  }
  try {
    if (link.empty()) {
      gz::launcher::LocalPlacement local;
      return gz::launcher::launch(o, local);
    }
    gz::launcher::LinkSpec spec;
    try {
      spec = gz::launcher::parse_link(link);
      if (!mtu.empty()) spec.mtu = parse_int(mtu.c_str(), "--mtu");
      if (!burst.empty()) {
        char* end = nullptr;
        spec.burst_bytes = std::strtoull(burst.c_str(), &end, 10);
        if (burst[0] == '-' || *end || spec.burst_bytes == 0 || spec.burst_bytes > (1ull << 30))
          throw std::invalid_argument("--burst must be a byte count in 1..2^30, got '" + burst + "'");
      }
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "gradzip-run: %s\n", e.what());
      return 2;
    }
    gz::launcher::NetnsPlacement netns(spec, verbose, per_node ? per_node : 1);
    return gz::launcher::launch(o, netns);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gradzip-run: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradzip-run: %s\n", e.what());
    return 1;
  }
}
