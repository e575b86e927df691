// ErrorFeedback (error_feedback.h): the residual sizes of a layout, and
// save/restore.
//
// Saved format (little-endian):
//   u32 magic "GZEF" | u32 version 2 | u32 spec_bytes | spec | u64 n |
//   u32 rank | u32 world | u8 algorithm | u64 worker_count | u64 server_count |
//   worker_count x f32 | server_count x f32 | u64 checksum64 of everything before
//
// restore() trusts none of it: the checksum first (a damaged file), then
// every field against its limit before any size arithmetic, then the
// residuals, which must be finite (one NaN would spread to every rank's
// result on the next call) and at most kMaxResidual in magnitude.
#include "comm/engine/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "comm/algorithms/algorithm.h"
#include "common/bytes.h"
#include "common/checksum.h"
#include "common/error.h"
#include "common/workspace.h"
#include "compressors/wire_format.h"

namespace gz {
namespace {

constexpr std::uint32_t kStateMagic = 0x46455A47u;  // "GZEF"
constexpr std::uint32_t kStateVersion = 2;
constexpr std::size_t kMaxSpec = 256;
constexpr std::uint32_t kMaxWorld = 1u << 24;
constexpr std::size_t kChecksumBytes = 8;
// The largest residual a saved state may hold: 2^64 (1.8e19). A residual
// joins the next step's value, which the allreduce sums over a codec's block
// (up to 2^16 elements: its scale) and over the ranks (up to 2^24):
// 2^64 * 2^16 * 2^24 = 2^104 stays below float's 2^128, so the first step
// cannot overflow to inf on every rank, as 3e38 did (issue 32, item 3). No
// real gradient residual comes near it.
constexpr float kMaxResidual = 18446744073709551616.0f;  // 2^64

[[noreturn]] void malformed(const std::string& why) { GZ_THROW(InvalidArgument, "saved error feedback state: ", why); }

// A truncated field throws, naming it.
template <class T>
T read(bytes::Reader& in, const char* what) {
  const T v = in.get<T>(what);
  if (!in.ok()) malformed("truncated: " + in.failure());
  return v;
}

// Spec bytes come from a file: printable ASCII only, so that no message
// (here or in Python) ever carries raw bytes.
std::string read_spec(bytes::Reader& in) {
  const std::string_view spec = in.str(kMaxSpec, "codec spec");
  if (!in.ok()) malformed("truncated: " + in.failure());
  for (const char c : spec)
    if (c < 0x20 || c > 0x7e) malformed("the codec spec is not printable ASCII");
  return std::string(spec);
}

// A residual's value for a message: 3e+38, not 39 digits.
std::string value(float x) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", static_cast<double>(x));
  return s;
}

// Residuals, checked finite and at most kMaxResidual in magnitude.
void read_residual(bytes::Reader& in, std::vector<float>& out, std::uint64_t count, const char* what) {
  const std::string_view raw = in.raw(4 * count, what);
  if (!in.ok()) malformed("truncated: " + in.failure());
  out.resize(count);
  if (count) std::memcpy(out.data(), raw.data(), raw.size());
  for (std::uint64_t i = 0; i < count; ++i) {
    if (!std::isfinite(out[i]))
      malformed(std::string(what) + " element " + std::to_string(i) + " is " + value(out[i]) + ", not finite");
    if (std::fabs(out[i]) > kMaxResidual)
      malformed(std::string(what) + " element " + std::to_string(i) + " is " + value(out[i]) +
                ", over the limit of 2^64 = " + value(kMaxResidual) +
                " in magnitude (the next step could overflow; no real residual comes near it)");
  }
}

std::string describe(const ErrorFeedback::Layout& l) {
  return "codec=" + l.codec + " n=" + std::to_string(l.n) + " rank=" + std::to_string(l.rank) + "/" +
         std::to_string(l.world) + " algorithm=" + to_string(l.algorithm);
}

}  // namespace

