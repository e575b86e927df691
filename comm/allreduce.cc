#include "comm/allreduce.h"

#include "compressors/payload_status.h"

#include <chrono>
#include <cstring>

#include "comm/agreement.h"
#include "common/error.h"
#include "common/workspace.h"
#include "compressors/wire_format.h"

namespace gz {

const char* to_string(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "avg"; }

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Auto: return "auto";
    case Algorithm::Allgather: return "allgather";
    case Algorithm::ScatterReduce: return "scatter_reduce";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "avg" || s == "average" || s == "mean") return ReduceOp::Average;
  GZ_THROW(InvalidArgument, "unknown reduce op '", s, "'; valid: sum, avg");
}

Algorithm parse_algorithm(std::string_view s) {
  if (s == "auto") return Algorithm::Auto;
  if (s == "allgather") return Algorithm::Allgather;
  if (s == "scatter_reduce" || s == "scatter-reduce") return Algorithm::ScatterReduce;
  GZ_THROW(InvalidArgument, "unknown allreduce algorithm '", s, "'; valid: auto, allgather, scatter_reduce");
}

Algorithm resolve_algorithm(Algorithm requested, const CodecConfig& codec, int ranks) {
  if (requested != Algorithm::Auto) return requested;
  if (ranks <= 2) return Algorithm::Allgather;
  if (codec.id == CodecId::TopK && ranks <= 16) return Algorithm::Allgather;
  return Algorithm::ScatterReduce;
}

ChunkRange chunk_range(std::size_t n, int ranks, int j) {
  const auto P = static_cast<std::size_t>(ranks), J = static_cast<std::size_t>(j);
  const std::size_t base = n / P, extra = n % P;
  return {J * base + (J < extra ? J : extra), base + (J < extra ? 1 : 0)};
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Top-k with a sampled threshold is the one codec whose payload size varies.
bool payload_size_varies(const Codec& c) {
  return c.id() == CodecId::TopK && c.config().select == TopkSelect::Sample;
}

}  // namespace

// One call: the options, checked, plus what the algorithms share.
struct AllreduceRun {
  const AllreduceOptions& o;
  Transport& t;
  Codec& codec;
  AllreduceState& st;
  AllreduceWorkspace& ws;
  int P = 1, me = 0;
  Algorithm algo = Algorithm::Auto;
  CallContext call;
  ExecContext exec;
  AllreduceStats stats;
  bool exact;  // the transport reports received sizes; else send whole slots
  bool varies;

  explicit AllreduceRun(const AllreduceOptions& opt)
      : o(opt), t(*opt.transport), codec(*opt.codec), st(*opt.state), ws(*opt.workspace) {
    P = t.size();
    me = t.rank();
    algo = resolve_algorithm(o.algorithm, codec.config(), P);
    call = CallContext{o.device, o.stream, o.timeout};
    exact = t.exact_sizes();
    varies = payload_size_varies(codec);
    stats.algorithm = algo;
  }

  void agree_and_bind();
  AllreduceState::Layout check_state() const;
  void bind_state(AllreduceState::Layout layout);
  void prepare_workspace();
  void run_allgather();
  void run_scatter_reduce();

  float* worker_residual(std::size_t offset) const {
    return codec.error_feedback() ? static_cast<float*>(st.worker_.data()) + offset : nullptr;
  }
  float* server_residual() const {
    return codec.error_feedback() ? static_cast<float*>(st.server_.data()) : nullptr;
  }
  // Bytes to send of a payload of `bytes` in a slot of `capacity`.
  std::size_t send_size(std::size_t bytes, std::size_t capacity) const { return exact ? bytes : capacity; }
  // Bytes of the payload that arrived in a slot.
  std::size_t payload_size(const std::byte* slot, std::size_t received, std::size_t capacity) const {
    if (exact || !varies) return exact ? received : capacity;
    // The sender sent its whole slot: the header says how much is payload.
    std::byte head[wire::kHeaderBytes];
    mem::to_host(head, slot, sizeof head, o.device, o.stream);
    std::uint64_t body = 0;
    std::memcpy(&body, head + 24, sizeof body);
    return body <= capacity - wire::kHeaderBytes ? wire::kHeaderBytes + body : capacity;
  }
  // Phase timing: with stats on a device, wait for the phase to finish.
  // Throws PayloadError if a GPU decode of this call rejected a payload
  // (synchronizes the stream). CPU decodes throw on the spot.
  void check_decodes() {
    if (exec.status) check_payload_status(exec.status, o.stream);
  }

  // What the last decode multiplies by: 1/P for an average.
  float scale() const { return o.op == ReduceOp::Average ? 1.0f / static_cast<float>(P) : 1.0f; }

