// A fuzzer in the normal build: thousands of random and mutated payloads go
// through every decoder. Each must be accepted or rejected with a gz error;
// a rejected one must leave the output untouched. (tests/fuzz/ holds the
// coverage-guided libFuzzer twin.)
#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "compressors/wire_format.h"
#include "test_util.h"

namespace gz {
namespace {

TEST(PayloadFuzz, RandomAndMutatedPayloadsNeverCrash) {
  std::mt19937_64 rng(20261123);
  std::size_t accepted = 0, rejected = 0;
  for (const std::string& spec : test::all_specs()) {
    auto codec = make_codec(spec);
    for (int iter = 0; iter < 600; ++iter) {
      const std::size_t n = rng() % 300;
      const auto g = test::normal(n, rng());
      std::vector<float> r(n, 0.0f);
      test::Encoded e = test::encode(*codec, g, &r);
      std::size_t size = e.bytes;
      e.storage.resize(e.storage.size() + 8, 0);
      auto* bytes = reinterpret_cast<std::uint8_t*>(e.data());
      switch (iter % 6) {
        case 0:  // flip random bits anywhere
          for (int f = 0; f < 1 + static_cast<int>(rng() % 4); ++f) bytes[rng() % size] ^= 1u << (rng() % 8);
          break;
        case 1:  // overwrite a header word with a random value
          reinterpret_cast<std::uint32_t*>(bytes)[rng() % 8] = static_cast<std::uint32_t>(rng());
          break;
        case 2:  // truncate or extend
          size = rng() % (size + 9);
          break;
        case 3:  // garbage from the start
          for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::uint8_t>(rng());
          break;
        case 4:  // small header field tweaks: count, param, body size off by one
          reinterpret_cast<std::uint32_t*>(bytes)[2 + 2 * (rng() % 3)] += (rng() % 2) ? 1u : 0xFFFFFFFFu;
          break;
        case 5:  // corrupt the body only (indices for topk)
          if (size > 32) bytes[32 + rng() % (size - 32)] = static_cast<std::uint8_t>(rng());
          break;
      }
      std::vector<float> out(n, 7.0f);
      try {
        test::decode_into(*codec, e.data(), size, out.data(), n);
        ++accepted;
      } catch (const PayloadError&) {
        ++rejected;
        for (float x : out) ASSERT_EQ(x, 7.0f) << spec << ": rejected payload modified the output";
      }
    }
  }
  // Both outcomes must occur, or the mutations are not exercising the decoder.
  EXPECT_GT(accepted, 500u);
  EXPECT_GT(rejected, 1500u);
}

}  // namespace
}  // namespace gz
