#include "tests/comm/multiprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>

#include "comm/store/socket.h"
#include "common/error.h"

namespace gz::test {
namespace {

using Clock = std::chrono::steady_clock;

int free_port() {
  net::Fd l = net::listen_tcp("127.0.0.1", 0);
  return net::bound_port(l.get());
}

[[noreturn]] void child(int rank, int P, int port, int out_fd, const MpOptions& o, const std::function<int(int)>& body) {
  ::dup2(out_fd, 1);
  ::dup2(out_fd, 2);
  ::close(out_fd);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(P).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(P).c_str(), 1);
  for (const auto& [k, v] : o.env) setenv(k.c_str(), v.c_str(), 1);
  int code = kOtherError;
  try {
    code = body(rank);
  } catch (const IoError& e) {
    std::fprintf(stderr, "IoError: %s\n", e.what());
    code = kIoError;
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "InvalidArgument: %s\n", e.what());
    code = kInvalidArgument;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    code = kOtherError;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

}  // namespace

std::vector<RankOutcome> run_ranks(int P, const std::function<int(int)>& body, const MpOptions& o) {
  const int port = free_port();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<RankOutcome> out(static_cast<std::size_t>(P));
  std::vector<pid_t> pids(static_cast<std::size_t>(P), -1);
  std::vector<int> fds(static_cast<std::size_t>(P), -1);
  const auto start = Clock::now();
  for (int r = 0; r < P; ++r) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) GZ_THROW(IoError, "pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      child(r, P, port, p[1], o, body);
    }
    ::close(p[1]);
    pids[static_cast<std::size_t>(r)] = pid;
    fds[static_cast<std::size_t>(r)] = p[0];
    out[static_cast<std::size_t>(r)].rank = r;
  }
  const auto deadline = start + o.limit;
  int alive = P;
  while (alive > 0) {
    std::vector<pollfd> pf;
    for (int fd : fds)
      if (fd >= 0) pf.push_back({fd, POLLIN, 0});
    if (!pf.empty()) ::poll(pf.data(), pf.size(), 20);
    else ::usleep(20000);
    for (int r = 0; r < P; ++r) {
      int& fd = fds[static_cast<std::size_t>(r)];
      if (fd < 0) continue;
      pollfd one{fd, POLLIN, 0};
      while (::poll(&one, 1, 0) > 0) {
        char buf[4096];
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) {
          ::close(fd);
          fd = -1;
          break;
        }
        out[static_cast<std::size_t>(r)].output.append(buf, static_cast<std::size_t>(n));
      }
    }
    for (int r = 0; r < P; ++r) {
      pid_t& pid = pids[static_cast<std::size_t>(r)];
      if (pid < 0) continue;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) != pid) continue;
      auto& oc = out[static_cast<std::size_t>(r)];
      oc.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (WIFEXITED(status)) oc.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) oc.signal = WTERMSIG(status);
      pid = -1;
      --alive;
    }
    if (Clock::now() > deadline) {
      for (int r = 0; r < P; ++r) {
        if (pids[static_cast<std::size_t>(r)] < 0) continue;
        ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
        ::waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
        out[static_cast<std::size_t>(r)].timed_out = true;
        out[static_cast<std::size_t>(r)].signal = SIGKILL;
        pids[static_cast<std::size_t>(r)] = -1;
      }
      alive = 0;
    }
  }
  // What the ranks wrote just before exiting may still sit in the pipes.
  for (int r = 0; r < P; ++r) {
    int& fd = fds[static_cast<std::size_t>(r)];
    if (fd < 0) continue;
    pollfd one{fd, POLLIN, 0};
    while (::poll(&one, 1, 1000) > 0) {
      char buf[4096];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      out[static_cast<std::size_t>(r)].output.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    fd = -1;
  }
  return out;
}

std::string describe(const std::vector<RankOutcome>& outcomes) {
  std::ostringstream os;
  for (const auto& o : outcomes) {
    os << "--- rank " << o.rank << ": ";
    if (o.timed_out) os << "KILLED at the test's time limit";
    else if (o.signal) os << "killed by signal " << o.signal;
    else os << "exit " << o.exit_code;
    os << " after " << o.seconds << " s\n" << o.output;
    if (!o.output.empty() && o.output.back() != '\n') os << "\n";
  }
  return os.str();
}

std::vector<std::string> tagged_lines(const RankOutcome& o, const std::string& tag) {
  std::vector<std::string> lines;
  std::istringstream is(o.output);
  for (std::string line; std::getline(is, line);)
    if (line.rfind(tag, 0) == 0) lines.push_back(line.substr(tag.size()));
  return lines;
}

}  // namespace gz::test
