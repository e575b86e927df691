#include "comm/transports/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/transports/nccl/nccl_check.h"
#include "comm/security/peer_blob.h"
#include "common/cuda_check.h"

namespace gz {

namespace {
// The peer_blob magic of NCCL's unique id in the store ("GZNI").
constexpr std::uint32_t kNcclIdMagic = 0x494E5A47u;
}  // namespace

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct NcclTransport::Impl {
  ncclComm_t comm = nullptr;
  int device = 0;
  int rank = 0;
  bool broken = false;
  int* flag = nullptr;  // device int for the barrier

  // Exchanges run on their own stream, so that they overlap the caller's
  // kernels: each waits for an event on the caller's stream (what was queued
  // before start()), and records one at its end that wait() makes the
  // caller's stream wait for.
  cudaStream_t comm_stream = nullptr;
  cudaEvent_t ready = nullptr;
  struct Pending {
    std::uint64_t id = 0;  // 0: a free slot
    cudaEvent_t done = nullptr;
    cudaStream_t caller = nullptr;
    Clock::time_point deadline;
    Timeout timeout{0};
  };
  std::vector<Pending> pending;
  std::uint64_t next_id = 0;

  void ensure_stream() {
    if (comm_stream) return;
    GZ_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    GZ_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  }
  Pending& find(Exchange x) {
    if (broken) GZ_THROW(IoError, "nccl rank ", rank, ": transport is broken by an earlier failure; rebuild it");
    for (auto& p : pending)
      if (p.id == x.id && x.id != 0) return p;
    GZ_THROW(InvalidArgument, "nccl: exchange ", x.id, " is not in flight (finished, or never started)");
  }
  void release() {
    for (auto& p : pending)
      if (p.done) cudaEventDestroy(p.done);
    pending.clear();
    if (ready) cudaEventDestroy(ready);
    if (comm_stream) cudaStreamDestroy(comm_stream);
    ready = nullptr;
    comm_stream = nullptr;
  }

  // Polls a non-blocking communicator until its last call finished.
  void wait_ready(Clock::time_point deadline, const char* what, Timeout timeout) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      GZ_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(std::string(what) + ": " + ncclGetErrorString(state));
      if (Clock::now() >= deadline)
        fail(std::string(what) + " timed out after " + std::to_string(timeout.count()) + " ms");
      std::this_thread::yield();
    }
  }
  [[noreturn]] void fail(const std::string& what) {
    abort();
    GZ_THROW(IoError, "nccl rank ", rank, ": ", what, " (a peer died, hangs, or called a different collective)");
  }
  void abort() {
    if (comm && !broken) ncclCommAbort(comm);  // ends the queued work of every exchange
    comm = nullptr;
    broken = true;
    for (auto& p : pending) p.id = 0;
  }
  void check_usable(const CallContext& ctx) {
    if (broken) GZ_THROW(IoError, "nccl rank ", rank, ": transport is broken by an earlier failure; rebuild it");
    GZ_ENFORCE(ctx.device == Device::Cuda, "the NCCL transport moves device buffers only (use UCX for host buffers)");
    GZ_CUDA_CHECK(cudaSetDevice(device));
  }
};

namespace {

// Rank 0's unique id, framed (comm/security/peer_blob.h) and checked by every rank
// before NCCL sees it: a bad one is an IoError naming rank 0.
ncclUniqueId exchange_unique_id(Store& store, int rank, Timeout timeout) {
  ncclUniqueId id;
  if (rank == 0) {
    GZ_NCCL_CHECK(ncclGetUniqueId(&id));
    const std::string_view bytes(reinterpret_cast<const char*>(&id), sizeof id);
    store.set("nccl/id", frame_peer_blob(kNcclIdMagic, 0, bytes));
  }
  const std::string got =
      parse_peer_blob(kNcclIdMagic, 0, sizeof id, store.get("nccl/id", timeout), "NCCL unique id", rank);
  if (got.size() != sizeof id)
    GZ_THROW(IoError, "rank ", rank, ": the NCCL unique id of rank 0 has ", got.size(), " bytes, not ", sizeof id);
  std::memcpy(&id, got.data(), sizeof id);
  return id;
}

}  // namespace

int NcclTransport::device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

NcclTransport::NcclTransport(Store& store, int rank, int size, int cuda_device, Timeout timeout)
    : impl_(std::make_unique<Impl>()), rank_(rank), size_(size) {
  GZ_ENFORCE(rank >= 0 && rank < size, "rank ", rank, " out of range for size ", size);
  const int gpus = device_count();
  if (gpus == 0) GZ_THROW(InvalidArgument, "the NCCL transport needs a CUDA device, and this process sees none");
  GZ_ENFORCE(cuda_device >= 0 && cuda_device < gpus, "CUDA device ", cuda_device, " out of range (", gpus, " GPUs)");
  impl_->device = cuda_device;
  impl_->rank = rank;
  GZ_CUDA_CHECK(cudaSetDevice(cuda_device));

  const ncclUniqueId id = exchange_unique_id(store, rank, timeout);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto deadline = Clock::now() + timeout;
  GZ_NCCL_CHECK(ncclCommInitRankConfig(&impl_->comm, size, id, rank, &config));
  impl_->wait_ready(deadline, "ncclCommInitRankConfig", timeout);
  GZ_CUDA_CHECK(cudaMalloc(&impl_->flag, sizeof(int)));
}

