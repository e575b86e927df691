// The launcher's reaper: a small process forked before the ranks that
// outlives the launcher only to clean up after it. The launcher tells it,
// through a pipe, the process group of every rank it starts and reaps; if the
// pipe closes without the launcher's "done" (the launcher was killed, SIGKILL
// included), the reaper kills every group still listed, so the ranks'
// own children die too, and undoes the placement (network namespaces).
//
// Together with PR_SET_PDEATHSIG in each rank (which kills the rank itself
// the moment the launcher dies), no process of the job outlives the
// launcher.
#pragma once

#include <sys/types.h>

#include <functional>

namespace gz::launcher {

class Reaper {
 public:
  /// Forks the reaper; `cleanup` runs in it after the kill (placement teardown).
  explicit Reaper(std::function<void()> cleanup);
  /// Tells the reaper all is done (nothing to kill or undo) and closes the pipe.
  ~Reaper();
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  /// A rank's process group started / was reaped (and killed) by the launcher.
  void started(pid_t pgid) { send('+', pgid); }
  void reaped(pid_t pgid) { send('-', pgid); }

 private:
  void send(char op, pid_t pgid);
  int pipe_ = -1;
  pid_t pid_ = -1;
};

}  // namespace gz::launcher
