#include "comm/transports/ucx/ucx_transport.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/transports/ucx/ucx_address.h"
#include "comm/transports/ucx/ucx_check.h"
#include "common/workspace.h"
#if GZ_HAVE_CUDA
#include "common/cuda_check.h"
#endif

namespace gz {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRanks = 1 << 24;  // the tag has 24 bits for the source rank

// The tag of the seq-th message from `src` to one peer: per pair and
// direction, messages match in posting order (transport.h).
ucp_tag_t make_tag(std::uint32_t seq, int src) { return (ucp_tag_t{seq} << 32) | (static_cast<ucp_tag_t>(src) << 8); }

// UCP_ERR_HANDLING_MODE_PEER makes a dead peer an endpoint error, but UCX
// 1.13's shared-memory transports (posix, sysv) do not support it, so with it
// local ranks talk over TCP loopback at a fraction of the bandwidth. So:
// GRADZIP_UCX_ERR_MODE=peer|none|auto; auto takes peer when UCX_TLS names no
// shared-memory transport (UCX_TLS=tcp, the emulated cluster), else none, and
// then a dead peer is caught by the wait deadline instead.
bool peer_error_mode() {
  const char* m = std::getenv("GRADZIP_UCX_ERR_MODE");
  const std::string mode = m && *m ? m : "auto";
  if (mode == "peer") return true;
  if (mode == "none") return false;
  if (mode != "auto") GZ_THROW(InvalidArgument, "GRADZIP_UCX_ERR_MODE must be peer, none or auto, got '", mode, "'");
  const char* t = std::getenv("UCX_TLS");
  if (!t || !*t) return false;
  const std::string tls = t;
  for (const char* shm : {"shm", "sm", "posix", "sysv", "all", "cma", "knem", "xpmem"})
    if (tls.find(shm) != std::string::npos) return false;
  return true;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// One outstanding send or receive of an exchange.
struct Op {
  void* req = nullptr;  // null once complete
  int peer = 0;
  bool recv = false;
  std::size_t* received = nullptr;
  ucp_tag_recv_info_t info{};  // set by on_recv
  ucs_status_t status = UCS_INPROGRESS;
};

void on_recv(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  if (info) op->info = *info;
  op->status = status;
}

// An exchange in flight (or a free slot, id == 0).
struct Pending {
  std::uint64_t id = 0;
  std::vector<Op> ops;  // reserved before posting: callbacks hold Op pointers
  Clock::time_point deadline;
  Timeout timeout{0};
};

}  // namespace

struct UcxTransport::Impl {
  struct PeerSlot {
    Impl* impl;
    int peer;
  };

  int rank = 0, size = 0;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int efd = -1;
  bool busy_poll = false;
  bool peer_errors = false;  // endpoints in UCP_ERR_HANDLING_MODE_PEER
  std::vector<ucp_ep_h> eps;
  std::vector<PeerSlot> slots;
  std::vector<ucs_status_t> peer_status;  // set by the endpoints' error handler
  std::vector<std::uint32_t> sent, received;  // per peer: messages posted each way (the tags' sequence)
  bool broken = false;
  std::vector<std::unique_ptr<Pending>> pending;  // exchanges in flight; reused
  std::uint64_t next_id = 0;

  // Pinned host memory for CUDA buffers.
  void* staging = nullptr;
  std::size_t staging_capacity = 0;

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* s = static_cast<PeerSlot*>(arg);
    if (s->impl->peer_status[static_cast<std::size_t>(s->peer)] == UCS_OK)
      s->impl->peer_status[static_cast<std::size_t>(s->peer)] = status;
  }

  Pending& find(Transport::Exchange x);
  // Frees the requests of x that completed; true when all did. Throws (via
  // fail) on a failed request, a peer error or x's deadline.
  bool poll(Pending& x);
  void progress();
  [[noreturn]] void fail(const std::string& what);
  void cancel_all();
  void close_endpoints(bool force);
  // Sleeps on the worker's event fd, at most max_ms.
  void idle(Clock::time_point deadline, int max_ms);
  void* stage(std::size_t bytes);
  ~Impl();
};

