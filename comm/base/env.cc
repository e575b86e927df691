#include "comm/base/env.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "common/error.h"

namespace gz {

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

namespace {

std::optional<std::string> env(const char* name) { return env_value(name); }

int parse_int(const char* name, const std::string& s, int lo, int hi) {
  int v = 0;
  const auto* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || p != end || v < lo || v > hi)
    GZ_THROW(InvalidArgument, "environment variable ", name, "='", s, "' is not an integer in [", lo, ", ", hi, "]");
  return v;
}

// The first of `names` that is set, parsed; nullopt when none is.
std::optional<int> first_int(std::initializer_list<const char*> names, int lo, int hi) {
  for (const char* n : names)
    if (auto v = env(n)) return parse_int(n, *v, lo, hi);
  return std::nullopt;
}

constexpr int kMaxRanks = 1 << 20;

}  // namespace

Timeout default_timeout() {
  const auto v = env("GRADZIP_TIMEOUT_S");
  if (!v) return std::chrono::seconds(60);
  char* end = nullptr;
  const double s = std::strtod(v->c_str(), &end);
  if (end != v->c_str() + v->size() || !std::isfinite(s) || s <= 0 || s > 1e6)
    GZ_THROW(InvalidArgument, "GRADZIP_TIMEOUT_S='", *v, "' must be a positive number of seconds");
  return Timeout(static_cast<Timeout::rep>(std::ceil(s * 1000.0)));
}

RankInfo rank_info_from_env() {
  RankInfo info;
  const auto rank = first_int({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, 0, kMaxRanks - 1);
  const auto size = first_int({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, 1, kMaxRanks);
  if (!rank || !size)
    GZ_THROW(InvalidArgument, "rank and world size are not set: set RANK and WORLD_SIZE (torchrun, gradzip-run), "
                              "or run under mpirun (OMPI_COMM_WORLD_RANK/SIZE) or srun (SLURM_PROCID/NTASKS)");
  info.rank = *rank;
  info.world_size = *size;
  if (info.rank >= info.world_size)
    GZ_THROW(InvalidArgument, "rank ", info.rank, " is not below the world size ", info.world_size);
  info.local_rank =
      first_int({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, 0, kMaxRanks - 1).value_or(info.rank);
  info.local_world_size =
      first_int({"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}, 1, kMaxRanks)
          .value_or(info.world_size);
  if (auto addr = env("MASTER_ADDR")) info.master_addr = *addr;
  const auto port = first_int({"MASTER_PORT"}, 1, 65535);
  if (!port)
    GZ_THROW(InvalidArgument, "MASTER_PORT is not set: the rendezvous store needs MASTER_ADDR and MASTER_PORT "
                              "(gradzip-run and torchrun set both)");
  info.master_port = *port;
  return info;
}

}  // namespace gz
