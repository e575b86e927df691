// gradzip-run: environment, prefixed output, and stopping the job when a rank fails.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

struct RunResult {
  int code = -1;
  std::string output;
  double seconds = 0;
};

RunResult run(const std::string& args) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string cmd = std::string(GZ_RUN_PATH) + " " + args + " 2>&1";
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

TEST(Launcher, GivesEachRankTheTorchrunEnvironmentAndPrefixesLines) {
  const RunResult r = run("-n 3 -- sh -c 'echo \"env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR\"; "
                    "printf partial'");
  EXPECT_EQ(r.code, 0) << r.output;
  for (int k = 0; k < 3; ++k) {
    const std::string p = "[" + std::to_string(k) + "] ";
    EXPECT_NE(r.output.find(p + "env " + std::to_string(k) + " 3 " + std::to_string(k) + " 3 127.0.0.1\n"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(p + "partial\n"), std::string::npos) << "unterminated last line: " << r.output;
  }
}

TEST(Launcher, AFailingRankStopsTheOthersAndSetsTheExitCode) {
  const RunResult r = run("-n 3 -- sh -c 'if [ $RANK = 1 ]; then exit 7; fi; exec sleep 30'");
  EXPECT_EQ(r.code, 7) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_NE(r.output.find("rank 1 exited with code 7"), std::string::npos) << r.output;
}

TEST(Launcher, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  const RunResult r = run("-n 2 --grace 0.5 -- sh -c 'if [ $RANK = 0 ]; then sleep 0.5; exit 1; fi; trap \"\" TERM; sleep 30'");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_NE(r.output.find("SIGKILL"), std::string::npos) << r.output;
}

TEST(Launcher, RejectsBadUsage) {
  EXPECT_EQ(run("").code, 2);
  EXPECT_EQ(run("-n 2").code, 2);
  EXPECT_EQ(run("-n x -- true").code, 2);
  EXPECT_NE(run("-n 1 -- /nonexistent/program").code, 0);
  // --ranks-per-node shapes --link, and must divide -n (refused before any setup).
  const RunResult alone = run("-n 4 --ranks-per-node 2 -- true");
  EXPECT_EQ(alone.code, 2);
  EXPECT_NE(alone.output.find("give --link too"), std::string::npos) << alone.output;
  const RunResult uneven = run("-n 3 --link 1gbit --ranks-per-node 2 -- true");
  EXPECT_EQ(uneven.code, 2);
  EXPECT_NE(uneven.output.find("not a multiple of --ranks-per-node 2"), std::string::npos) << uneven.output;
  EXPECT_EQ(run("-n 2 --link 1gbit --ranks-per-node 0 -- true").code, 2);
}

}  // namespace
