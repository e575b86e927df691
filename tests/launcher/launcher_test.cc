// gradzip-run: environment, prefixed output, stopping the job when a rank
// fails, the job's token, and no orphans when the launcher is killed.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

std::vector<std::string> lines_with(const std::string& output, const std::string& tag) {
  std::vector<std::string> found;
  std::istringstream is(output);
  for (std::string line; std::getline(is, line);)
    if (const auto at = line.find(tag); at != std::string::npos) found.push_back(line.substr(at + tag.size()));
  return found;
}

// Every job gets a random token of its own, the same on all its ranks; one
// the user set wins.
TEST(Launcher, GivesEveryJobItsOwnToken) {
  const std::string cmd = "-n 3 -- sh -c 'echo \"token=$GRADZIP_JOB_TOKEN\"'";
  const RunResult a = run(cmd), b = run(cmd);
  const auto ta = lines_with(a.output, "token="), tb = lines_with(b.output, "token=");
  ASSERT_EQ(ta.size(), 3u) << a.output;
  ASSERT_EQ(tb.size(), 3u) << b.output;
  EXPECT_EQ(std::set<std::string>(ta.begin(), ta.end()).size(), 1u) << a.output;
  EXPECT_EQ(ta[0].size(), 32u);
  EXPECT_NE(ta[0], tb[0]);
  const RunResult c = run("-n 2 --env GRADZIP_JOB_TOKEN=mine-5f0c9e2a71d4b83e -- sh -c 'echo \"token=$GRADZIP_JOB_TOKEN\"'");
  EXPECT_EQ(lines_with(c.output, "token="), std::vector<std::string>(2, "mine-5f0c9e2a71d4b83e")) << c.output;
}

// A process that is gone (or a zombie nobody reaped yet).
bool gone(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), {});
  if (stat.empty()) return true;
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

