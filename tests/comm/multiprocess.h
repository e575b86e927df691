// Runs a test body as P real processes (fork), each with the torchrun
// environment of one rank on 127.0.0.1, and collects what each printed, how
// it ended and when. The parent never touches UCX, so each child starts clean,
// and it forks only while it has one thread (a thread's lock would stay held
// in the child: run_jobs refuses).
//
// A body returns its exit code; exceptions map to codes (see RankExit), so a
// test can assert how each rank failed. Every run is bounded: ranks still
// alive at the limit are killed and reported as such.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace gz::test {

enum RankExit : int {
  kOk = 0,
  kCheckFailed = 1,
  kIoError = 10,
  kInvalidArgument = 11,
  kOtherError = 12,
};

struct RankOutcome {
  int rank = 0;
  int exit_code = -1;   ///< -1 when killed by a signal
  int signal = 0;       ///< the signal that ended it, or 0
  bool timed_out = false;
  double seconds = 0;   ///< from the start of the run to the rank's exit
  std::string output;   ///< stdout and stderr together
};

struct MpOptions {
  std::chrono::milliseconds limit{60000};  ///< kill everything after this
  std::map<std::string, std::string> env;  ///< extra variables for every rank (GRADZIP_JOB_TOKEN: a new
                                           ///< random one per job unless given here, as gradzip-run does)
  int port = 0;                            ///< MASTER_PORT (0: a free one)
};

/// Forks P ranks running body(rank); waits for all (bounded); returns outcomes.
std::vector<RankOutcome> run_ranks(int P, const std::function<int(int)>& body, const MpOptions& options = {});

/// One job of run_jobs.
struct MpJob {
  int ranks = 1;
  std::function<int(int)> body;
  MpOptions options;
};

/// Several jobs at once (e.g. two on one MASTER_PORT); each its own token.
/// The time limit is the first job's. Returns each job's outcomes.
std::vector<std::vector<RankOutcome>> run_jobs(const std::vector<MpJob>& jobs);

/// A free TCP port on 127.0.0.1.
int free_port();

/// A readable report of every rank (for failure messages).
std::string describe(const std::vector<RankOutcome>& outcomes);

/// Lines of a rank's output that start with `tag` (the tag removed).
std::vector<std::string> tagged_lines(const RankOutcome& o, const std::string& tag);

}  // namespace gz::test

/// Inside a rank body: print the failed condition and return kCheckFailed.
#define MP_CHECK(cond)                                                                        \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "CHECK FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);            \
      return ::gz::test::kCheckFailed;                                                        \
    }                                                                                         \
  } while (0)