UcxTransport::UcxTransport(Store& store, int rank, int size, Timeout timeout)
    : impl_(std::make_unique<Impl>()), rank_(rank), size_(size) {
  GZ_ENFORCE(size >= 1 && size <= kMaxRanks, "world size must be in 1..", kMaxRanks);
  GZ_ENFORCE(rank >= 0 && rank < size, "rank ", rank, " out of range for size ", size);
  Impl& m = *impl_;
  m.rank = rank;
  m.size = size;
  m.busy_poll = env_flag("GRADZIP_UCX_BUSY_POLL");
  m.peer_errors = peer_error_mode();

  // UCX_* variables from the environment (UCX_TLS=tcp, UCX_NET_DEVICES, ...).
  ucp_config_t* config = nullptr;
  GZ_UCX_CHECK(ucp_config_read(nullptr, nullptr, &config));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_TAG | (m.busy_poll ? 0 : UCP_FEATURE_WAKEUP);
  params.estimated_num_eps = static_cast<std::size_t>(size);
  const ucs_status_t init = ucp_init(&params, config, &m.context);
  ucp_config_release(config);
  GZ_UCX_CHECK(init);

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  GZ_UCX_CHECK(ucp_worker_create(m.context, &wp, &m.worker));
  if (!m.busy_poll && ucp_worker_get_efd(m.worker, &m.efd) != UCS_OK) m.efd = -1;

  // Every rank's worker address, checked before UCX sees it (ucx_address.h).
  const std::vector<std::string> remote = exchange_worker_addresses(store, m.worker, rank, size, timeout);

  m.eps.assign(static_cast<std::size_t>(size), nullptr);
  m.sent.assign(static_cast<std::size_t>(size), 0);
  m.received.assign(static_cast<std::size_t>(size), 0);
  m.peer_status.assign(static_cast<std::size_t>(size), UCS_OK);
  m.slots.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    m.slots[static_cast<std::size_t>(r)] = {&m, r};
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(remote[static_cast<std::size_t>(r)].data());
    // peer: a dead peer fails its requests (see peer_error_mode).
    ep.err_mode = m.peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &Impl::on_ep_error;
    ep.err_handler.arg = &m.slots[static_cast<std::size_t>(r)];
    GZ_UCX_CHECK(ucp_ep_create(m.worker, &ep, &m.eps[static_cast<std::size_t>(r)]));
  }
  // Wire up every pair now, not on the first collective.
  barrier(CallContext{Device::Cpu, nullptr, timeout});
}

UcxTransport::~UcxTransport() = default;

UcxTransport::Impl::~Impl() {
  if (worker) {
    close_endpoints(broken);
    ucp_worker_destroy(worker);
  }
  if (context) ucp_cleanup(context);
#if GZ_HAVE_CUDA
  if (staging) cudaFreeHost(staging);
#endif
}

void UcxTransport::Impl::close_endpoints(bool force) {
  std::vector<void*> reqs;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  for (auto& ep : eps) {
    if (!ep) continue;
    void* r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) reqs.push_back(r);
    ep = nullptr;
  }
  // A flush may wait on a peer that is gone: bound it.
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  for (void* r : reqs) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) ucp_worker_progress(worker);
    ucp_request_free(r);
  }
}

void UcxTransport::Impl::cancel_all() {
  // Cancel what is still posted so UCX never writes into the caller's buffers
  // after we return; sends end with the endpoints.
  for (auto& x : pending)
    for (auto& op : x->ops)
      if (op.req && op.recv) ucp_request_cancel(worker, op.req);
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  for (auto& x : pending) {
    for (auto& op : x->ops) {
      if (!op.req) continue;
      while (op.recv && op.status == UCS_INPROGRESS && Clock::now() < deadline) ucp_worker_progress(worker);
      ucp_request_free(op.req);
      op.req = nullptr;
    }
    x->id = 0;
  }
  broken = true;
  close_endpoints(true);  // peers see the error now, not at their timeout
}

void UcxTransport::Impl::fail(const std::string& what) {
  cancel_all();
  GZ_THROW(IoError, "ucx rank ", rank, ": ", what);
}

