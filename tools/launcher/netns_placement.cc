#include "tools/launcher/netns_placement.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "common/units.h"

namespace gz::launcher {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kPrefix = "gzrun-";   // gzrun-<pid>-hub, gzrun-<pid>-r<k>
constexpr const char* kNetnsDir = "/run/netns";
constexpr const char* kRankDev = "eth0";
constexpr int kMaxNodes = 253;               // .1 .. .253 in one /24
constexpr auto kToolTimeout = std::chrono::seconds(20);

// A child process of this launcher, in its own process group so that a
// terminal's Ctrl-C (meant for the job) cannot kill it halfway through a
// teardown; stdin from /dev/null, stdout and stderr into a pipe.
struct Child {
  pid_t pid = -1;
  int out = -1;  // the pipe's read end
};

Child spawn(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGHUP}) ::signal(sig, SIG_DFL);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    std::fprintf(stderr, "cannot run %s: %s\n", a[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out[1]);
  return Child{pid, out[0]};
}

// Appends what the child writes to `output` (up to 64 KiB) until `enough`
// says so, the pipe closes, or the deadline passes (then returns false).
bool read_output(int fd, Clock::time_point deadline, std::string& output,
                 const std::function<bool(const std::string&)>& enough) {
  while (!enough(output)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n <= 0) continue;  // EINTR, or nothing yet
    char buf[4096];
    const ssize_t got = ::read(fd, buf, sizeof buf);
    if (got > 0) {
      if (output.size() < 65536) output.append(buf, static_cast<std::size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      break;
    }
  }
  return true;
}

void reap(pid_t pid, int* status) {
  while (::waitpid(pid, status, 0) < 0 && errno == EINTR) {
  }
}

// Runs a tool to its end (bounded); its exit code and output.
struct ToolResult {
  int code = -1;
  std::string output;
};

ToolResult run_tool(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
  const Child c = spawn(argv);
  ToolResult r;
  const bool timed_out = !read_output(c.out, Clock::now() + timeout, r.output, [](const std::string&) { return false; });
  ::close(c.out);
  if (timed_out) ::kill(-c.pid, SIGKILL);
  int status = 0;
  reap(c.pid, &status);
  if (timed_out) {
    r.code = -1;
    r.output += "(killed after " + std::to_string(timeout.count()) + " s)";
  } else {
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  while (!r.output.empty() && (r.output.back() == '\n' || r.output.back() == ' ')) r.output.pop_back();
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

// Starts a long-lived child (a node's namespace holder) and waits until it
// prints "ready". Returns its pid; throws with its output when it exits or
// stays silent.
pid_t start_holder(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
  const Child c = spawn(argv);
  std::string output;
  auto ready = [](const std::string& o) { return o.find("ready") != std::string::npos; };
  read_output(c.out, Clock::now() + timeout, output, ready);
  ::close(c.out);
  if (!ready(output)) {
    ::kill(-c.pid, SIGKILL);
    reap(c.pid, nullptr);
    throw std::runtime_error("could not set up a node's namespaces (" + join(argv) + "): " +
                             (output.empty() ? std::string("no output") : output));
  }
  return c.pid;
}

std::string find_tool(const char* name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";  // root's tools are not always on a user's PATH
  std::stringstream ss(path);
  for (std::string dir; std::getline(ss, dir, ':');) {
    if (dir.empty()) continue;
    const std::string p = dir + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Namespaces named gzrun-<pid>-..., by pid.
std::vector<std::pair<long, std::string>> our_namespaces() {
  std::vector<std::pair<long, std::string>> found;
  DIR* d = ::opendir(kNetnsDir);
  if (!d) return found;
  const std::size_t plen = std::strlen(kPrefix);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, plen, kPrefix) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + plen, &end, 10);
    if (pid > 0 && end && *end == '-') found.emplace_back(pid, name);
  }
  ::closedir(d);
  return found;
}

bool launcher_alive(long pid) {
  if (pid == static_cast<long>(::getpid())) return true;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  std::getline(f, comm);
  return comm == "gradzip-run";  // else the pid was reused by something else
}

// Kills what still runs inside one of our namespaces (a rank's child that left
// its process group), then deletes the namespace.
void delete_namespace(const Tools& t, const std::string& ns, bool verbose) {
  const ToolResult pids = run_tool({t.ip, "netns", "pids", ns}, kToolTimeout);
  if (pids.code == 0) {
    std::stringstream ss(pids.output);
    for (long pid; ss >> pid;)
      if (pid > 1) ::kill(static_cast<pid_t>(pid), SIGKILL);
  }
  const ToolResult del = run_tool({t.ip, "netns", "del", ns}, kToolTimeout);
  if (del.code != 0)
    std::fprintf(stderr, "gradzip-run: could not delete network namespace %s: %s\n", ns.c_str(), del.output.c_str());
  else if (verbose)
    std::fprintf(stderr, "gradzip-run: deleted network namespace %s\n", ns.c_str());
}

// IPv4 networks the host's own namespace uses (addresses and routes, except
// the default route), as (network, mask) in host byte order.
std::vector<std::pair<std::uint32_t, std::uint32_t>> host_networks() {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> nets;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (const ifaddrs* a = list; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !a->ifa_netmask) continue;
      const std::uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
      const std::uint32_t mask = ntohl(reinterpret_cast<const sockaddr_in*>(a->ifa_netmask)->sin_addr.s_addr);
      nets.emplace_back(ip & mask, mask);
      nets.emplace_back(ip, 0xFFFFFFFFu);
    }
    ::freeifaddrs(list);
  }
  std::ifstream routes("/proc/net/route");  // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
  std::string line;
  std::getline(routes, line);
  while (std::getline(routes, line)) {
    std::stringstream ss(line);
    std::string iface, dst, gw, flags, refcnt, use, metric, mask;
    if (!(ss >> iface >> dst >> gw >> flags >> refcnt >> use >> metric >> mask)) continue;
    const std::uint32_t d = ntohl(static_cast<std::uint32_t>(std::strtoul(dst.c_str(), nullptr, 16)));
    const std::uint32_t m = ntohl(static_cast<std::uint32_t>(std::strtoul(mask.c_str(), nullptr, 16)));
    if (m != 0) nets.emplace_back(d & m, m);
  }
  return nets;
}

