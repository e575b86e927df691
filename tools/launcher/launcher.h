// gradzip-run: starts N ranks of a command with the torchrun environment and
// a GRADZIP_JOB_TOKEN of their own (random per job, unless the user set one),
// relays their output line by line with a "[rank] " prefix, and ends the job
// as one: when a rank fails, the others get SIGTERM, then SIGKILL after a
// grace period, and the launcher exits non-zero; SIGINT/SIGTERM sent to the
// launcher are forwarded to every rank. No rank outlives the launcher, even
// one killed with SIGKILL: each rank has PR_SET_PDEATHSIG, and the reaper
// (reaper.h) kills the ranks' process groups.
//
// Where ranks run is a Placement: LocalPlacement runs them as plain local
// processes on 127.0.0.1; NetnsPlacement (netns_placement.h, --link
// RATE[,DELAY]) makes a network namespace per rank, wraps each rank's command
// to enter it, and names rank 0's namespace address as MASTER_ADDR. Signals
// are caught before setup() and teardown() runs on every exit path, so an
// interrupt during setup or the run still removes what setup made.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace gz::launcher {

struct LaunchOptions {
  int ranks = 1;
  int port = 0;                               ///< MASTER_PORT; 0 picks a free one
  std::chrono::milliseconds grace{5000};      ///< SIGTERM -> SIGKILL
  std::vector<std::string> command;           ///< argv of every rank
  std::map<std::string, std::string> env;     ///< extra variables for every rank
};

/// A free TCP port on `host` (bound and released).
int free_port(const std::string& host);

/// Where and how each rank runs.
class Placement {
 public:
  virtual ~Placement() = default;
  /// Prepares the ranks' places (namespaces, links); throws std::runtime_error.
  virtual void setup(int ranks) { (void)ranks; }
  /// The address ranks use to reach rank 0's store.
  virtual std::string master_addr() const = 0;
  /// MASTER_PORT: `requested` when not 0, else a free port on master_addr().
  virtual int master_port(int requested) const { return requested ? requested : free_port(master_addr()); }
  /// Extra environment for one rank (before LaunchOptions::env, which wins).
  virtual std::map<std::string, std::string> env(int rank) const {
    (void)rank;
    return {};
  }
  /// The argv that runs `command` as `rank` (e.g. wrapped in `ip netns exec`).
  virtual std::vector<std::string> wrap(int rank, const std::vector<std::string>& command) const {
    (void)rank;
    return command;
  }
  /// Undoes setup(); called on every exit path.
  virtual void teardown() {}
};

class LocalPlacement final : public Placement {
 public:
  std::string master_addr() const override { return "127.0.0.1"; }
};

/// Runs the job; returns the launcher's exit code: 0 when every rank exited
/// 0, else the first failing rank's code (128 + signal when killed).
int launch(const LaunchOptions& options, Placement& placement);

}  // namespace gz::launcher
