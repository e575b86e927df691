// Helpers of the GPU tests: device buffers, the skip when there is no GPU,
// seeded inputs with special values, and comparisons where NaN equals NaN
// (GPU arithmetic returns one canonical NaN, x86 keeps the operand's payload).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "compressors/codec.h"
#include "kernels/cuda.h"

namespace gz::test {

/// An error message without its "[file:line] " prefix and the device marker,
/// so GPU and CPU messages compare equal.
inline std::string bare(const std::string& what) {
  std::string s = what;
  if (const auto p = s.find("] "); s.rfind('[', 0) == 0 && p != std::string::npos) s = s.substr(p + 2);
  const std::string marker = "(checked on the device) ";
  if (s.rfind(marker, 0) == 0) s = s.substr(marker.size());
  return s;
}

/// Why GPU tests cannot run here ("" when a device is present).
inline std::string no_device_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }
  return count == 0 ? "cudaGetDeviceCount returned 0" : "";
}

#define GZ_REQUIRE_GPU()                                                                 \
  do {                                                                                   \
    const std::string gz_reason_ = ::gz::test::no_device_reason();                      \
    if (!gz_reason_.empty()) GTEST_SKIP() << "no CUDA device: " << gz_reason_;          \
  } while (0)

/// Owning device buffer of T.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count) GZ_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
  }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (ptr_) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), count_(o.count_) { o.ptr_ = nullptr, o.count_ = 0; }

  T* get() const { return ptr_; }
  std::size_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    if (!host.empty()) GZ_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download(std::size_t count) const {
    std::vector<T> host(count);
    if (count) GZ_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  std::vector<T> download() const { return download(count_); }
  void fill_bytes(int byte) {
    if (count_) GZ_CUDA_CHECK(cudaMemset(ptr_, byte, count_ * sizeof(T)));
  }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

/// A codec's device workspace for calls on up to n elements (CUB's two phases:
/// workspace_bytes, then every call gets it through ExecContext).
class CudaWorkspace {
 public:
  CudaWorkspace(const Codec& codec, std::size_t n) : ws_(codec.workspace_bytes(n, Device::Cuda)) {}
  /// A context on `stream`; with `status`, decodes report there (no sync).
  ExecContext ctx(cudaStream_t stream = nullptr, PayloadStatus* status = nullptr) const {
    ExecContext c{Device::Cuda, stream, ws_.get(), ws_.size()};
    c.status = status;
    return c;
  }

 private:
  DeviceBuffer<std::byte> ws_;
};

/// Seed of this run: GZ_TEST_SEED when set (to replay a failure), else fresh.
inline std::uint64_t test_seed() {
  static const std::uint64_t seed = []() -> std::uint64_t {
    if (const char* s = std::getenv("GZ_TEST_SEED")) return std::strtoull(s, nullptr, 0);
    return (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }();
  return seed;
}

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// Gaussian values with a scale that varies by region (like the layers of a
/// bucket), so the largest magnitudes cluster.
inline std::vector<float> gaussian(std::size_t n, std::mt19937_64& rng, float sigma = 1.0f) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = d(rng) * (1.0f + static_cast<float>((i / 4096) % 7));
  return v;
}

/// Special values a gradient can hold: signed zeros, denormals, infinities,
/// NaNs (quiet, signaling, negative), float and fp16/bf16 limits.
inline std::vector<float> special_values() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.0f,
          -0.0f,
          std::numeric_limits<float>::denorm_min(),
          -std::numeric_limits<float>::denorm_min(),
          1e-40f,
          -3e-39f,
          std::numeric_limits<float>::min(),
          inf,
          -inf,
          bits_to_float(0x7FC00000u),
          bits_to_float(0xFFC00000u),
          bits_to_float(0x7F800001u),
          bits_to_float(0x7FFFFFFFu),
          std::numeric_limits<float>::max(),
          -std::numeric_limits<float>::max(),
          65504.0f,
          65519.99f,
          65520.0f,
          -70000.0f,
          5.96e-8f,
          2.98e-8f,
          2.99e-8f,
          6.1e-5f,
          3.389e38f,
          1.0f,
          -1.0f};
}

/// Sprinkles `count` special values at random positions of v.
inline void sprinkle(std::vector<float>& v, std::size_t count, std::mt19937_64& rng, bool allow_nan = true) {
  if (v.empty()) return;
  const auto sp = special_values();
  std::uniform_int_distribution<std::size_t> pos(0, v.size() - 1), which(0, sp.size() - 1);
  for (std::size_t c = 0; c < count; ++c) {
    float x = sp[which(rng)];
    if (!allow_nan && std::isnan(x)) x = 0.0f;
    v[pos(rng)] = x;
  }
}

/// Bit-equal, or both NaN.
inline bool same_float(float a, float b) {
  return float_to_bits(a) == float_to_bits(b) || (std::isnan(a) && std::isnan(b));
}

/// Index of the first float that differs ("NaN == NaN"), or -1.
inline long long first_float_mismatch(const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!same_float(a[i], b[i])) return static_cast<long long>(i);
  return -1;
}

inline std::string float_pair(float a, float b) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%a (0x%08x) vs %a (0x%08x)", static_cast<double>(a), float_to_bits(a),
                static_cast<double>(b), float_to_bits(b));
  return buf;
}

}  // namespace gz::test
