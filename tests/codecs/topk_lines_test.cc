// The line primitives of top-k's CPU passes (kernels/topk_lines_cpu.h), in
// whichever instruction set this build compiled (AVX-512, AVX2 or the
// portable loops), lane by lane against topk_key and a scalar compress.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/topk_lines_cpu.h"

namespace gz {
namespace {

namespace line = kernels::cpu::topk_line;
constexpr std::size_t W = line::kWidth;

// Bit patterns around every class boundary of the key: zeros, denormals,
// the largest finite value, infinities, NaNs of assorted payloads and signs.
std::vector<std::uint32_t> edge_bits() {
  std::vector<std::uint32_t> out;
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t mag : {0u, 1u, 0x007FFFFFu, 0x00800000u, 0x3F800000u, 0x7F7FFFFFu, 0x7F800000u, 0x7F800001u,
                              0x7FA00000u, 0x7FC00000u, 0x7FFFFFFEu, 0x7FFFFFFFu})
      out.push_back(sign | mag);
  }
  return out;
}

// Lines of values: the edge patterns in every lane position, then random bits.
std::vector<std::vector<float>> test_lines() {
  std::vector<std::uint32_t> pool = edge_bits();
  std::mt19937 rng(7);
  for (int j = 0; j < 4000; ++j) pool.push_back(static_cast<std::uint32_t>(rng()));
  std::vector<std::vector<float>> lines;
  for (std::size_t start = 0; start < pool.size(); start += 3) {
    std::vector<float> v(W);
    for (std::size_t b = 0; b < W; ++b) v[b] = std::bit_cast<float>(pool[(start + b) % pool.size()]);
    lines.push_back(v);
  }
  return lines;
}

TEST(TopkLines, KeysAndMasksMatchTheElementFunction) {
  RecordProperty("isa", line::kIsa);  // which twin this build exercised, in the XML report
  std::vector<std::uint32_t> bounds = {0u, 1u, 0x3F800000u, 0x7F7FFFFFu, 0x7F800000u, 0x7FFFFFFFu};
  for (std::uint32_t b : edge_bits()) bounds.push_back(kernels::topk_key(std::bit_cast<float>(b)));
  for (const auto& v : test_lines()) {
    const line::Words keys = line::keys(line::load(v.data()));
    for (std::uint32_t bound : bounds) {
      std::uint32_t ge = 0, gt = 0, eq = 0;
      for (std::size_t b = 0; b < W; ++b) {
        const std::uint32_t key = kernels::topk_key(v[b]);
        ge |= static_cast<std::uint32_t>(key >= bound) << b;
        gt |= static_cast<std::uint32_t>(key > bound) << b;
        eq |= static_cast<std::uint32_t>(key == bound) << b;
      }
      ASSERT_EQ(line::mask_ge(keys, bound), ge) << std::hex << bound << " " << std::bit_cast<std::uint32_t>(v[0]);
      ASSERT_EQ(line::mask_gt(keys, bound), gt) << std::hex << bound;
      ASSERT_EQ(line::mask_eq(keys, bound), eq) << std::hex << bound;
    }
  }
}

TEST(TopkLines, CompressKeepsTheSelectedLanesInOrder) {
  std::vector<float> v(W);
  for (std::size_t b = 0; b < W; ++b) v[b] = std::bit_cast<float>(0x7FC00000u + static_cast<std::uint32_t>(b));
  const line::Values values = line::load(v.data());
  const line::Words index = line::iota(1000);
  for (std::uint32_t mask = 0; mask < (1u << W); ++mask) {
    std::uint32_t idx[W];
    float val[W];
    line::compress_store(mask, index, values, idx, val);
    std::size_t out = 0;
    for (std::size_t b = 0; b < W; ++b) {
      if (!(mask >> b & 1u)) continue;
      ASSERT_EQ(idx[out], 1000 + b) << "mask " << mask << " entry " << out;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(val[out]), std::bit_cast<std::uint32_t>(v[b])) << "mask " << mask;
      ++out;
    }
    ASSERT_EQ(line::popcount(mask), out);
  }
}

TEST(TopkLines, LoadsStoresAndAddsWholeLines) {
  std::vector<float> a(W), b(W), sum(W);
  for (std::size_t j = 0; j < W; ++j) a[j] = 0.5f * static_cast<float>(j), b[j] = -3.0f + static_cast<float>(j * j);
  line::store(sum.data(), line::add(line::load(a.data()), line::load(b.data())));
  for (std::size_t j = 0; j < W; ++j) EXPECT_EQ(sum[j], a[j] + b[j]) << j;
  std::vector<std::uint32_t> words(W);
  for (std::size_t j = 0; j < W; ++j) words[j] = 0x9E3779B9u * static_cast<std::uint32_t>(j + 1);
  std::uint32_t idx[W];
  float val[W];
  line::compress_store((1u << W) - 1, line::load(words.data()), line::load(a.data()), idx, val);
  for (std::size_t j = 0; j < W; ++j) EXPECT_EQ(idx[j], words[j]) << j;
}

}  // namespace
}  // namespace gz
