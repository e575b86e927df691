// Helpers shared by the codec tests: seeded inputs, edge values, encode/decode
// round trips through the public Codec interface.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/descriptor.h"

namespace gz::test {

/// Every codec spec the suite runs over: each registered codec's test specs.
inline const std::vector<std::string>& all_specs() {
  static const std::vector<std::string> specs = [] {
    std::vector<std::string> out;
    for (const CodecDescriptor* d : all_codecs())
      for (std::string_view s : d->test_specs) out.emplace_back(s);
    return out;
  }();
  return specs;
}

inline std::vector<float> normal(std::size_t n, std::uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Values the codecs must treat with care.
inline std::vector<float> edge_values() {
  using L = std::numeric_limits<float>;
  return {0.0f,         -0.0f,       L::denorm_min(), -L::denorm_min(), 1e-40f,  -3e-39f,
          L::min(),     -L::min(),   1.0f,            -1.0f,            65504.0f, 65519.0f,
          65520.0f,     -70000.0f,   1e6f,            -1e30f,           L::max(), -L::max(),
          5.96e-8f,     2.98e-8f,    2.9802322e-8f,   6.1035156e-5f,    0.1f,     -0.33333334f};
}

/// A buffer holding one encoded payload, aligned for the codec.
struct Encoded {
  std::vector<std::uint64_t> storage;  // 8-byte aligned backing store
  std::size_t bytes = 0;
  std::byte* data() { return reinterpret_cast<std::byte*>(storage.data()); }
  const std::byte* data() const { return reinterpret_cast<const std::byte*>(storage.data()); }
};

/// A host workspace for calls on n elements (CUB's two phases: size, then call).
struct HostWorkspace {
  std::vector<std::byte> bytes;
  HostWorkspace(const Codec& codec, std::size_t n) : bytes(codec.workspace_bytes(n, Device::Cpu)) {}
  ExecContext ctx() { return ExecContext{Device::Cpu, nullptr, bytes.data(), bytes.size()}; }
};

inline Encoded encode(Codec& codec, const std::vector<float>& g, std::vector<float>* residual) {
  Encoded e;
  const std::size_t cap = codec.max_payload_bytes(g.size());
  e.storage.assign(cap / 8 + 1, 0);
  HostWorkspace ws(codec, g.size());
  e.bytes = codec.encode(g.data(), residual ? residual->data() : nullptr, g.size(), e.data(), cap, ws.ctx());
  return e;
}

/// out[0..n) += the decoded payload of `bytes` bytes.
inline void decode_into(Codec& codec, const std::byte* payload, std::size_t bytes, float* out, std::size_t n) {
  HostWorkspace ws(codec, n);
  codec.decode_accumulate(payload, bytes, out, n, ws.ctx());
}

inline std::vector<float> decode(Codec& codec, const Encoded& e, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  decode_into(codec, e.data(), e.bytes, out.data(), n);
  return out;
}

/// Decodes and expects a PayloadError mentioning `what`; out must stay untouched.
inline void expect_rejected(Codec& codec, const Encoded& e, std::size_t bytes, std::size_t n,
                            const std::string& what) {
  std::vector<float> out(n, 42.0f);
  try {
    decode_into(codec, e.data(), bytes, out.data(), n);
    ADD_FAILURE() << "payload accepted, expected an error mentioning '" << what << "'";
  } catch (const PayloadError& err) {
    EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
  }
  for (float x : out) ASSERT_EQ(x, 42.0f) << "output modified by a rejected payload";
}

/// A copy of a payload with another header param.
inline Encoded with_param(Encoded e, std::uint32_t param) {
  std::memcpy(e.data() + 8, &param, sizeof param);
  return e;
}

/// The message parse_spec throws for `spec` ("" when it parses).
inline std::string spec_error(std::string_view spec) {
  try {
    parse_spec(spec);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

/// The size of the payload of n normal values (fresh residual).
inline std::size_t payload_bytes(Codec& codec, std::size_t n) {
  std::vector<float> r(n, 0.0f);
  return encode(codec, normal(n, 5), &r).bytes;
}

/// Sum over steps of decoded payloads minus sum of gradients (gradients with a
/// bias of +0.05 that compression without error feedback may lose): its
/// largest magnitude over all steps, and over the first half.
struct Drift {
  double worst = 0.0, at_half = 0.0;
};
inline Drift drift_over_steps(Codec& codec, std::size_t n = 4096, std::size_t steps = 300) {
  std::vector<float> r(n, 0.0f);
  std::vector<double> sum_g(n, 0.0), sum_d(n, 0.0);
  Drift out;
  for (std::size_t t = 1; t <= steps; ++t) {
    auto g = normal(n, 1000 + t);
    for (auto& x : g) x += 0.05f;
    const auto d = decode(codec, encode(codec, g, codec.error_feedback() ? &r : nullptr), n);
    double drift = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      sum_g[i] += g[i], sum_d[i] += d[i];
      drift = std::max(drift, std::fabs(sum_d[i] - sum_g[i]));
    }
    out.worst = std::max(out.worst, drift);
    if (t == steps / 2) out.at_half = out.worst;
  }
  return out;
}

/// Bitwise equality that treats every NaN as equal to every NaN.
inline bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

}  // namespace gz::test
