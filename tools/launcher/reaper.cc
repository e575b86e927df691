#include "tools/launcher/reaper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>

namespace gz::launcher {
namespace {

// The reaper's life: read records until the pipe closes, then clean up
// unless the launcher said it was done. Records are fixed-size: an op byte
// and the group id.
[[noreturn]] void reap(int fd, const std::function<void()>& cleanup) {
  // A group of its own: a signal to the launcher's process group (the
  // terminal's ^C, or kill -9 -PGID) does not reach it; it leaves when the
  // launcher does.
  ::setpgid(0, 0);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::signal(sig, SIG_IGN);
  std::set<pid_t> groups;
  bool done = false;
  char rec[1 + sizeof(pid_t)];
  std::size_t have = 0;
  for (;;) {
    const ssize_t n = ::read(fd, rec + have, sizeof rec - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<std::size_t>(n);
    if (have < sizeof rec) continue;
    have = 0;
    pid_t pgid = 0;
    std::memcpy(&pgid, rec + 1, sizeof pgid);
    if (rec[0] == '+') groups.insert(pgid);
    if (rec[0] == '-') groups.erase(pgid);
    if (rec[0] == 'd') done = true;
  }
  if (!done) {
    for (pid_t g : groups) ::kill(-g, SIGKILL);
    if (!groups.empty())
      std::fprintf(stderr, "gradzip-run: the launcher died; killed the %zu rank(s) still running\n", groups.size());
    try {
      cleanup();
    } catch (...) {
      // Nothing more can be done from here; `gradzip-run --cleanup` can.
    }
  }
  ::_exit(0);
}

}  // namespace

Reaper::Reaper(std::function<void()> cleanup) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe failed: ") + std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid_ == 0) {
    ::close(p[1]);
    reap(p[0], cleanup);
  }
  ::close(p[0]);
  pipe_ = p[1];
}

Reaper::~Reaper() {
  send('d', 0);
  ::close(pipe_);
  ::waitpid(pid_, nullptr, 0);
}

void Reaper::send(char op, pid_t pgid) {
  char rec[1 + sizeof(pid_t)];
  rec[0] = op;
  std::memcpy(rec + 1, &pgid, sizeof pgid);
  // A record is smaller than PIPE_BUF: written whole or not at all.
  while (::write(pipe_, rec, sizeof rec) < 0 && errno == EINTR) {
  }
}

}  // namespace gz::launcher