// "kill -9 of gradzip-run: all 4 ranks still running 30 s later": the ranks
// and the children they started die with it, whether the launcher alone or
// its whole process group is killed.
void kill_launcher_and_count_survivors(bool whole_group) {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    ::setpgid(0, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    ::execl(GZ_RUN_PATH, GZ_RUN_PATH, "-n", "4", "--", "sh", "-c", "sleep 300 & echo \"pids $$ $!\"; wait",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  std::string output;
  std::vector<pid_t> pids;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (pids.size() < 8 && std::chrono::steady_clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    output.append(buf, static_cast<std::size_t>(n));
    pids.clear();
    for (const auto& l : lines_with(output, "pids ")) {
      std::istringstream is(l);
      pid_t rank = 0, child = 0;
      is >> rank >> child;
      pids.push_back(rank);
      pids.push_back(child);
    }
  }
  ASSERT_EQ(pids.size(), 8u) << output;
  ::kill(whole_group ? -launcher : launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  std::vector<pid_t> alive = pids;
  for (int i = 0; i < 100 && !alive.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::erase_if(alive, gone);
  }
  for (pid_t p : alive) ::kill(p, SIGKILL);  // do not leave them behind if the test failed
  EXPECT_TRUE(alive.empty()) << alive.size() << " of the job's 8 processes outlived the launcher by 10 s\n" << output;
  ::close(out[0]);
}

TEST(Launcher, KillingTheLauncherKillsEveryRankAndItsChildren) { kill_launcher_and_count_survivors(false); }
TEST(Launcher, KillingTheLaunchersGroupKillsEveryRankAndItsChildren) { kill_launcher_and_count_survivors(true); }

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

// A rank that fails while a process it started with setsid (outside its
// process group, so outside the launcher's reach) holds its output: the
// launcher ends the job at once instead of waiting for that process (it
// waited as long as the process ran: more than 40 s in the issue).
TEST(Launcher, AProcessThatLeftTheRanksGroupDoesNotHoldTheJob) {
  // Each rank waits until its stray has its own session (a SIGKILL to the
  // rank's group before that would take the stray with it).
  const RunResult r = run("-n 2 --grace 1 -- sh -c 'setsid sleep 20 & p=$!; i=0; "
                          "while [ $i -lt 300 ] && [ \"$(cut -d\" \" -f6 /proc/$p/stat 2>/dev/null)\" != $p ]; "
                          "do i=$((i+1)); sleep 0.01; done; echo \"stray=$p\"; "
                          "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 30'");
  for (const std::string& pid : lines_with(r.output, "stray=")) ::kill(std::stoi(pid), SIGKILL);
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_LT(r.seconds, 8) << r.output;
  EXPECT_NE(r.output.find("not waiting for it"), std::string::npos) << r.output;
}

// --grace takes a finite number of seconds in [0, 3600] (nan and 1e30 were
// undefined behaviour in the cast to milliseconds, negatives accepted).
TEST(Launcher, RefusesAGraceThatIsNotASpanOfSeconds) {
  for (const char* bad : {"nan", "1e30", "-1", "inf", "5s", "''"}) {
    const RunResult r = run(std::string("-n 1 --grace ") + bad + " -- true");
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("--grace must be a number of seconds"), std::string::npos) << r.output;
  }
  EXPECT_EQ(run("-n 1 --grace 0.25 -- true").code, 0);
}

// A 100 MB line is relayed in pieces: the launcher's memory stays bounded
// (a 200 MB line grew it to 258 MB).
TEST(Launcher, ALongLineDoesNotGrowTheLauncher) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execl(GZ_RUN_PATH, GZ_RUN_PATH, "-n", "1", "--", "sh", "-c",
            "head -c 100000000 /dev/zero | tr '\\0' x; echo; echo done", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  rusage ru{};
  ASSERT_EQ(::wait4(pid, &status, 0, &ru), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_LT(ru.ru_maxrss, 32 * 1024) << "KiB";  // the line is 97,656 KiB
}

// The job's token, when the user gives one (--env or the environment): an
// empty, short or guessable one is refused before any rank starts, by the
// ranks' own rule (they would refuse it anyway, later and once per rank;
// an empty --env value once ran the job without one); a drawn one runs.
TEST(Launcher, RefusesAWeakTokenBeforeAnyRankStarts) {
  const struct {
    std::string env, why;
  } weak[] = {
      {"GRADZIP_JOB_TOKEN=", "is empty"},
      {"GRADZIP_JOB_TOKEN=0123456789", "is 10 characters long"},
      {"GRADZIP_JOB_TOKEN=0123456789abcdef", "is guessable"},
      {"'GRADZIP_JOB_TOKEN=                '", "holds whitespace"},
      {"GRADZIP_JOB_TOKEN=aaaaaaaaaaaaaaaaaaaa", "has only 1 distinct characters"},
      {"GRADZIP_JOB_TOKEN=0123456701234567", "is guessable"},
  };
  for (const auto& [env, why] : weak) {
    const RunResult r = run("-n 1 --env " + env + " -- echo started");
    EXPECT_EQ(r.code, 2) << env << ": " << r.output;
    EXPECT_EQ(r.output.find("started"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--env GRADZIP_JOB_TOKEN " + why), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("at least 16 characters of random data"), std::string::npos) << r.output;
  }
  ::setenv("GRADZIP_JOB_TOKEN", "abcdefghijklmnop", 1);
  const RunResult from_env = run("-n 1 -- echo started");
  ::unsetenv("GRADZIP_JOB_TOKEN");
  EXPECT_EQ(from_env.code, 2) << from_env.output;
  EXPECT_EQ(from_env.output.find("started"), std::string::npos) << from_env.output;
  EXPECT_NE(from_env.output.find("gradzip-run: GRADZIP_JOB_TOKEN is guessable"), std::string::npos) << from_env.output;
  const RunResult drawn = run("-n 1 --env GRADZIP_JOB_TOKEN=5f0c9e2a71d4b83e6a0f92c4d17b5e38 -- echo started");
  EXPECT_EQ(drawn.code, 0) << drawn.output;
  EXPECT_NE(drawn.output.find("started"), std::string::npos) << drawn.output;
  EXPECT_EQ(drawn.output.find("GRADZIP_JOB_TOKEN"), std::string::npos) << drawn.output;
}

}  // namespace