std::string cpu_mask() {
  // rps_cpus takes comma-separated 32-bit hex words, most significant first.
  const long n = std::max(1L, std::min(::sysconf(_SC_NPROCESSORS_ONLN), 1024L));
  std::vector<std::uint32_t> words(static_cast<std::size_t>((n + 31) / 32), 0);
  for (long c = 0; c < n; ++c) words[static_cast<std::size_t>(c / 32)] |= 1u << (c % 32);
  std::string s;
  for (std::size_t i = words.size(); i-- > 0;) {
    char b[16];
    std::snprintf(b, sizeof b, "%x", words[i]);
    s += (s.empty() ? "" : ",") + std::string(b);
  }
  return s;
}

}  // namespace

LinkSpec parse_link(std::string_view text) {
  const units::Link parsed = units::parse_link(text);  // the one parser (common/units.h)
  LinkSpec l;
  l.text = std::string(text);
  l.rate_bps = parsed.rate_bps;
  l.delay_ns = parsed.delay_ns;
  return l;
}

std::uint64_t default_burst(std::uint64_t rate_bps, int mtu) {
  const double four_ms = static_cast<double>(rate_bps) / 8 * 4e-3;
  const double lo = 65536.0 + mtu + 64, hi = 2.0 * 1024 * 1024;
  return static_cast<std::uint64_t>(std::clamp(four_ms, lo, hi));
}

Tools check_prerequisites() {
  if (::geteuid() != 0)
    throw std::runtime_error(
        "--link needs root: it makes network namespaces, veth pairs and tc qdiscs (CAP_SYS_ADMIN, "
        "CAP_NET_ADMIN). Run it as root (e.g. sudo), or run without --link for plain local ranks");
  Tools t{find_tool("ip"), find_tool("tc"), find_tool("unshare"), find_tool("nsenter")};
  if (t.ip.empty() || t.tc.empty())
    throw std::runtime_error(std::string("--link needs iproute2 (") + (t.ip.empty() ? "ip " : "") +
                             (t.tc.empty() ? "tc " : "") +
                             "not found on PATH, /usr/sbin or /sbin): apt-get install iproute2");
  return t;
}

int cleanup_stale(const Tools& t, bool verbose) {
  int n = 0;
  auto found = our_namespaces();
  // Rank namespaces before hubs: a veth goes away with either end.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    const bool ah = a.second.ends_with("-hub"), bh = b.second.ends_with("-hub");
    return ah != bh ? bh : a.second < b.second;
  });
  for (const auto& [pid, ns] : found) {
    if (launcher_alive(pid)) continue;
    if (verbose) std::fprintf(stderr, "gradzip-run: %s belongs to pid %ld, which is gone\n", ns.c_str(), pid);
    delete_namespace(t, ns, verbose);
    ++n;
  }
  return n;
}