void UcxTransport::Impl::idle(Clock::time_point deadline, int max_ms) {
  if (efd < 0) {
    sched_yield();
    return;
  }
  const ucs_status_t s = ucp_worker_arm(worker);
  if (s == UCS_ERR_BUSY) return;  // events pending: progress again
  if (s != UCS_OK) {
    sched_yield();
    return;
  }
  // Wake at least every max_ms to check peers and the deadline.
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  pollfd p{efd, POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left, 0, max_ms)));
}

void UcxTransport::Impl::progress() {
  while (ucp_worker_progress(worker) != 0) {
  }
}

Pending& UcxTransport::Impl::find(Transport::Exchange x) {
  if (broken) GZ_THROW(IoError, "ucx rank ", rank, ": transport is broken by an earlier failure; rebuild it");
  for (auto& p : pending)
    if (p->id == x.id && x.id != 0) return *p;
  GZ_THROW(InvalidArgument, "ucx: exchange ", x.id, " is not in flight (finished, or never started)");
}

bool UcxTransport::Impl::poll(Pending& x) {
  bool done = true;
  for (auto& op : x.ops) {
    if (!op.req) continue;
    const ucs_status_t st = op.recv ? op.status : ucp_request_check_status(op.req);
    if (st == UCS_INPROGRESS) {
      done = false;
      continue;
    }
    ucp_request_free(op.req);
    op.req = nullptr;
    if (st != UCS_OK)
      fail(std::string(op.recv ? "receive from rank " : "send to rank ") + std::to_string(op.peer) +
           " failed: " + ucs_status_string(st) +
           (st == UCS_ERR_MESSAGE_TRUNCATED ? " (the ranks disagree on buffer sizes)" : ""));
    if (op.recv) *op.received = op.info.length;
  }
  if (done) {
    x.id = 0;
    return true;
  }
  // Peers whose endpoint reported an error will never answer.
  for (const auto& op : x.ops) {
    if (!op.req) continue;
    const ucs_status_t ps = peer_status[static_cast<std::size_t>(op.peer)];
    if (ps != UCS_OK)
      fail("rank " + std::to_string(op.peer) + " failed or exited (" + ucs_status_string(ps) + ")");
  }
  if (Clock::now() >= x.deadline) {
    std::string waiting;
    for (const auto& op : x.ops)
      if (op.req && waiting.find(" " + std::to_string(op.peer) + ",") == std::string::npos)
        waiting += " " + std::to_string(op.peer) + ",";
    waiting.pop_back();
    fail("exchange timed out after " + std::to_string(x.timeout.count()) + " ms waiting for rank(s)" + waiting +
         " (a peer died, hangs, or called a different collective)");
  }
  return false;
}

void* UcxTransport::Impl::stage(std::size_t bytes) {
#if GZ_HAVE_CUDA
  if (bytes > staging_capacity) {
    if (staging) GZ_CUDA_CHECK(cudaFreeHost(staging));
    staging = nullptr;
    staging_capacity = 0;
    GZ_CUDA_CHECK(cudaHostAlloc(&staging, bytes, cudaHostAllocDefault));
    staging_capacity = bytes;
  }
  return staging;
#else
  (void)bytes;
  GZ_THROW(InvalidArgument, "ucx: CUDA buffers need a build with CUDA (GRADZIP_CUDA=ON)");
#endif
}

std::size_t UcxTransport::staging_bytes() const { return impl_->staging_capacity; }

std::string UcxTransport::describe() const {
  const char* tls = std::getenv("UCX_TLS");
  return std::string("ucx ") + ucp_get_version_string() + " UCX_TLS=" + (tls ? tls : "(default)") +
         (impl_->efd >= 0 ? " wakeup=event" : " wakeup=busy-poll") +
         (impl_->peer_errors ? " err_mode=peer" : " err_mode=none");
}

