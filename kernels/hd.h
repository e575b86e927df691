// Portability helpers for code that compiles with both g++ and nvcc.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GZ_HD __host__ __device__ __forceinline__
#else
#define GZ_HD inline
#endif

namespace gz::kernels {

GZ_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

GZ_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// True for +-inf and NaN (bit test: immune to -ffast-math and identical on host/device).
GZ_HD bool is_nonfinite(float f) { return (float_bits(f) & 0x7F800000u) == 0x7F800000u; }

}  // namespace gz::kernels
