// Where a rank learns who it is: the torchrun variables (MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), with Open MPI's
// (OMPI_COMM_WORLD_*) and Slurm's (SLURM_PROCID, SLURM_NTASKS, ...) as fallbacks
// when the torchrun ones are missing; and the default timeout of every wait.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace gz {

/// Milliseconds; every blocking call in comm/ takes one.
using Timeout = std::chrono::milliseconds;

/// The value of an environment variable; nullopt when unset or empty.
std::optional<std::string> env_value(const char* name);

/// Default timeout: GRADZIP_TIMEOUT_S (seconds, may be fractional) when set,
/// else 60 s. Throws InvalidArgument for a malformed or non-positive value.
Timeout default_timeout();

/// One rank's place in the job, as the launcher described it.
struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
};

/// Reads RankInfo from the environment. RANK/WORLD_SIZE (or the MPI/Slurm
/// fallbacks) and MASTER_PORT are required; MASTER_ADDR defaults to 127.0.0.1.
/// Throws InvalidArgument naming the missing or malformed variable.
RankInfo rank_info_from_env();

}  // namespace gz
