// Shared pieces of the CUDA launches: grid sizing, the header blob, the
// decode gate, 16-byte vector access, the decode loop. Internal to kernels/*.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "kernels/cuda.h"
#include "kernels/element.h"

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

/// Whether a kernel may read the gradient g as float4: a float gradient,
/// 16-byte aligned. (A 16-bit gradient takes the scalar loop, which widens
/// each element through ef_input.)
template <class G>
inline bool vec_gradient(const G* g) {
  return std::is_same_v<G, float> && aligned16(g);
}

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

/// What an encode quantizes: v = g + r with error feedback, g without.
/// g is float, Half or BFloat16 (kernels/element.h), widened exactly.
template <bool kEf, class G>
__device__ __forceinline__ float ef_input(const G* __restrict__ g, const float* __restrict__ r, std::size_t i) {
  return kEf ? to_float(g[i]) + r[i] : to_float(g[i]);
}

/// Where v = g (+ r) lives once an EF pass stored it: r with EF, g itself
/// without (then a float gradient: a 16-bit one without EF is widened first).
template <bool kEf, class G>
__host__ __device__ __forceinline__ const float* values_of(const G* g, const float* r) {
  if constexpr (kEf)
    return r;
  else
    return g;
}

/// Element b of an array of two-float structs (per-block scales) inside a
/// payload, which is only 4-byte aligned: moved as two floats.
template <class T>
__device__ __forceinline__ void store_pair(T* array, std::size_t b, const T& v) {
  static_assert(sizeof(T) == 2 * sizeof(float), "a pair of floats");
  float* p = reinterpret_cast<float*>(array) + 2 * b;
  const float* f = reinterpret_cast<const float*>(&v);
  p[0] = f[0];
  p[1] = f[1];
}
template <class T>
__device__ __forceinline__ T load_pair(const T* array, std::size_t b) {
  static_assert(sizeof(T) == 2 * sizeof(float), "a pair of floats");
  const float* p = reinterpret_cast<const float*>(array) + 2 * b;
  T v;
  float* f = reinterpret_cast<float*>(&v);
  f[0] = p[0];
  f[1] = p[1];
  return v;
}

/// out[4u .. 4u+3] = combine(out, d[0..3], c), as one float4 (out 16-byte
/// aligned); an overwrite does not read out.
__device__ __forceinline__ void store4(float* __restrict__ out, std::size_t u, const float* d, Combine c) {
  float4 o = c.accumulate ? reinterpret_cast<float4*>(out)[u] : float4{};
  o.x = combine(o.x, d[0], c), o.y = combine(o.y, d[1], c), o.z = combine(o.z, d[2], c), o.w = combine(o.w, d[3], c);
  reinterpret_cast<float4*>(out)[u] = o;
}

__device__ __forceinline__ std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_threads() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

/// The body of every decode kernel: nothing when the gate is closed, else
/// out[i] = combine(out[i], element i, c) for i < n, grid-stride.
///   vec (out 16-byte aligned, and whatever `unit` reads aligned for it):
///     thread units of K consecutive elements (K a multiple of 4): unit(u, d)
///     decodes elements K u .. K u + K - 1 into d[0 .. K), stored as K / 4
///     float4s (store4); the elements after the last whole unit, and every
///     element without vec, one at a time: value(i).
/// Launch with decode_grid<K>(n, vec) blocks of kThreads.
template <int K, class Unit, class Value>
__device__ __forceinline__ void decode_elements(std::size_t n, float* __restrict__ out, Combine c,
                                                const std::uint32_t* gate, bool vec, Unit unit, Value value) {
  static_assert(K % 4 == 0, "a unit is whole float4s");
  if (gate_closed(gate)) return;
  std::size_t tail = 0;
  if (vec) {
    const std::size_t units = n / K;
    for (std::size_t u = global_thread(); u < units; u += grid_threads()) {
      float d[K];
      unit(u, d);
#pragma unroll
      for (int q = 0; q < K / 4; ++q) store4(out, K / 4 * u + q, d + 4 * q, c);
    }
    tail = units * K;
  }
  for (std::size_t i = tail + global_thread(); i < n; i += grid_threads()) out[i] = combine(out[i], value(i), c);
}

/// Blocks for decode_elements<K>.
template <int K>
inline unsigned decode_grid(std::size_t n, bool vec) {
  return grid_for(vec ? n / K + K : n);
}

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
