#include "comm/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "comm/nccl/nccl_check.h"
#include "comm/peer_blob.h"
#include "common/cuda_check.h"

namespace gz {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct NcclTransport::Impl {
  ncclComm_t comm = nullptr;
  int device = 0;
  int rank = 0;
  bool broken = false;
  int* flag = nullptr;  // device int for the barrier

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
    if (comm && !broken) ncclCommAbort(comm);
    comm = nullptr;
    broken = true;
    GZ_THROW(IoError, "nccl rank ", rank, ": ", what, " (a peer died, hangs, or called a different collective)");
  }
  void check_usable(const CallContext& ctx) {
    if (broken) GZ_THROW(IoError, "nccl rank ", rank, ": transport is broken by an earlier failure; rebuild it");
    GZ_ENFORCE(ctx.device == Device::Cuda, "the NCCL transport moves device buffers only (use UCX for host buffers)");
    GZ_CUDA_CHECK(cudaSetDevice(device));
  }
};

namespace {

// Rank 0's unique id, framed (comm/peer_blob.h) and checked by every rank
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

void NcclTransport::allgatherv(ConstSlice send, std::span<const Slice> recv, std::span<std::size_t> received,
                               const CallContext& ctx) {
  impl_->check_usable(ctx);
  const auto P = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
  GZ_ENFORCE(recv.size() == P && received.size() == P, "allgatherv needs one slot per rank");
  GZ_ENFORCE_LE(send.bytes, recv[me].bytes, "allgatherv: this rank's buffer is larger than its slot");
  const auto stream = reinterpret_cast<cudaStream_t>(ctx.stream);
  if (recv[me].data != send.data && send.bytes)
    GZ_CUDA_CHECK(cudaMemcpyAsync(recv[me].data, send.data, send.bytes, cudaMemcpyDeviceToDevice, stream));
  received[me] = send.bytes;
  const auto deadline = Clock::now() + ctx.timeout;
  GZ_NCCL_CHECK(ncclGroupStart());
  for (std::size_t r = 0; r < P; ++r) {
    if (r == me) continue;
    GZ_NCCL_CHECK(ncclSend(send.data, send.bytes, ncclUint8, static_cast<int>(r), impl_->comm, stream));
    GZ_NCCL_CHECK(ncclRecv(recv[r].data, recv[r].bytes, ncclUint8, static_cast<int>(r), impl_->comm, stream));
    received[r] = recv[r].bytes;
  }
  GZ_NCCL_CHECK(ncclGroupEnd());
  impl_->wait_ready(deadline, "allgatherv (enqueue)", ctx.timeout);
}

void NcclTransport::alltoallv(std::span<const ConstSlice> send, std::span<const Slice> recv,
                              std::span<std::size_t> received, const CallContext& ctx) {
  impl_->check_usable(ctx);
  const auto P = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
  GZ_ENFORCE(send.size() == P && recv.size() == P && received.size() == P, "alltoallv needs one slot per rank");
  const auto stream = reinterpret_cast<cudaStream_t>(ctx.stream);
  if (recv[me].data != send[me].data && send[me].bytes)
    GZ_CUDA_CHECK(cudaMemcpyAsync(recv[me].data, send[me].data, send[me].bytes, cudaMemcpyDeviceToDevice, stream));
  received[me] = send[me].bytes;
  const auto deadline = Clock::now() + ctx.timeout;
  GZ_NCCL_CHECK(ncclGroupStart());
  for (std::size_t r = 0; r < P; ++r) {
    if (r == me) continue;
    GZ_NCCL_CHECK(ncclSend(send[r].data, send[r].bytes, ncclUint8, static_cast<int>(r), impl_->comm, stream));
    GZ_NCCL_CHECK(ncclRecv(recv[r].data, recv[r].bytes, ncclUint8, static_cast<int>(r), impl_->comm, stream));
    received[r] = recv[r].bytes;
  }
  GZ_NCCL_CHECK(ncclGroupEnd());
  impl_->wait_ready(deadline, "alltoallv (enqueue)", ctx.timeout);
}

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

void NcclTransport::allreduce_sum(float* buffer, std::size_t n, const CallContext& ctx) {
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