std::pair<std::uint64_t, std::uint64_t> ErrorFeedback::residual_counts(const CodecConfig& codec, std::uint64_t n,
                                                                       int rank, int world, Algorithm algorithm,
                                                                       const Topology* topology) {
  if (!codec.ef) return {0, 0};
  // The algorithm's own layout (comm/algorithms/<algorithm>.cc).
  const AlgorithmDescriptor& d = algorithm_descriptor(algorithm);
  GZ_ENFORCE(topology != nullptr || !d.follows_nodes, "the ", d.name, " allreduce needs the topology");
  const Topology flat = topology ? Topology{} : Topology::flat(world);
  return d.residual_counts(codec, n, rank, topology ? *topology : flat);
}

std::string ErrorFeedback::save() const {
  GZ_ENFORCE(layout_.has_value(), "this error feedback state was never used or restored; nothing to save");
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
  if (pending_) {  // (memcpy from an empty vector's null data() is undefined even for 0 bytes)
    if (l.worker_count) std::memcpy(worker, pending_worker_.data(), 4 * l.worker_count);
    if (l.server_count) std::memcpy(server, pending_server_.data(), 4 * l.server_count);
  } else {
    mem::to_host(worker, worker_.data(), 4 * l.worker_count, device_, nullptr);
    mem::to_host(server, server_.data(), 4 * l.server_count, device_, nullptr);
  }
  w.put(checksum64(s));
  return s;
}

void ErrorFeedback::restore(std::string_view saved) {
  bytes::Reader head(saved);
  if (read<std::uint32_t>(head, "magic") != kStateMagic) malformed("not a saved error feedback state (bad magic)");
  const auto version = read<std::uint32_t>(head, "version");
  // Version 1 (AllreduceState's, before the checksum) is the same layout
  // without the checksum: every field is still checked against its limits
  // and the residuals for finiteness; only damage that keeps them valid
  // goes unnoticed.
  const bool v1 = version == 1;
  if (version != kStateVersion && !v1)
    malformed("version " + std::to_string(version) + "; this build reads versions 1 and " +
              std::to_string(kStateVersion));
  std::string_view body = saved;
  if (!v1) {
    if (saved.size() < head.pos() + kChecksumBytes) malformed("truncated: no checksum");
    body = saved.substr(0, saved.size() - kChecksumBytes);
    bytes::Reader tail(saved.substr(body.size()));
    if (tail.get<std::uint64_t>() != checksum64(body)) malformed("checksum mismatch (the bytes were damaged)");
  }

  bytes::Reader in(body);
  in.raw(head.pos());
  Layout l;
  l.codec = read_spec(in);
  const CodecConfig cfg = parse_spec(l.codec);  // throws InvalidArgument for an unknown codec
  l.n = read<std::uint64_t>(in, "n");
  l.rank = read<std::uint32_t>(in, "rank");
  l.world = read<std::uint32_t>(in, "world size");
  const auto algo = read<std::uint8_t>(in, "algorithm");
  // Any registered algorithm (comm/algorithms/registry.h) whose state this
  // format version can hold (Auto, 0, never is one).
  const AlgorithmDescriptor* d = algo == 0 ? nullptr : find_algorithm(static_cast<Algorithm>(algo));
  if (!d || (v1 && d->state_version > 1))
    malformed("unknown algorithm " + std::to_string(int{algo}) + (v1 ? " for version 1" : ""));
  l.algorithm = d->id;
  l.worker_count = read<std::uint64_t>(in, "worker count");
  l.server_count = read<std::uint64_t>(in, "server count");
  // Limits before arithmetic: n = 2^62 must not wrap 4 * n.
  if (l.n > wire::kMaxCount) malformed("n = " + std::to_string(l.n) + " is over the format's limit");
  if (l.world == 0 || l.world > kMaxWorld || l.rank >= l.world)
    malformed("rank " + std::to_string(l.rank) + " of world size " + std::to_string(l.world) + " is not valid");
  // Residuals of an algorithm that follows the nodes (hierarchical) depend
  // on the topology, which the saved state does not hold: at most a flat
  // buffer's worker residual (n), a server residual within it; the first
  // call checks them against its layout.
  const bool nodes = d->follows_nodes;
  const auto [want_worker, want_server] =
      nodes ? std::pair<std::uint64_t, std::uint64_t>{cfg.ef ? l.n : 0, 0}
            : residual_counts(cfg, l.n, static_cast<int>(l.rank), static_cast<int>(l.world), l.algorithm, nullptr);
  if (nodes ? l.worker_count > want_worker || l.server_count > l.worker_count
            : l.worker_count != want_worker || l.server_count != want_server)
    malformed("residual sizes do not match its layout");
  if (in.left() != 4 * (l.worker_count + l.server_count))
    malformed("it has " + std::to_string(in.left()) + " bytes of residuals, expected " +
              std::to_string(4 * (l.worker_count + l.server_count)));
  if (layout_ && !(*layout_ == l))
    GZ_THROW(InvalidArgument, "cannot restore a state saved for ", describe(l), " into one bound to ",
             describe(*layout_));
  std::vector<float> worker, server;
  read_residual(in, worker, l.worker_count, "worker residual");
  read_residual(in, server, l.server_count, "server residual");
  pending_worker_ = std::move(worker);
  pending_server_ = std::move(server);
  pending_ = true;
  regrouped_ = false;
  layout_ = std::move(l);
  agreed_.reset();  // a restore is a new start: agree again
}