  void phase_end(double& acc, Clock::time_point& t0) {
    if (!o.stats) return;
    mem::synchronize(o.device, o.stream);
    acc += seconds_since(t0);
    t0 = Clock::now();
  }
};

void AllreduceRun::agree_and_bind() {
  const CodecConfig& cfg = codec.config();
  const bool same = st.agreed_ && st.agreed_context_ == ws.id_ && st.agreed_->codec == cfg && st.agreed_->n == o.n &&
                    st.agreed_->algorithm == algo && st.agreed_->op == o.op && st.device_ == o.device &&
                    st.layout_ && !st.pending_;
  if (same) return;  // the hot path: agreed before, nothing changed

  // The state must fit the call before we ask the others (a local error),
  // and is bound (allocated) only once they agreed.
  AllreduceState::Layout layout = check_state();
  if (P > 1) {
    GZ_ENFORCE(o.store != nullptr, "allreduce over ", P, " ranks needs a Store to agree on the call");
    const Fields fields = {{"codec", cfg.canonical()},
                           {"n", std::to_string(o.n)},
                           {"dtype", "float32"},
                           {"algorithm", to_string(algo)},
                           {"op", to_string(o.op)}};
    agree(*o.store, ws.agreements_++, me, P, fields, o.timeout);
    stats.agreed = true;
  }
  bind_state(std::move(layout));
  st.agreed_ = AllreduceState::Agreed{cfg, o.n, algo, o.op};
  st.agreed_context_ = ws.id_;
}

AllreduceState::Layout AllreduceRun::check_state() const {
  AllreduceState::Layout l;
  l.codec = codec.spec();
  l.n = o.n;
  l.rank = static_cast<std::uint32_t>(me);
  l.world = static_cast<std::uint32_t>(P);
  l.algorithm = algo;
  const bool ef = codec.error_feedback();
  l.worker_count = ef ? o.n : 0;
  l.server_count = ef && algo == Algorithm::ScatterReduce ? chunk_range(o.n, P, me).count : 0;
  if (st.layout_ && !(*st.layout_ == l))
    GZ_THROW(InvalidArgument, "this allreduce state is bound to codec=", st.layout_->codec, " n=", st.layout_->n,
             " rank=", st.layout_->rank, "/", st.layout_->world, " algorithm=", to_string(st.layout_->algorithm),
             ", but the call is codec=", l.codec, " n=", l.n, " rank=", me, "/", P, " algorithm=", to_string(algo),
             ": use one state per gradient buffer, or reset() it");
  if (st.layout_ && !st.pending_ && st.device_ != o.device)
    GZ_THROW(InvalidArgument, "this allreduce state lives in ", to_string(st.device_), " memory, the buffer in ",
             to_string(o.device), " memory");
  return l;
}