NetnsPlacement::NetnsPlacement(LinkSpec link, bool verbose, int ranks_per_node)
    : link_(std::move(link)), verbose_(verbose), per_node_(ranks_per_node) {
  if (per_node_ < 1) throw std::invalid_argument("--ranks-per-node must be at least 1");
  if (link_.burst_bytes == 0) link_.burst_bytes = default_burst(link_.rate_bps, link_.mtu);
  if (link_.mtu < 576 || link_.mtu > 65000) throw std::invalid_argument("--mtu must be in 576..65000");
  if (link_.burst_bytes < static_cast<std::uint64_t>(link_.mtu) + 64)
    throw std::invalid_argument("--burst must be at least the MTU plus headers (" + std::to_string(link_.mtu + 64) +
                                " bytes): a larger packet could never pass the token bucket");
}

NetnsPlacement::~NetnsPlacement() { teardown(); }

std::string NetnsPlacement::hub_namespace() const { return prefix_ + "hub"; }
std::string NetnsPlacement::node_namespace(int node) const { return prefix_ + "n" + std::to_string(node); }
std::string NetnsPlacement::node_address(int node) const {
  return "10.213." + std::to_string(subnet_) + "." + std::to_string(node + 1);
}

void NetnsPlacement::run(const std::vector<std::string>& argv) const {
  if (verbose_) std::fprintf(stderr, "gradzip-run: %s\n", join(argv).c_str());
  const ToolResult r = run_tool(argv, kToolTimeout);
  if (r.code != 0) throw std::runtime_error("'" + join(argv) + "' failed: " + r.output);
}

// tbf on `dev`: RATE with the bucket above and a queue of 20 ms at RATE, a
// switch port's buffer: room for flows converging on one port, small next to
// a phase of the allreduce. On the rank's own egress the queue is at least
// 1 MiB: there a full tbf drops the packet and the local TCP sender halves
// its window as if the network had (a real NIC makes the socket wait); 2
// ranks at 100 Mbit/s lost 46-76 packets per run with 20 ms (325 KB). Not
// more: a deep queue is latency that every step of a ring allreduce pays
// (16 MiB made gloo's 4M-float allreduce at 1 Gbit/s 1.48x the link time,
// against 1.05x with 3 MB). With a delay, netem (root) holds each packet
// DELAY and hands it to the tbf child.
void NetnsPlacement::shape(const std::string& ns, const std::string& dev, bool with_delay) const {
  const std::uint64_t port_queue =
      std::max<std::uint64_t>(link_.rate_bps / 8 / 50 + link_.burst_bytes, 4 * link_.burst_bytes);
  const bool egress = with_delay;  // the rank's side of the veth
  const std::uint64_t limit = egress ? std::max<std::uint64_t>(port_queue, 1ull << 20) : port_queue;
  std::vector<std::string> tbf = {"tbf", "rate", std::to_string(link_.rate_bps) + "bit", "burst",
                                  std::to_string(link_.burst_bytes), "limit", std::to_string(limit)};
  std::vector<std::string> cmd = {tools_.tc, "-n", ns, "qdisc", "add", "dev", dev};
  if (with_delay && link_.delay_ns) {
    char delay[64];
    std::snprintf(delay, sizeof delay, "%.3fus", static_cast<double>(link_.delay_ns) / 1e3);
    auto netem = cmd;
    netem.insert(netem.end(), {"root", "handle", "1:", "netem", "delay", delay, "limit", "1000000"});
    if (verbose_) std::fprintf(stderr, "gradzip-run: %s\n", join(netem).c_str());
    const ToolResult r = run_tool(netem, kToolTimeout);
    if (r.code != 0) {
      std::string said = r.output;
      while (!said.empty() && said.back() == '.') said.pop_back();
      const bool missing = r.output.find("nknown") != std::string::npos || r.output.find("No such file") != std::string::npos;
      throw std::runtime_error(
          "--link " + link_.text + ": the delay needs tc's netem qdisc" +
          (missing ? ", which this kernel does not have (module sch_netem)" : "") + "; tc said: " + said +
          (missing ? ". Load sch_netem (modprobe sch_netem) or run with a rate only, e.g. --link " +
                         link_.text.substr(0, link_.text.find(','))
                   : ""));
    }
    cmd.insert(cmd.end(), {"parent", "1:1", "handle", "10:"});
  } else {
    cmd.insert(cmd.end(), {"root", "handle", "1:"});
  }
  cmd.insert(cmd.end(), tbf.begin(), tbf.end());
  run(cmd);
}