std::pair<std::vector<float>, std::vector<float>> ErrorFeedback::residuals() const {
  GZ_ENFORCE(layout_.has_value(), "this error feedback state was never used or restored; it holds no residual");
  if (pending_) return {pending_worker_, pending_server_};
  std::vector<float> worker(layout_->worker_count), server(layout_->server_count);
  if (!worker.empty()) mem::to_host(worker.data(), worker_.data(), 4 * worker.size(), device_, nullptr);
  if (!server.empty()) mem::to_host(server.data(), server_.data(), 4 * server.size(), device_, nullptr);
  return {std::move(worker), std::move(server)};
}

void ErrorFeedback::respec(std::string_view spec) {
  GZ_ENFORCE(layout_.has_value(), "this error feedback state was never used or restored; nothing to respec");
  Layout l = *layout_;
  GZ_ENFORCE(!algorithm_descriptor(l.algorithm).follows_nodes, "a ", to_string(l.algorithm),
             " error feedback state cannot change its codec (its residuals depend on the nodes)");
  const CodecConfig cfg = parse_spec(spec);  // throws InvalidArgument for an unknown codec
  const auto [worker, server] = residual_counts(cfg, l.n, static_cast<int>(l.rank), static_cast<int>(l.world),
                                                l.algorithm, nullptr);
  l.codec = cfg.canonical();
  if (worker != l.worker_count || server != l.server_count)
    GZ_THROW(InvalidArgument, "cannot respec the error feedback of ", describe(*layout_), " to ", l.codec,
             ": its residuals would have ", worker, " + ", server, " floats, not ", l.worker_count, " + ",
             l.server_count);
  // One NaN would reach every rank's result through the next payload.
  const auto [w, s] = residuals();
  for (const std::vector<float>* r : {&w, &s})
    for (const float x : *r)
      if (!std::isfinite(x))
        GZ_THROW(InvalidArgument, "the error feedback's residual holds NaN or infinite values at a change of its "
                 "codec to ", l.codec, ": the training diverged before it");
  layout_ = std::move(l);
  agreed_.reset();  // the next call agrees on the new codec
}

void ErrorFeedback::regroup() {
  if (!layout_) return;
  auto [worker, server] = residuals();  // host copies (pending ones as they are)
  std::fill(server.begin(), server.end(), 0.0f);
  pending_worker_ = std::move(worker);
  pending_server_ = std::move(server);
  pending_ = true;
  regrouped_ = true;
  worker_.release();
  server_.release();
  agreed_.reset();  // another group: agree again
}

void ErrorFeedback::zero() {
  if (!layout_) return;
  if (pending_) {
    std::fill(pending_worker_.begin(), pending_worker_.end(), 0.0f);
    std::fill(pending_server_.begin(), pending_server_.end(), 0.0f);
    return;
  }
  mem::zero(worker_.data(), 4 * layout_->worker_count, device_, nullptr);
  mem::zero(server_.data(), 4 * layout_->server_count, device_, nullptr);
  mem::synchronize(device_, nullptr);
}

void ErrorFeedback::reset() {
  regrouped_ = false;
  layout_.reset();
  worker_.release();
  server_.release();
  pending_worker_.clear();
  pending_server_.clear();
  pending_ = false;
  agreed_.reset();
}

}  // namespace gz
