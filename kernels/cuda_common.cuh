// Shared pieces of the CUDA launches: grid sizing, the header blob, the
// decode gate, 16-byte vector access. Internal to kernels/*.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/cuda_check.h"
#include "kernels/cuda.h"

namespace gz::kernels::cuda::detail {

inline constexpr int kThreads = 256;  // threads per block of the streaming kernels
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

/// Multiprocessors of the current device (cached per device; no synchronization).
int sm_count();

/// Blocks for a grid-stride loop over `units` work items of `threads` each:
/// enough to fill the device several times over, never more than the work.
inline unsigned grid_for(std::size_t units, int threads = kThreads, int blocks_per_sm = 16) {
  const std::size_t want = (units + threads - 1) / threads;
  const std::size_t cap = static_cast<std::size_t>(sm_count()) * blocks_per_sm;
  const std::size_t g = want < cap ? want : cap;
  return static_cast<unsigned>(g ? g : 1);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

/// Thread 0 of block 0 stores the blob. Call from every block. (Constant
/// indices keep the parameter out of local memory.)
__device__ __forceinline__ void store_blob(const Blob32& b) {
  if (b.dst && blockIdx.x == 0 && threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < 8; ++w) static_cast<std::uint32_t*>(b.dst)[w] = b.words[w];
  }
}

/// True when a decode must do nothing (its payload failed validation).
__device__ __forceinline__ bool gate_closed(const std::uint32_t* gate) { return gate && *gate != 0; }

__device__ __forceinline__ std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_threads() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

}  // namespace gz::kernels::cuda::detail

/// Checks the kernel launch just issued (bad configuration, missing image, or an
/// earlier asynchronous fault); the message names the kernel, file and line.
#define GZ_LAUNCH_CHECK(kernel)                                                              \
  do {                                                                                       \
    const cudaError_t gz_launch_err_ = cudaPeekAtLastError();                                \
    if (gz_launch_err_ != cudaSuccess)                                                       \
      GZ_THROW(::gz::CudaError, "launch of " #kernel " failed: ", cudaGetErrorName(gz_launch_err_), \
               ": ", cudaGetErrorString(gz_launch_err_));                                    \
  } while (0)