// Receive packet steering over every CPU on a veth's receiving side. Without
// it, veth hands each packet to the backlog of the CPU that happened to send
// (or dequeue) it; when that changes mid-flow, TCP sees reordering, sends
// spurious retransmissions and backs off. Measured on this 2-CPU VM, 15
// fp32 allreduces of 25.6M floats on 4 ranks at 1 Gbit/s: 7800 retransmitted
// segments without RPS, 53 with it. IPv6 is switched off on the device: the
// ranks use the IPv4 addresses made here and nothing else.
void NetnsPlacement::tune(const std::string& ns, const std::string& dev) const {
  const std::string script = "echo " + cpu_mask() + " > /sys/class/net/" + dev +
                             "/queues/rx-0/rps_cpus && { echo 1 > /proc/sys/net/ipv6/conf/" + dev +
                             "/disable_ipv6 2>/dev/null || true; }";
  run({tools_.ip, "netns", "exec", ns, "/bin/sh", "-c", script});
}

void NetnsPlacement::setup(int ranks) {
  if (ranks % per_node_ != 0)
    throw std::invalid_argument(std::to_string(ranks) + " ranks do not fill nodes of --ranks-per-node " +
                                std::to_string(per_node_));
  const int nodes = ranks / per_node_;
  if (nodes > kMaxNodes) throw std::runtime_error("--link supports at most " + std::to_string(kMaxNodes) + " nodes");
  tools_ = check_prerequisites();
  if (per_node_ > 1 && (tools_.unshare.empty() || tools_.nsenter.empty()))
    throw std::runtime_error("--ranks-per-node needs unshare and nsenter (util-linux): apt-get install util-linux");
  if (const int n = cleanup_stale(tools_, verbose_))
    std::fprintf(stderr, "gradzip-run: removed %d network namespace(s) left by an earlier run\n", n);
  prefix_ = std::string(kPrefix) + std::to_string(::getpid()) + "-";
  ranks_ = ranks;

  // A /24 in 10.213.0.0/16 that the host uses for nothing. The namespaces are
  // isolated from the host either way; this keeps messages unambiguous.
  const auto nets = host_networks();
  for (int i = 0; i < 256 && subnet_ < 0; ++i) {
    const int x = (static_cast<int>(::getpid()) + i) % 256;
    const std::uint32_t net = (10u << 24) | (213u << 16) | (static_cast<std::uint32_t>(x) << 8), mask = 0xFFFFFF00u;
    bool clash = false;
    for (const auto& [n, m] : nets)
      if ((net & m) == (n & m) || (n & mask) == net) clash = true;
    if (!clash) subnet_ = x;
  }
  if (subnet_ < 0) throw std::runtime_error("every /24 of 10.213.0.0/16 is in use on this host; --link needs one");

  try {
    const std::string hub = hub_namespace(), mtu = std::to_string(link_.mtu);
    run({tools_.ip, "netns", "add", hub});
    made_.push_back(hub);
    run({tools_.ip, "-n", hub, "link", "set", "lo", "up"});
    run({tools_.ip, "-n", hub, "link", "add", "br0", "mtu", mtu, "type", "bridge"});
    for (int k = 0; k < nodes; ++k) {
      const std::string ns = node_namespace(k), port = "v" + std::to_string(k);
      run({tools_.ip, "netns", "add", ns});
      made_.push_back(ns);
      run({tools_.ip, "-n", ns, "link", "set", "lo", "up"});
      run({tools_.ip, "-n", hub, "link", "add", port, "mtu", mtu, "type", "veth", "peer", "name", kRankDev, "mtu", mtu,
           "netns", ns});
      run({tools_.ip, "-n", hub, "link", "set", port, "master", "br0"});
      tune(hub, port);
      tune(ns, kRankDev);
      shape(ns, kRankDev, true);   // the node's egress (and the delay)
      shape(hub, port, false);     // the node's ingress
      run({tools_.ip, "-n", ns, "addr", "add", node_address(k) + "/24", "dev", kRankDev});
      run({tools_.ip, "-n", ns, "link", "set", kRankDev, "up"});
      run({tools_.ip, "-n", hub, "link", "set", port, "up"});
      if (per_node_ > 1) {
        const std::string script = "echo gznode-" + std::to_string(k) +
                                   " > /proc/sys/kernel/hostname && mount -t tmpfs -o mode=1777 gzshm /dev/shm && "
                                   "echo ready && exec sleep infinity";
        holders_.push_back(start_holder({tools_.ip, "netns", "exec", ns, tools_.unshare, "--uts", "--ipc", "--mount",
                                         "--propagation", "private", "/bin/sh", "-c", script},
                                        kToolTimeout));
      }
    }
    run({tools_.ip, "-n", hub, "link", "set", "br0", "up"});
  } catch (...) {
    teardown();
    throw;
  }
  char burst[64];
  std::snprintf(burst, sizeof burst, "%.0f KiB", static_cast<double>(link_.burst_bytes) / 1024);
  const std::string layout = per_node_ == 1 ? std::to_string(ranks) + " ranks, each in its own network namespace"
                                            : std::to_string(nodes) + " nodes x " + std::to_string(per_node_) +
                                                  " ranks, a network namespace per node";
  std::fprintf(stderr, "gradzip-run: emulated cluster: %s (%s*), 10.213.%d.1-%d, links %s (tbf burst %s, MTU %d)%s\n",
               layout.c_str(), prefix_.c_str(), subnet_, nodes, link_.text.c_str(), burst, link_.mtu,
               link_.delay_ns ? " with netem delay" : "");
}

