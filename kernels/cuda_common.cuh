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

/// A DecodeOut on the device, its element type fixed: T = float, Half or
/// BFloat16 (partial is null for float).
template <class T>
struct Out {
  T* out;
  const float* partial;
};

/// Calls f(Out<T>) for the DecodeOut's dtype: one instantiation of a decode
/// kernel per output type.
template <class F>
void with_out(const DecodeOut& o, F&& f) {
  with_elements(o.dtype, o.out, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    f(Out<T>{p, std::is_same_v<T, float> ? nullptr : o.partial});
  });
}

/// Whether every array a decode writes or adds to is 16-byte aligned.
inline bool aligned16(const DecodeOut& o) { return aligned16(o.out) && (!o.partial || aligned16(o.partial)); }

/// The value an accumulate adds element i to (DecodeOut's rule); 0 when the
/// decode overwrites (combine ignores it then, and out is not read).
template <class T>
__device__ __forceinline__ float addend(Out<T> o, std::size_t i, Combine c) {
  if (!c.accumulate) return 0.0f;
  return o.partial ? o.partial[i] : to_float(o.out[i]);
}

/// out[4u .. 4u+3] = combine(out, d[0..3], c), one 16-byte float4 or, for a
/// 16-bit out, one 8-byte word of four elements rounded once (out 16-byte
/// aligned; the partial sum too); an overwrite does not read out.
template <class T>
__device__ __forceinline__ void store4(Out<T> o, std::size_t u, const float* d, Combine c) {
  if constexpr (std::is_same_v<T, float>) {
    float4 v = c.accumulate ? reinterpret_cast<const float4*>(o.out)[u] : float4{};
    v.x = combine(v.x, d[0], c), v.y = combine(v.y, d[1], c), v.z = combine(v.z, d[2], c), v.w = combine(v.w, d[3], c);
    reinterpret_cast<float4*>(o.out)[u] = v;
  } else {
    float a[4] = {};
    if (c.accumulate) {
      if (o.partial) {
        const float4 p = reinterpret_cast<const float4*>(o.partial)[u];
        a[0] = p.x, a[1] = p.y, a[2] = p.z, a[3] = p.w;
      } else {
        const uint2 w = reinterpret_cast<const uint2*>(o.out)[u];
        a[0] = to_float(T{static_cast<std::uint16_t>(w.x & 0xFFFFu)});
        a[1] = to_float(T{static_cast<std::uint16_t>(w.x >> 16)});
        a[2] = to_float(T{static_cast<std::uint16_t>(w.y & 0xFFFFu)});
        a[3] = to_float(T{static_cast<std::uint16_t>(w.y >> 16)});
      }
    }
    std::uint32_t h[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) h[e] = from_float<T>(combine(a[e], d[e], c)).bits;
    reinterpret_cast<uint2*>(o.out)[u] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
  }
}

__device__ __forceinline__ std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_threads() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

/// The body of every dense decode kernel: nothing when the gate is closed,
/// else element i of `o` combined with element i of the payload as DecodeOut
/// says, for i < n, grid-stride; in one pass for every output type.
///   vec (aligned16 of the DecodeOut, and whatever `unit` reads aligned for
///     it): thread units of K consecutive elements (K a multiple of 4):
///     unit(u, d) decodes elements K u .. K u + K - 1 into d[0 .. K), stored
///     four at a time (store4); the elements after the last whole unit, and
///     every element without vec, one at a time: value(i).
/// Launch with decode_grid<K>(n, vec) blocks of kThreads.
template <int K, class T, class Unit, class Value>
__device__ __forceinline__ void decode_elements(std::size_t n, Out<T> o, Combine c, const std::uint32_t* gate,
                                                bool vec, Unit unit, Value value) {
  static_assert(K % 4 == 0, "a unit is whole float4s");
  if (gate_closed(gate)) return;
  std::size_t tail = 0;
  if (vec) {
    const std::size_t units = n / K;
    for (std::size_t u = global_thread(); u < units; u += grid_threads()) {
      float d[K];
      unit(u, d);
#pragma unroll
      for (int q = 0; q < K / 4; ++q) store4(o, K / 4 * u + q, d + 4 * q, c);
    }
    tail = units * K;
  }
  for (std::size_t i = tail + global_thread(); i < n; i += grid_threads())
    o.out[i] = from_float<T>(combine(addend(o, i, c), value(i), c));
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
