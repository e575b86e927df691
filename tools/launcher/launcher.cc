#include "tools/launcher/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "tools/launcher/reaper.h"

namespace gz::launcher {
namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const auto rc = ::write(g_signal_pipe[1], &b, 1);
}

// A line longer than this is relayed in pieces of this size, each a line of
// its own with the prefix: the launcher's memory stays bounded whatever a
// rank prints.
constexpr std::size_t kMaxLine = 64 * 1024;

// One output stream of one rank, relayed line by line with its prefix.
struct Stream {
  int fd = -1;
  FILE* out = nullptr;
  std::string partial;

  void relay(const std::string& prefix, const char* data, std::size_t n) {
    partial.append(data, n);
    std::size_t start = 0;
    for (;;) {
      const std::size_t nl = partial.find('\n', start);
      const std::size_t end = nl == std::string::npos ? partial.size() : nl;
      if (end - start >= kMaxLine) {  // a piece of a long line
        std::fputs(prefix.c_str(), out);
        std::fwrite(partial.data() + start, 1, kMaxLine, out);
        std::fputc('\n', out);
        start += kMaxLine;
        continue;
      }
      if (nl == std::string::npos) break;
      std::fputs(prefix.c_str(), out);
      std::fwrite(partial.data() + start, 1, nl + 1 - start, out);
      start = nl + 1;
    }
    partial.erase(0, start);
    std::fflush(out);
  }
  void finish(const std::string& prefix) {
    if (!partial.empty()) {
      std::fprintf(out, "%s%s\n", prefix.c_str(), partial.c_str());
      std::fflush(out);
      partial.clear();
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct Rank {
  pid_t pid = -1;
  Stream streams[2];
  bool done = false;
  int code = 0;  // exit code, or 128 + signal
};

// The job's secret (GRADZIP_JOB_TOKEN): 128 bits from the kernel, as hex.
std::string random_token() {
  unsigned char b[16];
  for (std::size_t got = 0; got < sizeof b;) {
    const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    if (n > 0) got += static_cast<std::size_t>(n);
  }
  std::string s;
  for (unsigned char c : b) {
    s += "0123456789abcdef"[c >> 4];
    s += "0123456789abcdef"[c & 15];
  }
  return s;
}

// How long the output of ranks that have all exited is still read: a
// process a rank left behind outside its group (setsid) may hold the pipes
// for ever.
constexpr auto kDrainAfterExit = std::chrono::milliseconds(1000);

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
                                  strsignal(WTERMSIG(status)) + ")";
  return "ended";
}

}  // namespace

int free_port(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    ::close(fd);
    throw std::runtime_error("free_port: '" + host + "' is not an IPv4 address");
  }
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("free_port: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

namespace {

// The launcher's signals go through a pipe to the poll loop. Installed before
// the placement's setup so that SIGINT/SIGTERM during setup still lets
// teardown run; removed (default actions back) only after teardown.
class SignalPipe {
 public:
  SignalPipe() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe failed");
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : kSignals) ::sigaction(sig, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);  // a write to the reaper's pipe after it died must not kill the launcher
  }
  ~SignalPipe() {
    for (int sig : kSignals) ::signal(sig, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  /// The first pending signal other than SIGCHLD (0 if none); consumes the pipe.
  static int pending() {
    int first = 0;
    unsigned char sigs[64];
    for (ssize_t n; (n = ::read(g_signal_pipe[0], sigs, sizeof sigs)) > 0;)
      for (ssize_t i = 0; i < n; ++i)
        if (!first && sigs[i] != SIGCHLD) first = sigs[i];
    return first;
  }
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGCHLD, SIGHUP};
};

}  // namespace

int launch(const LaunchOptions& o, Placement& placement) {
  if (o.ranks < 1) throw std::runtime_error("need at least one rank");
  if (o.command.empty()) throw std::runtime_error("no command given");
  SignalPipe signal_pipe;  // destroyed last: teardown below runs with signals caught
  placement.setup(o.ranks);
  struct Teardown {
    Placement& p;
    ~Teardown() { p.teardown(); }
  } teardown{placement};
  if (const int sig = SignalPipe::pending()) {
    std::fprintf(stderr, "gradzip-run: got %s during setup; starting no rank\n", strsignal(sig));
    return 128 + sig;
  }

  // Declared after the teardown: if the launcher dies, the reaper kills the
  // ranks' groups and undoes the placement; at a normal end it is told so
  // (destroyed first) and the launcher's own teardown runs.
  Reaper reaper([&placement] { placement.teardown(); });

  const std::string addr = placement.master_addr();
  const int port = placement.master_port(o.port);
  // The job's own token, unless the user gave one (--env, or the environment).
  std::map<std::string, std::string> job_env;
  const char* user_token = std::getenv("GRADZIP_JOB_TOKEN");
  if (!o.env.count("GRADZIP_JOB_TOKEN") && !(user_token && *user_token)) job_env["GRADZIP_JOB_TOKEN"] = random_token();
  const pid_t launcher = ::getpid();

  std::vector<Rank> ranks(static_cast<std::size_t>(o.ranks));
  for (int r = 0; r < o.ranks; ++r) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    const std::vector<std::string> argv_s = placement.wrap(r, o.command);
    const std::map<std::string, std::string> rank_env = placement.env(r);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      // Dies with the launcher, SIGKILL included; if the launcher is already
      // gone (it died before this line), do not start at all.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(128 + SIGKILL);
      ::setpgid(0, 0);  // its own group: signals reach the rank's children too
      for (int sig : SignalPipe::kSignals) ::signal(sig, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      const std::map<std::string, std::string> vars = {
          {"MASTER_ADDR", addr},
          {"MASTER_PORT", std::to_string(port)},
          {"RANK", std::to_string(r)},
          {"WORLD_SIZE", std::to_string(o.ranks)},
          {"LOCAL_RANK", std::to_string(r)},
          {"LOCAL_WORLD_SIZE", std::to_string(o.ranks)},
      };
      for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
      for (const auto& [k, v] : job_env) ::setenv(k.c_str(), v.c_str(), 1);
      for (const auto& [k, v] : rank_env) ::setenv(k.c_str(), v.c_str(), 1);
      for (const auto& [k, v] : o.env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "gradzip-run: cannot run '%s': %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here: no race with the child's own call
    reaper.started(pid);
    ::close(out[1]);
    ::close(err[1]);
    auto& rk = ranks[static_cast<std::size_t>(r)];
    rk.pid = pid;
    rk.streams[0] = Stream{out[0], stdout, {}};
    rk.streams[1] = Stream{err[0], stderr, {}};
  }

  int result = 0;
  bool stopping = false;
  Clock::time_point kill_at{};
  auto signal_all = [&](int sig) {
    for (auto& rk : ranks)
      if (!rk.done) ::kill(-rk.pid, sig);
  };
  auto stop_all = [&] {
    if (stopping) return;
    stopping = true;
    signal_all(SIGTERM);
    kill_at = Clock::now() + o.grace;
  };

  std::size_t running = ranks.size();
  bool killed = false;
  Clock::time_point all_exited{};  // when the last rank exited
  auto open_streams = [&] {
    for (auto& rk : ranks)
      for (auto& s : rk.streams)
        if (s.fd >= 0) return true;
    return false;
  };
  while (running > 0 || open_streams()) {
    if (running == 0) {
      if (all_exited == Clock::time_point{}) all_exited = Clock::now();
      if (Clock::now() - all_exited >= kDrainAfterExit) {
        // Every rank is gone; what still holds a pipe left the rank's
        // process group (setsid): stop reading, keep what was printed.
        for (std::size_t r = 0; r < ranks.size(); ++r)
          for (auto& s : ranks[r].streams)
            if (s.fd >= 0) s.finish("[" + std::to_string(r) + "] ");
        std::fprintf(stderr, "gradzip-run: every rank exited, but a process they started outside their process "
                             "group still holds their output; not waiting for it\n");
        break;
      }
    }
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<std::size_t, int>> who;
    for (std::size_t r = 0; r < ranks.size(); ++r)
      for (int k = 0; k < 2; ++k)
        if (ranks[r].streams[k].fd >= 0) {
          fds.push_back({ranks[r].streams[k].fd, POLLIN, 0});
          who.emplace_back(r, k);
        }
    int timeout_ms = 200;
    ::poll(fds.data(), fds.size(), timeout_ms);

    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      auto& rk = ranks[who[i - 1].first];
      auto& s = rk.streams[who[i - 1].second];
      const std::string prefix = "[" + std::to_string(who[i - 1].first) + "] ";
      char buf[65536];
      const ssize_t n = ::read(s.fd, buf, sizeof buf);
      if (n > 0)
        s.relay(prefix, buf, static_cast<std::size_t>(n));
      else if (n == 0 || (errno != EINTR && errno != EAGAIN))
        s.finish(prefix);
    }

    unsigned char sigs[64];
    ssize_t ns;
    while ((ns = ::read(g_signal_pipe[0], sigs, sizeof sigs)) > 0)
      for (ssize_t i = 0; i < ns; ++i) {
        const int sig = sigs[i];
        if (sig == SIGCHLD) continue;
        std::fprintf(stderr, "gradzip-run: got %s, stopping every rank\n", strsignal(sig));
        if (!result) result = 128 + sig;
        if (!stopping) {
          stopping = true;
          kill_at = Clock::now() + o.grace;
        }
        signal_all(sig == SIGHUP ? SIGTERM : sig);
      }

    for (std::size_t r = 0; r < ranks.size(); ++r) {
      auto& rk = ranks[r];
      if (rk.done) continue;
      int status = 0;
      if (::waitpid(rk.pid, &status, WNOHANG) != rk.pid) continue;
      rk.done = true;
      --running;
      rk.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      ::kill(-rk.pid, SIGKILL);  // anything the rank left behind in its group
      reaper.reaped(rk.pid);
      if (rk.code != 0 && !stopping) {
        std::fprintf(stderr, "gradzip-run: rank %zu %s; stopping the other ranks\n", r, describe_status(status).c_str());
        result = rk.code;
        stop_all();
      }
    }
    if (stopping && !killed && running > 0 && Clock::now() >= kill_at) {
      std::fprintf(stderr, "gradzip-run: ranks still running %lld ms after SIGTERM; sending SIGKILL\n",
                   static_cast<long long>(o.grace.count()));
      signal_all(SIGKILL);
      killed = true;
    }
  }
  return result;
}

}  // namespace gz::launcher