std::string NetnsPlacement::master_addr() const { return node_address(0); }

// The namespaces are new: nothing listens in them yet, any port is free.
int NetnsPlacement::master_port(int requested) const { return requested ? requested : 29500; }

// UCX over the shaped TCP links. Eager messages for every size: with UCX's
// default rendezvous, a receiver's go-ahead (RTR) travels on the same TCP
// connection as the bulk data that receiver is already sending, and can wait
// behind megabytes of it, so the two directions of an exchange serialize at
// random. Measured, fp32 allreduce on 4 ranks at 1 Gbit/s (link bound 50, 201,
// 805 ms): 1M floats 78 -> 53 ms, 4M 385 -> 246 ms, 16M 1099 -> 943 ms; at
// 25.6M and 100M no difference; 2 ranks at 100 Mbit/s, 2M floats: 1.4-1.75x
// the link time -> 1.03x. Larger TCP segments halve the per-fragment work of
// eager sends. --env overrides any of these.
std::map<std::string, std::string> NetnsPlacement::env(int rank) const {
  const std::string node = std::to_string(node_of(rank));
  std::map<std::string, std::string> env = {
      {"LOCAL_RANK", std::to_string(rank % per_node_)},  // the torchrun names of where a rank is
      {"LOCAL_WORLD_SIZE", std::to_string(per_node_)},
      {"GROUP_RANK", node},
      {"GRADZIP_NODE", node},
      // The shaped link between nodes; shared memory inside a node of several.
      {"UCX_TLS", per_node_ > 1 ? "tcp,sm" : "tcp"},
      {"UCX_NET_DEVICES", kRankDev},
      {"UCX_RNDV_THRESH", "inf"},
      {"UCX_TCP_TX_SEG_SIZE", "64k"},
      {"UCX_TCP_RX_SEG_SIZE", "128k"},
      {"GLOO_SOCKET_IFNAME", kRankDev},    // torch.distributed's gloo
      {"NCCL_SOCKET_IFNAME", kRankDev},
      {"GRADZIP_LINK", link_.text},
      // The tbf bucket: bytes a link passes at once after it idled (the cost model's burst).
      {"GRADZIP_LINK_BURST", std::to_string(link_.burst_bytes)},
  };
  if (per_node_ > 1) {
    // Eager messages over shared memory go through a receive FIFO; with
    // UCX's 64 entries (512 KiB) a sender of a 1 MiB segment fills it and
    // waits for the receiver, which no event announces: 25.6M floats
    // reduce-scattered and gathered inside a node took 4.5 s, 0.37 s with 1024.
    // Only where UCX_TLS has sm: UCX warns about every UCX_ variable that no
    // loaded transport reads ("unused env variables"), once per rank.
    env["UCX_POSIX_FIFO_SIZE"] = "1024";
    env["UCX_SYSV_FIFO_SIZE"] = "1024";
  }
  return env;
}

std::vector<std::string> NetnsPlacement::wrap(int rank, const std::vector<std::string>& command) const {
  std::vector<std::string> argv = {tools_.ip, "netns", "exec", node_namespace(node_of(rank))};
  if (per_node_ > 1)  // the node's host name, IPC and /dev/shm too
    argv = {tools_.nsenter, "--target", std::to_string(holders_[static_cast<std::size_t>(node_of(rank))]), "--uts",
            "--ipc", "--mount", "--net", "--wd"};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

void NetnsPlacement::teardown() {
  for (const int pid : holders_) {
    ::kill(-pid, SIGKILL);
    reap(pid, nullptr);
  }
  holders_.clear();
  // Ranks first, then the hub: deleting a rank's namespace takes its veth
  // pair (and the switch port) with it.
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) delete_namespace(tools_, *it, verbose_);
  made_.clear();
}

}  // namespace gz::launcher
