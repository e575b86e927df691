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

GZ_HD std::uint64_t double_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint64_t>(__double_as_longlong(d));
#else
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}

GZ_HD double bits_double(std::uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
#endif
}

// Selections written as bit masks rather than ?: on floating point: same
// result, but g++ vectorizes them (it will not if-convert FP ?: under its
// default -ftrapping-math), and they cost the same on a GPU.

/// c ? a : b
GZ_HD float select(bool c, float a, float b) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return bits_float((float_bits(a) & m) | (float_bits(b) & ~m));
}

/// c ? x : +0.0f
GZ_HD float keep_if(bool c, float x) { return bits_float(float_bits(x) & (0u - static_cast<std::uint32_t>(c))); }

/// c ? x : +0.0
GZ_HD double keep_if(bool c, double x) {
  return bits_double(double_bits(x) & (std::uint64_t{0} - static_cast<std::uint64_t>(c)));
}

/// True for +-inf and NaN (bit test: immune to -ffast-math and identical on host/device).
GZ_HD bool is_nonfinite(float f) { return (float_bits(f) & 0x7F800000u) == 0x7F800000u; }

}  // namespace gz::kernels
