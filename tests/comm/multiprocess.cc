#include "tests/comm/multiprocess.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>

#include "comm/security/crypto.h"
#include "comm/store/socket.h"
#include "common/error.h"

namespace gz::test {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void child(int rank, int P, int port, const std::string& token, int out_fd, const MpOptions& o,
                        const std::function<int(int)>& body) {
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
  setenv("GRADZIP_JOB_TOKEN", token.c_str(), 1);
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

// Threads of this process (entries of /proc/self/task).
std::size_t thread_count() {
  std::size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

}  // namespace

int free_port() {
  net::Fd l = net::listen_tcp("127.0.0.1", 0);
  return net::bound_port(l.get());
}

std::vector<RankOutcome> run_ranks(int P, const std::function<int(int)>& body, const MpOptions& o) {
  return run_jobs({MpJob{P, body, o}})[0];
}

std::vector<std::vector<RankOutcome>> run_jobs(const std::vector<MpJob>& jobs) {
  // A fork copies only the calling thread: a lock another thread held at that
  // moment stays held in the child forever. UCX's memory hooks take one on
  // every mmap, so a rank forked while a helper thread allocated hung in
  // ucp_init (1 run in 6). Helpers that run beside the ranks are processes.
  if (const std::size_t threads = thread_count(); threads > 1)
    GZ_THROW(InvalidArgument, "run_jobs forks the ranks, but this process has ", threads,
             " threads: a lock held by another thread at the fork would hang a rank. Start helpers "
             "that run beside the ranks as processes (see StrayClient in mp_trust_test.cc).");
  const int shared_port = free_port();
  std::fflush(stdout);
  std::fflush(stderr);
  // Every rank of every job, flattened.
  struct Slot {
    std::size_t job;
    int rank;
  };
  std::vector<Slot> slots;
  std::vector<std::vector<RankOutcome>> out(jobs.size());
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    out[j].resize(static_cast<std::size_t>(jobs[j].ranks));
    for (int r = 0; r < jobs[j].ranks; ++r) slots.push_back({j, r});
  }
  const std::size_t N = slots.size();
  std::vector<pid_t> pids(N, -1);
  std::vector<int> fds(N, -1);
  auto outcome = [&](std::size_t i) -> RankOutcome& { return out[slots[i].job][static_cast<std::size_t>(slots[i].rank)]; };
  const auto start = Clock::now();
  std::vector<std::string> tokens(jobs.size());
  for (auto& t : tokens) t = crypto::to_hex(crypto::random_bytes(16));
  for (std::size_t i = 0; i < N; ++i) {
    const MpJob& job = jobs[slots[i].job];
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) GZ_THROW(IoError, "pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      child(slots[i].rank, job.ranks, job.options.port ? job.options.port : shared_port, tokens[slots[i].job], p[1],
            job.options, job.body);
    }
    ::close(p[1]);
    pids[i] = pid;
    fds[i] = p[0];
    outcome(i).rank = slots[i].rank;
  }
  const auto deadline = start + jobs[0].options.limit;
  std::size_t alive = N;
  while (alive > 0) {
    std::vector<pollfd> pf;
    for (int fd : fds)
      if (fd >= 0) pf.push_back({fd, POLLIN, 0});
    if (!pf.empty()) ::poll(pf.data(), pf.size(), 20);
    else ::usleep(20000);
    for (std::size_t i = 0; i < N; ++i) {
      int& fd = fds[i];
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
        outcome(i).output.append(buf, static_cast<std::size_t>(n));
      }
    }
    for (std::size_t i = 0; i < N; ++i) {
      pid_t& pid = pids[i];
      if (pid < 0) continue;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) != pid) continue;
      auto& oc = outcome(i);
      oc.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (WIFEXITED(status)) oc.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) oc.signal = WTERMSIG(status);
      pid = -1;
      --alive;
    }
    if (Clock::now() > deadline) {
      for (std::size_t i = 0; i < N; ++i) {
        if (pids[i] < 0) continue;
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], nullptr, 0);
        outcome(i).seconds = std::chrono::duration<double>(Clock::now() - start).count();
        outcome(i).timed_out = true;
        outcome(i).signal = SIGKILL;
        pids[i] = -1;
      }
      alive = 0;
    }
  }
  // What the ranks wrote just before exiting may still sit in the pipes.
  for (std::size_t i = 0; i < N; ++i) {
    int& fd = fds[i];
    if (fd < 0) continue;
    pollfd one{fd, POLLIN, 0};
    while (::poll(&one, 1, 1000) > 0) {
      char buf[4096];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      outcome(i).output.append(buf, static_cast<std::size_t>(n));
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
