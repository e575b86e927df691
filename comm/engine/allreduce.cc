// allreduce(): checks, the agreement, the EF state (error_feedback.h) and the workspace, then
// the algorithm its descriptor runs (comm/algorithms/).
#include "comm/engine/allreduce.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>

#include "comm/engine/agreement.h"
#include "comm/engine/allreduce_run.h"
#include "common/error.h"
#include "common/workspace.h"
#include "compressors/payload_status.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"
#include "kernels/element.h"
#if GZ_HAVE_CUDA
#include "kernels/cuda.h"
#endif

namespace gz {

CodecConfig server_codec_config(const CodecConfig& codec) {
  const std::string_view spec = codec.descriptor().server_spec;
  if (spec.empty()) return codec;
  CodecConfig s = parse_spec(spec);
  s.ef = codec.ef && !s.descriptor().lossless;
  return s;
}

CodecConfig server_codec_config(const CodecConfig& codec, const std::optional<std::string>& given) {
  if (!given) return server_codec_config(codec);
  if (*given == "same") return codec;
  return parse_spec(*given);
}

double payload_bytes_per_element(const CodecConfig& codec) {
  // resolve_algorithm asks this on every allreduce call (for the codec and
  // its server codec): answer repeats from a few remembered configs instead
  // of making a Codec each time, so the hot path does not allocate.
  struct Known {
    CodecConfig codec;
    double bytes = 0;
  };
  constexpr std::size_t kKnown = 4;
  thread_local std::array<std::optional<Known>, kKnown> known;
  thread_local std::size_t next = 0;
  for (const auto& k : known)
    if (k && k->codec == codec) return k->bytes;
  constexpr std::size_t kRef = std::size_t{1} << 20;
  const double bytes = static_cast<double>(make_codec(codec)->max_payload_bytes(kRef) - wire::kHeaderBytes) /
                       static_cast<double>(kRef);
  known[next] = Known{codec, bytes};
  next = (next + 1) % kKnown;
  return bytes;
}

Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, const TopologyShape& shape,
                            const CodecConfig* server) {
  return resolve_algorithm(requested, codec, shape, server, nullptr);
}

Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, const TopologyShape& shape,
                            const CodecConfig* server, bool (*allowed)(const AlgorithmDescriptor&)) {
  if (requested != Algorithm::Auto) return requested;
  // Every registered allreduce that may run here (its descriptor's
  // auto_candidate): the highest auto_priority, then the fewest bytes per
  // rank (auto_bytes, with the server codec's payload: the call's, else the
  // default, the codec itself unless its descriptor names one), then
  // registry order.
  const AlgorithmDescriptor* best = nullptr;
  double best_bytes = 0;
  double c = -1, s = -1;
  for (const AlgorithmDescriptor* d : all_algorithms()) {
    if (!d->allreduce || !d->auto_candidate || !d->auto_candidate(codec, shape) || (allowed && !allowed(*d))) continue;
    if (best && d->auto_priority < best->auto_priority) continue;
    double bytes = 0;
    if (d->auto_bytes) {
      if (c < 0) {  // asked once per call, and only when a candidate weighs bytes
        c = payload_bytes_per_element(codec);
        s = payload_bytes_per_element(server ? *server : server_codec_config(codec));
      }
      bytes = d->auto_bytes(c, s, shape.ranks);
    }
    if (!best || d->auto_priority > best->auto_priority || bytes < best_bytes) {
      best = d;
      best_bytes = bytes;
    }
  }
  GZ_ENFORCE(best != nullptr, "no registered allreduce algorithm may run on ", shape.ranks, " ranks");
  return best->id;
}

Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, int ranks, const CodecConfig* server) {
  return resolve_algorithm(requested, codec, TopologyShape::flat(ranks), server);
}

Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, const Topology& topology,
                            const CodecConfig* server) {
  if (requested != Algorithm::Auto && algorithm_descriptor(requested).follows_nodes && topology.uniform_size() == 0)
    GZ_THROW(InvalidArgument, "the ", to_string(requested), " allreduce needs the same number of ranks on every node; "
             "here ", topology.describe());
  return resolve_algorithm(requested, codec, topology.shape(), server);
}