NcclTransport::~NcclTransport() {
  if (impl_->flag) cudaFree(impl_->flag);
  impl_->release();
  if (impl_->comm) {
    if (impl_->broken) {
      ncclCommAbort(impl_->comm);
    } else {
      // Finalize flushes queued work; bounded so a dead peer cannot hang exit.
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      ncclResult_t state = ncclCommFinalize(impl_->comm);
      while (state == ncclSuccess || state == ncclInProgress) {
        if (ncclCommGetAsyncError(impl_->comm, &state) != ncclSuccess || state != ncclInProgress) break;
        if (Clock::now() >= deadline) break;
        std::this_thread::yield();
      }
      if (state == ncclSuccess)
        ncclCommDestroy(impl_->comm);
      else
        ncclCommAbort(impl_->comm);
    }
  }
}

ncclComm_t NcclTransport::comm() const { return impl_->comm; }

Transport::Exchange NcclTransport::start(std::span<const SendOp> sends, std::span<const RecvOp> recvs,
                                        const CallContext& ctx) {
  Impl& m = *impl_;
  m.check_usable(ctx);
  m.ensure_stream();
  Impl::Pending* x = nullptr;
  for (auto& p : m.pending)
    if (p.id == 0) x = &p;
  if (!x) {
    x = &m.pending.emplace_back();
    GZ_CUDA_CHECK(cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming));
  }
  const auto caller = reinterpret_cast<cudaStream_t>(ctx.stream);
  x->caller = caller;
  x->timeout = ctx.timeout;
  x->deadline = Clock::now() + ctx.timeout;
  // After what the caller queued so far (the encode of these payloads).
  GZ_CUDA_CHECK(cudaEventRecord(m.ready, caller));
  GZ_CUDA_CHECK(cudaStreamWaitEvent(m.comm_stream, m.ready, 0));
  GZ_NCCL_CHECK(ncclGroupStart());
  for (const SendOp& snd : sends)
    GZ_NCCL_CHECK(ncclSend(snd.data.data, snd.data.bytes, ncclUint8, snd.peer, m.comm, m.comm_stream));
  for (const RecvOp& r : recvs) {
    GZ_NCCL_CHECK(ncclRecv(r.data.data, r.data.bytes, ncclUint8, r.peer, m.comm, m.comm_stream));
    *r.received = r.data.bytes;  // NCCL receives exactly what was posted
  }
  GZ_NCCL_CHECK(ncclGroupEnd());
  m.wait_ready(x->deadline, "exchange (enqueue)", ctx.timeout);
  GZ_CUDA_CHECK(cudaEventRecord(x->done, m.comm_stream));
  x->id = ++m.next_id;
  return Exchange{x->id};
}

bool NcclTransport::test(Exchange x) {
  Impl& m = *impl_;
  Impl::Pending& p = m.find(x);
  const cudaError_t q = cudaEventQuery(p.done);
  if (q == cudaSuccess) {
    p.id = 0;
    return true;
  }
  if (q != cudaErrorNotReady) GZ_CUDA_CHECK(q);
  ncclResult_t state = ncclSuccess;
  GZ_NCCL_CHECK(ncclCommGetAsyncError(m.comm, &state));
  if (state != ncclSuccess && state != ncclInProgress) m.fail(std::string("asynchronous error: ") + ncclGetErrorString(state));
  if (Clock::now() >= p.deadline)
    m.fail("exchange timed out after " + std::to_string(p.timeout.count()) + " ms");
  return false;
}

void NcclTransport::wait(Exchange x) {
  Impl::Pending& p = impl_->find(x);
  // Device-side: the caller's stream waits; synchronize() enforces the deadline.
  GZ_CUDA_CHECK(cudaStreamWaitEvent(p.caller, p.done, 0));
  p.id = 0;
}

void NcclTransport::abort(std::string_view) { impl_->abort(); }

void NcclTransport::barrier(const CallContext& ctx) {
  CallContext c = ctx;
  c.device = Device::Cuda;
  impl_->check_usable(c);
  const auto stream = reinterpret_cast<cudaStream_t>(ctx.stream);
  const auto deadline = Clock::now() + ctx.timeout;
  GZ_NCCL_CHECK(ncclAllReduce(impl_->flag, impl_->flag, 1, ncclInt32, ncclSum, impl_->comm, stream));
  impl_->wait_ready(deadline, "barrier (enqueue)", ctx.timeout);
  synchronize(c);
}

void NcclTransport::native_allreduce_sum(float* buffer, std::size_t n, const CallContext& ctx) {
  impl_->check_usable(ctx);
  const auto deadline = Clock::now() + ctx.timeout;
  GZ_NCCL_CHECK(ncclAllReduce(buffer, buffer, n, ncclFloat32, ncclSum, impl_->comm,
                              reinterpret_cast<cudaStream_t>(ctx.stream)));
  impl_->wait_ready(deadline, "allreduce (enqueue)", ctx.timeout);
  synchronize(ctx);
}

void NcclTransport::synchronize(const CallContext& ctx) {
  if (ctx.device != Device::Cuda || impl_->broken) return;
  // nccl-tests' way: poll the stream and the communicator's async error.
  const auto stream = reinterpret_cast<cudaStream_t>(ctx.stream);
  const auto deadline = Clock::now() + ctx.timeout;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) GZ_CUDA_CHECK(q);
    ncclResult_t state = ncclSuccess;
    GZ_NCCL_CHECK(ncclCommGetAsyncError(impl_->comm, &state));
    if (state != ncclSuccess && state != ncclInProgress)
      impl_->fail(std::string("asynchronous error: ") + ncclGetErrorString(state));
    if (Clock::now() >= deadline)
      impl_->fail("waiting for the stream timed out after " + std::to_string(ctx.timeout.count()) + " ms");
    std::this_thread::yield();
  }
}

}  // namespace gz