#if GZ_HAVE_CUDA
namespace {

// The end of a staged exchange: what each peer sent goes from its pinned host
// slot to the caller's device slot, this rank's own payload device to device.
// Waits for the copies: the staging memory is reused by the next call.
void unstage(std::span<const Slice> recv, std::span<const Slice> hrecv, std::span<const std::size_t> received,
             std::size_t me, ConstSlice own, cudaStream_t stream) {
  for (std::size_t r = 0; r < recv.size(); ++r) {
    if (r == me) {
      if (recv[me].data != own.data && own.bytes)
        GZ_CUDA_CHECK(cudaMemcpyAsync(recv[me].data, own.data, own.bytes, cudaMemcpyDeviceToDevice, stream));
    } else if (received[r]) {
      GZ_CUDA_CHECK(cudaMemcpyAsync(recv[r].data, hrecv[r].data, received[r], cudaMemcpyHostToDevice, stream));
    }
  }
  GZ_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace
#endif

void UcxTransport::allgatherv(ConstSlice send, std::span<const Slice> recv, std::span<std::size_t> received,
                              const CallContext& ctx) {
  const auto P = static_cast<std::size_t>(size_);
  const auto me = static_cast<std::size_t>(rank_);
  GZ_ENFORCE(recv.size() == P && received.size() == P, "allgatherv needs one slot per rank");
  GZ_ENFORCE_LE(send.bytes, recv[me].bytes, "allgatherv: this rank's buffer is larger than its slot");

  if (ctx.device == Device::Cpu) return Transport::allgatherv(send, recv, received, ctx);
#if GZ_HAVE_CUDA
  // Stage: [send][slot 0]...[slot P-1], each 256-byte aligned, in pinned memory.
  std::vector<std::size_t> off(P + 1);
  std::size_t total = align_up(send.bytes, kWorkspaceAlign);
  for (std::size_t r = 0; r < P; ++r) {
    off[r] = total;
    total += align_up(recv[r].bytes, kWorkspaceAlign);
  }
  auto* base = static_cast<std::byte*>(impl_->stage(total));
  auto stream = reinterpret_cast<cudaStream_t>(ctx.stream);
  if (send.bytes) GZ_CUDA_CHECK(cudaMemcpyAsync(base, send.data, send.bytes, cudaMemcpyDeviceToHost, stream));
  GZ_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<Slice> hrecv(P);
  for (std::size_t r = 0; r < P; ++r) hrecv[r] = {base + off[r], recv[r].bytes};
  hrecv[me] = {base, recv[me].bytes};  // the host copy of send is this rank's slot
  allgatherv(ConstSlice{base, send.bytes}, hrecv, received, CallContext{Device::Cpu, nullptr, ctx.timeout});
  unstage(recv, hrecv, received, me, send, stream);
#else
  impl_->stage(1);
#endif
}

void UcxTransport::alltoallv(std::span<const ConstSlice> send, std::span<const Slice> recv,
                             std::span<std::size_t> received, const CallContext& ctx) {
  const auto P = static_cast<std::size_t>(size_);
  const auto me = static_cast<std::size_t>(rank_);
  GZ_ENFORCE(send.size() == P && recv.size() == P && received.size() == P, "alltoallv needs one slot per rank");
  GZ_ENFORCE_LE(send[me].bytes, recv[me].bytes, "alltoallv: this rank's own buffer is larger than its slot");

  if (ctx.device == Device::Cpu) return Transport::alltoallv(send, recv, received, ctx);
#if GZ_HAVE_CUDA
  // Stage: [send 0..P-1][recv 0..P-1] in pinned memory.
  std::vector<std::size_t> soff(P), roff(P);
  std::size_t total = 0;
  for (std::size_t r = 0; r < P; ++r) {
    soff[r] = total;
    total += align_up(send[r].bytes, kWorkspaceAlign);
  }
  for (std::size_t r = 0; r < P; ++r) {
    roff[r] = total;
    total += align_up(recv[r].bytes, kWorkspaceAlign);
  }
  auto* base = static_cast<std::byte*>(impl_->stage(total));
  auto stream = reinterpret_cast<cudaStream_t>(ctx.stream);
  std::vector<ConstSlice> hsend(P);
  std::vector<Slice> hrecv(P);
  for (std::size_t r = 0; r < P; ++r) {
    hsend[r] = {base + soff[r], send[r].bytes};
    hrecv[r] = {base + roff[r], recv[r].bytes};
    if (r != me && send[r].bytes)
      GZ_CUDA_CHECK(cudaMemcpyAsync(base + soff[r], send[r].data, send[r].bytes, cudaMemcpyDeviceToHost, stream));
  }
  hsend[me] = {nullptr, 0};
  GZ_CUDA_CHECK(cudaStreamSynchronize(stream));
  alltoallv(hsend, hrecv, received, CallContext{Device::Cpu, nullptr, ctx.timeout});
  received[me] = send[me].bytes;
  unstage(recv, hrecv, received, me, send[me], stream);
#else
  impl_->stage(1);
#endif
}

Transport::Exchange UcxTransport::start(std::span<const SendOp> sends, std::span<const RecvOp> recvs,
                                       const CallContext& ctx) {
  Impl& m = *impl_;
  if (m.broken) GZ_THROW(IoError, "ucx rank ", rank_, ": transport is broken by an earlier failure; rebuild it");
  GZ_ENFORCE(ctx.device == Device::Cpu, "ucx exchanges take host memory (this UCX has no CUDA support); "
                                        "place pipelined buffers in pinned host memory");
  Pending* x = nullptr;
  for (auto& p : m.pending)
    if (p->id == 0) x = p.get();
  if (!x) x = m.pending.emplace_back(std::make_unique<Pending>()).get();
  x->ops.clear();
  x->ops.reserve(recvs.size() + sends.size());  // no reallocation: callbacks hold Op pointers
  x->timeout = ctx.timeout;
  x->deadline = Clock::now() + ctx.timeout;
  x->id = ++m.next_id;
  auto check_peer = [&](int peer) {
    GZ_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "ucx: exchange peer ", peer, " is not another rank of ",
               size_);
  };
  // Receives first, so that eager messages land in place. Every receive goes
  // through the completion callback (NO_IMM_CMPL), which records status and
  // length in its Op.
  for (const RecvOp& r : recvs) {
    check_peer(r.peer);
    Op& op = x->ops.emplace_back(Op{nullptr, r.peer, true, r.received, {}, UCS_INPROGRESS});
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    rp.cb.recv = &on_recv;
    rp.user_data = &op;
    const ucp_tag_t tag = make_tag(m.received[static_cast<std::size_t>(r.peer)]++, r.peer);
    void* req = ucp_tag_recv_nbx(m.worker, r.data.data, r.data.bytes, tag, ~ucp_tag_t{0}, &rp);
    if (UCS_PTR_IS_ERR(req))
      m.fail(std::string("ucp_tag_recv_nbx from rank ") + std::to_string(r.peer) + " failed: " +
             ucs_status_string(UCS_PTR_STATUS(req)));
    op.req = req;
  }
  ucp_request_param_t sp{};
  sp.op_attr_mask = 0;
  for (const SendOp& snd : sends) {
    check_peer(snd.peer);
    const ucp_tag_t tag = make_tag(m.sent[static_cast<std::size_t>(snd.peer)]++, rank_);
    void* req = ucp_tag_send_nbx(m.eps[static_cast<std::size_t>(snd.peer)], snd.data.data, snd.data.bytes, tag, &sp);
    if (UCS_PTR_IS_ERR(req))
      m.fail(std::string("ucp_tag_send_nbx to rank ") + std::to_string(snd.peer) + " failed: " +
             ucs_status_string(UCS_PTR_STATUS(req)));
    if (req) x->ops.push_back(Op{req, snd.peer, false, nullptr, {}, UCS_INPROGRESS});  // null: completed in place
  }
  return Exchange{x->id};
}

bool UcxTransport::test(Exchange x) {
  Pending& p = impl_->find(x);
  impl_->progress();
  return impl_->poll(p);
}

void UcxTransport::wait(Exchange x) {
  Impl& m = *impl_;
  Pending& p = m.find(x);
  int idle_rounds = 0;
  for (;;) {
    unsigned progressed = 0;
    while (ucp_worker_progress(m.worker) != 0) ++progressed;
    if (m.poll(p)) return;
    if (progressed) {
      idle_rounds = 0;
    } else if (++idle_rounds > 64) {
      // A send waiting for room (a full shared-memory FIFO) has no event to
      // wake it: look again soon. Receives wake the fd.
      const bool sending = std::any_of(p.ops.begin(), p.ops.end(), [](const Op& op) { return op.req && !op.recv; });
      m.idle(p.deadline, sending ? 1 : 10);
    }
  }
}

void UcxTransport::abort(std::string_view why) {
  (void)why;  // the peers learn of it from their endpoints; the caller reports why
  if (!impl_->broken) impl_->cancel_all();
}

}  // namespace gz