namespace detail {

// The codec's descriptor says whether its payload size varies per call.
bool payload_size_varies(const Codec& c) { return !c.fixed_size(); }

void Run::agree_and_bind() {
  const CodecConfig& cfg = codec.config();
  const std::size_t segment = o.segment_bytes ? o.segment_bytes : kDefaultSegmentBytes;
  const bool follows_nodes = algorithm_descriptor(algo).follows_nodes;
  const std::string layout_of_nodes = follows_nodes ? topo.describe() : "";
  const CodecConfig& server = server_cfg;
  const bool same = st.agreed_ && st.agreed_context_ == ws.id_ && st.agreed_->codec == cfg && st.agreed_->n == o.n &&
                    st.agreed_->algorithm == algo && st.agreed_->op == o.op && st.agreed_->dtype == o.dtype &&
                    st.agreed_->segment == segment && st.agreed_->topology == layout_of_nodes &&
                    st.agreed_->server == server && st.device_ == o.device && st.layout_ && !st.pending_;
  if (same) return;  // the hot path: agreed before, nothing changed

  // The state must fit the call before we ask the others (a local error),
  // and is bound (allocated) only once they agreed.
  ErrorFeedback::Layout layout = check_state();
  if (P > 1) {
    GZ_ENFORCE(o.store != nullptr, "allreduce over ", P, " ranks needs a Store to agree on the call");
    Fields fields = {{"codec", cfg.canonical()},
                     {"n", std::to_string(o.n)},
                     {"dtype", to_string(o.dtype)},
                     {"algorithm", to_string(algo)},
                     {"op", to_string(o.op)},
                     {"segment_bytes", std::to_string(segment)},
                     {"server_codec", server.canonical()}};
    if (follows_nodes) fields.emplace_back("topology", layout_of_nodes);
    agree(*o.store, ws.agreements_++, me, P, fields, o.timeout);
    stats.agreed = true;
  }
  bind_state(std::move(layout));
  st.agreed_ = ErrorFeedback::Agreed{cfg, o.n, algo, o.op, o.dtype, segment, layout_of_nodes, server};
  st.agreed_context_ = ws.id_;
}

ErrorFeedback::Layout Run::check_state() const {
  ErrorFeedback::Layout l;
  l.codec = codec.spec();
  l.n = o.n;
  l.rank = static_cast<std::uint32_t>(me);
  l.world = static_cast<std::uint32_t>(P);
  l.algorithm = algo;
  std::tie(l.worker_count, l.server_count) =
      ErrorFeedback::residual_counts(codec.config(), o.n, me, P, algo, &topo);
  // After regroup(): the same codec, buffer and collective at another place in another group.
  const bool moved = st.regrouped_ && st.layout_ && st.layout_->codec == l.codec && st.layout_->n == l.n &&
                     algorithm_descriptor(st.layout_->algorithm).allreduce == algorithm_descriptor(algo).allreduce;
  if (st.layout_ && !moved && !(*st.layout_ == l))
    GZ_THROW(InvalidArgument, "this error feedback state is bound to codec=", st.layout_->codec, " n=", st.layout_->n,
             " rank=", st.layout_->rank, "/", st.layout_->world, " algorithm=", to_string(st.layout_->algorithm),
             " (", st.layout_->worker_count, "+", st.layout_->server_count, " residual floats), but the call is codec=",
             l.codec, " n=", l.n, " rank=", me, "/", P, " algorithm=", to_string(algo), " (", l.worker_count, "+",
             l.server_count, "): use one state per gradient buffer, or reset() it");
  if (st.layout_ && !st.pending_ && st.device_ != o.device)
    GZ_THROW(InvalidArgument, "this error feedback state lives in ", to_string(st.device_), " memory, the buffer in ",
             to_string(o.device), " memory");
  return l;
}

void Run::bind_state(ErrorFeedback::Layout l) {
  const bool fresh = !st.layout_;
  if (fresh || st.pending_) {
    st.device_ = o.device;
    st.worker_.reset(memory_of(o.device));
    st.server_.reset(memory_of(o.device));
    st.worker_.reserve(4 * l.worker_count);
    st.server_.reserve(4 * l.server_count);
    if (st.regrouped_) {  // the worker residual carries when its size does; the server's starts from zeros
      if (st.pending_worker_.size() != l.worker_count) st.pending_worker_.assign(l.worker_count, 0.0f);
      st.pending_server_.assign(l.server_count, 0.0f);
      st.regrouped_ = false;
    }
    if (st.pending_) {
      mem::from_host(st.worker_.data(), st.pending_worker_.data(), 4 * l.worker_count, o.device, o.stream);
      mem::from_host(st.server_.data(), st.pending_server_.data(), 4 * l.server_count, o.device, o.stream);
      st.pending_worker_ = {};
      st.pending_server_ = {};
      st.pending_ = false;
    } else {
      mem::zero(st.worker_.data(), 4 * l.worker_count, o.device, o.stream);
      mem::zero(st.server_.data(), 4 * l.server_count, o.device, o.stream);
    }
    st.layout_ = std::move(l);
  }
}

std::pair<std::size_t, std::size_t> Run::layout_bytes() {
  Carve wire(nullptr, 0), local(nullptr, 0);
  float* const buffer = floats;
  floats = nullptr;  // sizing: no buffer, no residuals (the algorithm returns after carving)
  algorithm_descriptor(algo).run(*this, wire, local);
  floats = buffer;
  return {wire.bytes(), local.bytes()};
}

void Run::prepare_workspace() {
  // Payload slots live where the transport reads: host memory, the device
  // (NCCL), or pinned host memory that kernels write directly (UCX under CUDA).
  const MemoryKind slot_kind = o.device == Device::Cpu ? MemoryKind::Host
                               : device_memory        ? MemoryKind::Device
                                                      : MemoryKind::Pinned;
  if (ws.device_ != o.device || ws.slot_kind_ != slot_kind) {
    ws.device_ = o.device;
    ws.slot_kind_ = slot_kind;
    ws.slots_.reset(slot_kind);
    ws.sum_.reset(memory_of(o.device));
    ws.codec_ws_.reset(memory_of(o.device));
    ws.wide_.reset(memory_of(o.device));
    ws.status_.reset(memory_of(o.device));
  }
  if (o.dtype == Dtype::Float32) {
    floats = static_cast<float*>(o.buffer);
  } else {
    ws.wide_.reserve(o.n * sizeof(float));
    floats = o.n ? static_cast<float*>(ws.wide_.data()) : nullptr;
  }
  const auto [wire, local] = layout_bytes();
  ws.slots_.reserve(wire);
  ws.sum_.reserve(local);
  // The codec's scratch, for the longest run it encodes or decodes at once.
  const std::size_t longest = std::min<std::size_t>(o.n, seg);
  std::size_t scratch = codec.workspace_bytes(longest, o.device);
  for (const auto* made : {&ws.segment_codec_, &ws.server_codec_})  // laid out above, when a phase uses them
    if (*made) scratch = std::max(scratch, (*made)->workspace_bytes(longest, o.device));
  ws.codec_ws_.reserve(scratch);
  exec = ExecContext{o.device, o.stream, ws.codec_ws_.data(), ws.codec_ws_.capacity()};
  if (o.device == Device::Cuda) {
    // GPU decodes report a malformed payload into this word instead of each
    // synchronizing to throw; check_decodes() reads it.
    ws.status_.reserve(sizeof(PayloadStatus));
    mem::zero(ws.status_.data(), sizeof(PayloadStatus), o.device, o.stream);
    exec.status = static_cast<PayloadStatus*>(ws.status_.data());
  }
  const auto P_ = static_cast<std::size_t>(P);
  if (ws.received_.size() != 4 * P_) {
    ws.sends_.reserve(P_);
    ws.recvs_.reserve(P_);
    ws.received_.assign(4 * P_, 0);  // a row per exchange in flight (comm/algorithms/)
    ws.payloads_.reserve(P_);
    ws.inputs_.reserve(P_);
  }
}

void Run::execute() {
  Carve wire(ws.slots_.data(), ws.slots_.capacity()), local(ws.sum_.data(), ws.sum_.capacity());
  const bool wide = o.dtype != Dtype::Float32 && o.n > 0;
  if (wide) convert(/*to_float=*/true);
  algorithm_descriptor(algo).run(*this, wire, local);
  wire.check();
  local.check();
  if (wide) convert(/*to_float=*/false);  // the float result, rounded once
}

void Run::convert(bool to_float) {
  kernels::with_elements(o.dtype, o.buffer, [&](auto* b) {
#if GZ_HAVE_CUDA
    if (o.device == Device::Cuda) {
      if (to_float)
        kernels::cuda::widen(b, o.n, floats, o.stream);
      else
        kernels::cuda::narrow(floats, o.n, b, nullptr, o.stream);
      return;
    }
#endif
    if (to_float)
      kernels::cpu::widen(b, o.n, floats);
    else
      kernels::cpu::narrow(floats, o.n, b);
  });
}

}  // namespace detail