void AllreduceRun::bind_state(AllreduceState::Layout l) {
  const bool fresh = !st.layout_;
  if (fresh || st.pending_) {
    st.device_ = o.device;
    st.worker_.reset(memory_of(o.device));
    st.server_.reset(memory_of(o.device));
    st.worker_.reserve(4 * l.worker_count);
    st.server_.reserve(4 * l.server_count);
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

void AllreduceRun::prepare_workspace() {
  if (ws.device_ != o.device) {
    ws.device_ = o.device;
    ws.slots_.reset(memory_of(o.device));
    ws.sum_.reset(memory_of(o.device));
    ws.codec_ws_.reset(memory_of(o.device));
    ws.status_.reset(memory_of(o.device));
  }
  const std::size_t mine = chunk_range(o.n, P, me).count;
  const std::size_t total = AllreduceWorkspace::comm_bytes_for(codec, o.n, P, me, algo);
  const std::size_t sum = algo == Algorithm::ScatterReduce ? align_up(4 * mine, kWorkspaceAlign) : 0;
  ws.slots_.reserve(total - sum);
  ws.sum_.reserve(sum);
  const std::size_t largest = algo == Algorithm::Allgather ? o.n : chunk_range(o.n, P, 0).count;
  ws.codec_ws_.reserve(codec.workspace_bytes(largest, o.device));
  exec = ExecContext{o.device, o.stream, ws.codec_ws_.data(), ws.codec_ws_.capacity()};
  if (o.device == Device::Cuda) {
    // GPU decodes report a malformed payload into this word instead of each
    // synchronizing to throw; check_decodes() reads it once per phase.
    ws.status_.reserve(sizeof(PayloadStatus));
    mem::zero(ws.status_.data(), sizeof(PayloadStatus), o.device, o.stream);
    exec.status = static_cast<PayloadStatus*>(ws.status_.data());
  }
  if (ws.recv_.size() != static_cast<std::size_t>(P)) {
    ws.recv_.resize(static_cast<std::size_t>(P));
    ws.send_.resize(static_cast<std::size_t>(P));
    ws.received_.resize(static_cast<std::size_t>(P));
  }
}

// allgather
//
// Words: a *payload* is one encoded buffer (wire header + body); a *slot* is
// the workspace space for one rank's payload, max_payload_bytes(n) large.
//   1. Encode: this rank encodes its whole buffer (worker error feedback over
//      all n elements) straight into its own slot.
//   2. Exchange: the payloads are allgathered, slot i receiving rank i's.
//   3. Decode: the output (the buffer itself) is zeroed and every slot is
//      decoded into it in rank order 0..P-1: the same additions in the same
//      order on every rank, so every rank gets the same bits.
// Traffic per rank: (P-1) payloads of the whole buffer, sent and received.
void AllreduceRun::run_allgather() {
  const std::size_t n = o.n, P_ = static_cast<std::size_t>(P);
  const std::size_t cap = codec.max_payload_bytes(n);
  const std::size_t stride = align_up(cap, kWorkspaceAlign);
  auto* slots = static_cast<std::byte*>(ws.slots_.data());
  auto slot = [&](std::size_t i) { return slots + i * stride; };
  auto t0 = Clock::now();

  const std::size_t bytes = codec.encode(o.buffer, worker_residual(0), n, slot(me), cap, exec);
  phase_end(stats.encode_s, t0);

  for (std::size_t i = 0; i < P_; ++i) ws.recv_[i] = Slice{slot(i), cap};
  const std::size_t sent = send_size(bytes, cap);
  t.allgatherv(ConstSlice{slot(me), sent}, ws.recv_, ws.received_, call);
  stats.wire_bytes = (P_ - 1) * sent;
  phase_end(stats.comm_s, t0);

  ws.payloads_.resize(P_);
  for (std::size_t i = 0; i < P_; ++i) ws.payloads_[i] = PayloadRef{slot(i), payload_size(slot(i), ws.received_[i], cap)};
  codec.decode_sum(ws.payloads_, o.buffer, n, scale(), exec);
  check_decodes();
  phase_end(stats.decode_s, t0);
}

// scatter_reduce (two-phase compressed allreduce, as in DeepSpeed)
//
// Words: the buffer is split into P *chunks* (chunk_range: sizes differ by at
// most one, some may be empty); rank j *owns* chunk j. A *payload* is one
// encoded chunk; workspace area A holds one slot per chunk (slot j sized for
// chunk j), area B holds P slots sized for this rank's chunk, and the *chunk
// sum* is len(own chunk) floats.
//   1. Encode: chunk j is encoded (worker error feedback on those elements)
//      into A[j], or into B[me] for the own chunk.
//   2. Scatter: alltoallv sends A[j] to rank j; B[i] receives rank i's
//      payload of the own chunk.
//   3. Reduce: the chunk sum is zeroed and B[0..P-1] decoded into it in rank
//      order.
//   4. Re-encode: the chunk sum is encoded with this rank's server error
//      feedback into A[me].
//   5. Gather: A is allgathered (slot j receives the owner of chunk j's
//      payload), then the buffer is zeroed and every A[j] decoded into chunk
//      j of it: rank j, too, uses the decoded payload rather than its exact
//      chunk sum, so every rank gets the same bits.
// Traffic per rank: 2(P-1)/P payloads of the whole buffer. With codec none
// this is reduce-scatter + allgather, the bandwidth-optimal fp32 allreduce.
void AllreduceRun::run_scatter_reduce() {
  const std::size_t P_ = static_cast<std::size_t>(P), m = static_cast<std::size_t>(me);
  const ChunkRange own = chunk_range(o.n, P, me);
  const std::size_t own_cap = codec.max_payload_bytes(own.count);
  const std::size_t b_stride = align_up(own_cap, kWorkspaceAlign);
  auto* base = static_cast<std::byte*>(ws.slots_.data());
  // Area A: slot j at a_off(j); area B after it.
  std::size_t a_total = 0;
  for (int j = 0; j < P; ++j) a_total += align_up(codec.max_payload_bytes(chunk_range(o.n, P, j).count), kWorkspaceAlign);
  auto* area_b = base + a_total;
  auto* chunk_sum = static_cast<float*>(ws.sum_.data());
  auto t0 = Clock::now();

  // 1. Encode every chunk.
  std::size_t a_off = 0, wire = 0;
  for (std::size_t j = 0; j < P_; ++j) {
    const ChunkRange c = chunk_range(o.n, P, static_cast<int>(j));
    const std::size_t cap = codec.max_payload_bytes(c.count);
    std::byte* dst = j == m ? area_b + m * b_stride : base + a_off;
    const std::size_t bytes = codec.encode(o.buffer + c.offset, worker_residual(c.offset), c.count, dst, cap, exec);
    ws.send_[j] = ConstSlice{dst, send_size(bytes, cap)};
    if (j != m) wire += ws.send_[j].bytes;
    a_off += align_up(cap, kWorkspaceAlign);
  }
  phase_end(stats.encode_s, t0);

  // 2. Scatter.
  for (std::size_t i = 0; i < P_; ++i) ws.recv_[i] = Slice{area_b + i * b_stride, own_cap};
  t.alltoallv(ws.send_, ws.recv_, ws.received_, call);
  phase_end(stats.comm_s, t0);

  // 3. Reduce into the chunk sum, in rank order.
  ws.payloads_.resize(P_);
  for (std::size_t i = 0; i < P_; ++i) {
    std::byte* p = area_b + i * b_stride;
    ws.payloads_[i] = PayloadRef{p, payload_size(p, ws.received_[i], own_cap)};
  }
  codec.decode_sum(ws.payloads_, chunk_sum, own.count, 1.0f, exec);
  check_decodes();  // never re-encode a sum of a rejected payload
  phase_end(stats.decode_s, t0);

  // 4. Re-encode the chunk sum (server error feedback) into A[me].
  a_off = 0;
  for (std::size_t j = 0; j < P_; ++j) {
    const std::size_t cap = codec.max_payload_bytes(chunk_range(o.n, P, static_cast<int>(j)).count);
    ws.recv_[j] = Slice{base + a_off, cap};
    a_off += align_up(cap, kWorkspaceAlign);
  }
  const std::size_t bytes = codec.encode(chunk_sum, server_residual(), own.count,
                                         static_cast<std::byte*>(ws.recv_[m].data), own_cap, exec);
  phase_end(stats.encode_s, t0);

  // 5. Gather every chunk's payload, decode into the buffer.
  const std::size_t sent = send_size(bytes, own_cap);
  t.allgatherv(ConstSlice{ws.recv_[m].data, sent}, ws.recv_, ws.received_, call);
  wire += (P_ - 1) * sent;
  stats.wire_bytes = wire;
  phase_end(stats.comm_s, t0);

  for (std::size_t j = 0; j < P_; ++j) {
    const ChunkRange c = chunk_range(o.n, P, static_cast<int>(j));
    auto* p = static_cast<std::byte*>(ws.recv_[j].data);
    codec.decode(p, payload_size(p, ws.received_[j], ws.recv_[j].bytes), o.buffer + c.offset, c.count,
                 Combine{false, scale()}, exec);
  }
  check_decodes();
  phase_end(stats.decode_s, t0);
}

double allreduce_error_bound(const CodecConfig& c) {
  switch (c.id) {
    case CodecId::None: return 1e-6;
    case CodecId::Fp16: return 1e-3;
    case CodecId::Bf16: return 8e-3;
    case CodecId::OneBit: return 1.0;
    case CodecId::TopK: return 1.0;
  }
  return 0;
}

void allreduce(const AllreduceOptions& o) {
  GZ_ENFORCE(o.transport != nullptr, "allreduce needs a transport");
  GZ_ENFORCE(o.workspace != nullptr, "allreduce needs a workspace (one per transport)");
  GZ_ENFORCE(o.codec != nullptr, "allreduce needs a codec");
  GZ_ENFORCE(o.state != nullptr, "allreduce needs a state (one per gradient buffer)");
  GZ_ENFORCE(o.n == 0 || o.buffer != nullptr, "allreduce buffer is null");
  GZ_ENFORCE(o.n <= wire::kMaxCount, "allreduce of ", o.n, " elements is over the wire format's limit");
  GZ_ENFORCE(o.timeout.count() > 0, "allreduce timeout must be positive");
  const auto start = Clock::now();

  AllreduceRun run(o);
  run.agree_and_bind();
  run.prepare_workspace();
  if (run.algo == Algorithm::Allgather)
    run.run_allgather();
  else
    run.run_scatter_reduce();
  run.t.synchronize(run.call);  // NCCL: wait (with the timeout) for the queued work
  if (o.stats) {
    run.stats.total_s = std::chrono::duration<double>(Clock::now() - start).count();
    *o.stats = run.stats;
  }
}

}  // namespace gz
