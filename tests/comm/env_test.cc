// Rank discovery from torchrun / Open MPI / Slurm variables, and the timeout.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/base/env.h"
#include "common/error.h"
#include "tests/comm/env_guard.h"

namespace gz {
namespace {

class EnvTest : public ::testing::Test {
 protected:
  test::EnvGuard env_{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK",
                      "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                      "OMPI_COMM_WORLD_LOCAL_SIZE", "GRADZIP_TIMEOUT_S"};
};

TEST_F(EnvTest, TorchrunVariables) {
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  const RankInfo i = rank_info_from_env();
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.master_port, 29500);
}

TEST_F(EnvTest, MpiAndSlurmFallbacks) {
  setenv("MASTER_PORT", "1234", 1);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_EQ(rank_info_from_env().rank, 1);
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  const RankInfo i = rank_info_from_env();
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.world_size, 8);
  EXPECT_EQ(i.master_addr, "127.0.0.1");
}

TEST_F(EnvTest, MissingOrMalformedVariablesAreNamed) {
  try {
    rank_info_from_env();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK"), std::string::npos);
  }
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  try {
    rank_info_from_env();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT"), std::string::npos);
  }
  setenv("MASTER_PORT", "99999", 1);
  EXPECT_THROW(rank_info_from_env(), InvalidArgument);
  setenv("MASTER_PORT", "100", 1);
  setenv("RANK", "2", 1);
  EXPECT_THROW(rank_info_from_env(), InvalidArgument);  // rank >= world size
}

TEST_F(EnvTest, TimeoutFromEnvironment) {
  EXPECT_EQ(default_timeout(), Timeout(60000));
  setenv("GRADZIP_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(default_timeout(), Timeout(2500));
  setenv("GRADZIP_TIMEOUT_S", "-1", 1);
  EXPECT_THROW(default_timeout(), InvalidArgument);
  setenv("GRADZIP_TIMEOUT_S", "abc", 1);
  EXPECT_THROW(default_timeout(), InvalidArgument);
}

}  // namespace
}  // namespace gz
