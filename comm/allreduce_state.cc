// AllreduceState save/restore and the workspace's size arithmetic.
//
// Saved format (little-endian):
//   u32 magic "GZEF" | u32 version 1 | u32 spec_bytes | spec | u64 n |
//   u32 rank | u32 world | u8 algorithm | u64 worker_count | u64 server_count |
//   worker_count x f32 | server_count x f32
#include <atomic>
#include <cstring>

#include "comm/allreduce.h"
#include "common/error.h"
#include "common/workspace.h"

namespace gz {
namespace {

constexpr std::uint32_t kStateMagic = 0x46455A47u;  // "GZEF"
constexpr std::uint32_t kStateVersion = 1;
constexpr std::size_t kMaxSpec = 256;

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

class In {
 public:
  explicit In(std::string_view s) : s_(s) {}
  template <class T>
  T get(const char* what) {
    T v{};
    need(sizeof v, what);
    std::memcpy(&v, s_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string_view bytes(std::size_t n, const char* what) {
    need(n, what);
    const auto v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::size_t left() const { return s_.size() - pos_; }

 private:
  void need(std::size_t n, const char* what) {
    if (n > s_.size() - pos_)
      GZ_THROW(InvalidArgument, "saved allreduce state is truncated (reading ", what, " at byte ", pos_, " of ",
               s_.size(), ")");
  }
  std::string_view s_;
  std::size_t pos_ = 0;
};

std::string describe(const AllreduceState::Layout& l) {
  return "codec=" + l.codec + " n=" + std::to_string(l.n) + " rank=" + std::to_string(l.rank) + "/" +
         std::to_string(l.world) + " algorithm=" + to_string(l.algorithm);
}

std::atomic<std::uint64_t> next_workspace_id{1};

}  // namespace

std::string AllreduceState::save() const {
  GZ_ENFORCE(layout_.has_value(), "this allreduce state was never used or restored; nothing to save");
  const Layout& l = *layout_;
  std::string s;
  put(s, kStateMagic);
  put(s, kStateVersion);
  put(s, static_cast<std::uint32_t>(l.codec.size()));
  s += l.codec;
  put(s, l.n);
  put(s, l.rank);
  put(s, l.world);
  put(s, static_cast<std::uint8_t>(l.algorithm));
  put(s, l.worker_count);
  put(s, l.server_count);
  const std::size_t head = s.size();
  s.resize(head + 4 * (l.worker_count + l.server_count));
  char* w = s.data() + head;
  char* v = w + 4 * l.worker_count;
  if (pending_) {
    std::memcpy(w, pending_worker_.data(), 4 * l.worker_count);
    std::memcpy(v, pending_server_.data(), 4 * l.server_count);
  } else {
    mem::to_host(w, worker_.data(), 4 * l.worker_count, device_, nullptr);
    mem::to_host(v, server_.data(), 4 * l.server_count, device_, nullptr);
  }
  return s;
}

void AllreduceState::restore(std::string_view bytes) {
  In in(bytes);
  if (in.get<std::uint32_t>("magic") != kStateMagic)
    GZ_THROW(InvalidArgument, "not a saved allreduce state (bad magic)");
  const auto version = in.get<std::uint32_t>("version");
  if (version != kStateVersion)
    GZ_THROW(InvalidArgument, "saved allreduce state has version ", version, "; this build reads ", kStateVersion);
  Layout l;
  const auto spec_bytes = in.get<std::uint32_t>("spec length");
  if (spec_bytes > kMaxSpec) GZ_THROW(InvalidArgument, "saved allreduce state: codec spec too long");
  l.codec = std::string(in.bytes(spec_bytes, "codec spec"));
  const CodecConfig cfg = parse_spec(l.codec);  // throws InvalidArgument for an unknown codec
  l.n = in.get<std::uint64_t>("n");
  l.rank = in.get<std::uint32_t>("rank");
  l.world = in.get<std::uint32_t>("world size");
  const auto algo = in.get<std::uint8_t>("algorithm");
  if (algo != static_cast<std::uint8_t>(Algorithm::Allgather) && algo != static_cast<std::uint8_t>(Algorithm::ScatterReduce))
    GZ_THROW(InvalidArgument, "saved allreduce state: unknown algorithm ", int{algo});
  l.algorithm = static_cast<Algorithm>(algo);
  l.worker_count = in.get<std::uint64_t>("worker count");
  l.server_count = in.get<std::uint64_t>("server count");
  if (l.world == 0 || l.rank >= l.world) GZ_THROW(InvalidArgument, "saved allreduce state: bad rank/world");
  const std::uint64_t want_worker = cfg.ef ? l.n : 0;
  const std::uint64_t want_server =
      cfg.ef && l.algorithm == Algorithm::ScatterReduce ? chunk_range(l.n, static_cast<int>(l.world), static_cast<int>(l.rank)).count : 0;
  if (l.worker_count != want_worker || l.server_count != want_server)
    GZ_THROW(InvalidArgument, "saved allreduce state: residual sizes do not match its layout");
  if (in.left() != 4 * (l.worker_count + l.server_count))
    GZ_THROW(InvalidArgument, "saved allreduce state has ", in.left(), " bytes of residuals, expected ",
             4 * (l.worker_count + l.server_count));
  if (layout_ && !(*layout_ == l))
    GZ_THROW(InvalidArgument, "cannot restore a state saved for ", describe(l), " into one bound to ",
             describe(*layout_));
  pending_worker_.resize(l.worker_count);
  pending_server_.resize(l.server_count);
  std::memcpy(pending_worker_.data(), in.bytes(4 * l.worker_count, "worker residual").data(), 4 * l.worker_count);
  std::memcpy(pending_server_.data(), in.bytes(4 * l.server_count, "server residual").data(), 4 * l.server_count);
  pending_ = true;
  layout_ = std::move(l);
  agreed_.reset();  // a restore is a new start: agree again
}

void AllreduceState::reset() {
  layout_.reset();
  worker_.release();
  server_.release();
  pending_worker_.clear();
  pending_server_.clear();
  pending_ = false;
  agreed_.reset();
}

AllreduceWorkspace::AllreduceWorkspace() : id_(next_workspace_id++) {}

std::size_t AllreduceWorkspace::comm_bytes_for(const Codec& codec, std::size_t n, int ranks, int rank,
                                               Algorithm algorithm) {
  const auto P = static_cast<std::size_t>(ranks);
  algorithm = resolve_algorithm(algorithm, codec.config(), ranks);
  if (algorithm == Algorithm::Allgather) return P * align_up(codec.max_payload_bytes(n), kWorkspaceAlign);
  std::size_t bytes = 0;
  for (int j = 0; j < ranks; ++j) bytes += align_up(codec.max_payload_bytes(chunk_range(n, ranks, j).count), kWorkspaceAlign);
  const std::size_t mine = chunk_range(n, ranks, rank).count;
  bytes += P * align_up(codec.max_payload_bytes(mine), kWorkspaceAlign);
  bytes += align_up(4 * mine, kWorkspaceAlign);
  return bytes;
}

}  // namespace gz
