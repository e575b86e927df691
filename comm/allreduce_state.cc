// AllreduceState save/restore and the workspace's size arithmetic.
//
// Saved format (little-endian):
//   u32 magic "GZEF" | u32 version 1 | u32 spec_bytes | spec | u64 n |
//   u32 rank | u32 world | u8 algorithm | u64 worker_count | u64 server_count |
//   worker_count x f32 | server_count x f32
#include <atomic>
#include <cstring>

#include "comm/allreduce.h"
#include "common/bytes.h"
#include "common/error.h"
#include "common/workspace.h"

namespace gz {
namespace {

constexpr std::uint32_t kStateMagic = 0x46455A47u;  // "GZEF"
constexpr std::uint32_t kStateVersion = 1;
constexpr std::size_t kMaxSpec = 256;

// A truncated field throws, naming it.
template <class T>
T read(bytes::Reader& in, const char* what) {
  const T v = in.get<T>(what);
  if (!in.ok()) GZ_THROW(InvalidArgument, "saved allreduce state is ", in.failure());
  return v;
}

std::string_view read_bytes(bytes::Reader& in, std::size_t n, const char* what) {
  const std::string_view v = in.raw(n, what);
  if (!in.ok()) GZ_THROW(InvalidArgument, "saved allreduce state is ", in.failure());
  return v;
}

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
  bytes::Writer w(s);
  w.put(kStateMagic);
  w.put(kStateVersion);
  w.str(l.codec);
  w.put(l.n);
  w.put(l.rank);
  w.put(l.world);
  w.put(static_cast<std::uint8_t>(l.algorithm));
  w.put(l.worker_count);
  w.put(l.server_count);
  const std::size_t head = s.size();
  s.resize(head + 4 * (l.worker_count + l.server_count));
  char* worker = s.data() + head;
  char* server = worker + 4 * l.worker_count;
  if (pending_) {
    std::memcpy(worker, pending_worker_.data(), 4 * l.worker_count);
    std::memcpy(server, pending_server_.data(), 4 * l.server_count);
  } else {
    mem::to_host(worker, worker_.data(), 4 * l.worker_count, device_, nullptr);
    mem::to_host(server, server_.data(), 4 * l.server_count, device_, nullptr);
  }
  return s;
}

void AllreduceState::restore(std::string_view saved) {
  bytes::Reader in(saved);
  if (read<std::uint32_t>(in, "magic") != kStateMagic)
    GZ_THROW(InvalidArgument, "not a saved allreduce state (bad magic)");
  const auto version = read<std::uint32_t>(in, "version");
  if (version != kStateVersion)
    GZ_THROW(InvalidArgument, "saved allreduce state has version ", version, "; this build reads ", kStateVersion);
  Layout l;
  l.codec = std::string(in.str(kMaxSpec, "codec spec"));
  if (!in.ok()) GZ_THROW(InvalidArgument, "saved allreduce state is ", in.failure());
  const CodecConfig cfg = parse_spec(l.codec);  // throws InvalidArgument for an unknown codec
  l.n = read<std::uint64_t>(in, "n");
  l.rank = read<std::uint32_t>(in, "rank");
  l.world = read<std::uint32_t>(in, "world size");
  const auto algo = read<std::uint8_t>(in, "algorithm");
  if (algo != static_cast<std::uint8_t>(Algorithm::Allgather) && algo != static_cast<std::uint8_t>(Algorithm::ScatterReduce) &&
      algo != static_cast<std::uint8_t>(Algorithm::Hierarchical))
    GZ_THROW(InvalidArgument, "saved allreduce state: unknown algorithm ", int{algo});
  l.algorithm = static_cast<Algorithm>(algo);
  l.worker_count = read<std::uint64_t>(in, "worker count");
  l.server_count = read<std::uint64_t>(in, "server count");
  if (l.world == 0 || l.rank >= l.world) GZ_THROW(InvalidArgument, "saved allreduce state: bad rank/world");
  // Hierarchical residuals depend on the nodes, which the saved state does
  // not hold: the first call checks them against its layout.
  const bool nodes = l.algorithm == Algorithm::Hierarchical;
  const auto [want_worker, want_server] = AllreduceState::residual_counts(
      cfg, l.n, static_cast<int>(l.rank), static_cast<int>(l.world), nodes ? Algorithm::Allgather : l.algorithm, nullptr);
  if (nodes ? l.worker_count > want_worker || l.server_count > l.worker_count
            : l.worker_count != want_worker || l.server_count != want_server)
    GZ_THROW(InvalidArgument, "saved allreduce state: residual sizes do not match its layout");
  if (in.left() != 4 * (l.worker_count + l.server_count))
    GZ_THROW(InvalidArgument, "saved allreduce state has ", in.left(), " bytes of residuals, expected ",
             4 * (l.worker_count + l.server_count));
  if (layout_ && !(*layout_ == l))
    GZ_THROW(InvalidArgument, "cannot restore a state saved for ", describe(l), " into one bound to ",
             describe(*layout_));
  pending_worker_.resize(l.worker_count);
  pending_server_.resize(l.server_count);
  std::memcpy(pending_worker_.data(), read_bytes(in, 4 * l.worker_count, "worker residual").data(), 4 * l.worker_count);
  std::memcpy(pending_server_.data(), read_bytes(in, 4 * l.server_count, "server residual").data(), 4 * l.server_count);
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

}  // namespace gz
