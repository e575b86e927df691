// gradzip-run -n N [--port P] [--grace S] [--env K=V] -- CMD ARGS...
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "bench/launcher/launcher.h"

namespace {

void usage(FILE* f) {
  std::fputs(
      "usage: gradzip-run -n N [--port P] [--grace SECONDS] [--env KEY=VALUE]... -- CMD [ARGS...]\n"
      "\n"
      "Starts N ranks of CMD on this machine with the torchrun environment\n"
      "(MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,\n"
      "LOCAL_WORLD_SIZE), prefixes every output line with \"[rank] \", and stops\n"
      "every rank (SIGTERM, then SIGKILL after the grace period) when one fails.\n"
      "Exits 0 when all ranks exit 0, else with the first failing rank's code.\n"
      "\n"
      "  -n, --nproc N      number of ranks (required)\n"
      "  --port P           MASTER_PORT (default: a free port)\n"
      "  --grace SECONDS    time between SIGTERM and SIGKILL (default 5)\n"
      "  --env KEY=VALUE    extra environment for every rank (repeatable)\n",
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

}  // namespace

int main(int argc, char** argv) {
  gz::launcher::LaunchOptions o;
  o.ranks = 0;
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
      o.grace = std::chrono::milliseconds(static_cast<long long>(std::atof(value("--grace")) * 1000));
    } else if (a == "--env") {
      const std::string kv = value("--env");
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::fprintf(stderr, "gradzip-run: --env takes KEY=VALUE, got '%s'\n", kv.c_str());
        return 2;
      }
      o.env[kv.substr(0, eq)] = kv.substr(eq + 1);
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
  if (o.ranks < 1 || o.command.empty()) {
    usage(stderr);
    return 2;
  }
  try {
    gz::launcher::LocalPlacement local;
    return gz::launcher::launch(o, local);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradzip-run: %s\n", e.what());
    return 1;
  }
}