namespace {
// Names the workspace that agreed a state's call (ErrorFeedback::agreed_context_).
std::atomic<std::uint64_t> next_workspace_id{1};
}  // namespace

AllreduceWorkspace::AllreduceWorkspace() : id_(next_workspace_id++) {}
AllreduceWorkspace::~AllreduceWorkspace() = default;

double allreduce_error_bound(const CodecConfig& c) { return error_bound(c); }

std::size_t AllreduceWorkspace::comm_bytes_for(const Codec& codec, std::size_t n, int ranks, int rank,
                                               Algorithm algorithm, std::size_t segment_bytes,
                                               const Topology* topology, Device device,
                                               const std::optional<CodecConfig>& server_codec) {
  AllreduceWorkspace ws;
  ErrorFeedback st;
  AllreduceOptions o;
  o.workspace = &ws;
  o.state = &st;
  o.codec = const_cast<Codec*>(&codec);  // sizing never encodes
  o.n = n;
  o.algorithm = algorithm;
  o.device = device;
  o.segment_bytes = segment_bytes;
  o.topology = topology;
  o.server_codec = server_codec;
  detail::Run run(o, ranks, rank, /*exact_sizes=*/true, /*device_memory=*/device == Device::Cuda);
  const auto [wire, local] = run.layout_bytes();
  return align_up(wire, kWorkspaceAlign) + align_up(local, kWorkspaceAlign);
}

namespace detail {

void run_collective(const AllreduceOptions& o, const char* name) {
  GZ_ENFORCE(o.transport != nullptr, name, " needs a transport");
  GZ_ENFORCE(o.workspace != nullptr, name, " needs a workspace (one per transport)");
  GZ_ENFORCE(o.codec != nullptr, name, " needs a codec");
  GZ_ENFORCE(o.state != nullptr, name, " needs a state (one per gradient buffer)");
  GZ_ENFORCE(o.n == 0 || o.buffer != nullptr, name, " buffer is null");
  GZ_ENFORCE(o.n <= wire::kMaxCount, name, " of ", o.n, " elements is over the wire format's limit");
  GZ_ENFORCE(o.timeout.count() > 0, name, " timeout must be positive");
  GZ_ENFORCE(!o.topology || o.topology->ranks() == o.transport->size(), "the topology describes ",
             o.topology->ranks(), " ranks, the transport has ", o.transport->size());
  const auto start = Clock::now();

  Run run(o);
  run.agree_and_bind();
  run.prepare_workspace();
  run.execute();
  run.t->synchronize(run.call);  // NCCL: wait (with the timeout) for the queued work
  run.finish_stats(start);
}

}  // namespace detail

void allreduce(const AllreduceOptions& o) {
  GZ_ENFORCE(o.algorithm != Algorithm::ReduceScatter,
             "reduce_scatter is a collective of its own, not an allreduce algorithm: call reduce_scatter()");
  detail::run_collective(o, "allreduce");
}

}  // namespace gz
