// The device-side header check (check_header, compiled for host and device)
// against the CPU checks it mirrors (wire::read_header + wire::expect): same
// verdict and same message on many random and mutated headers. Runs on the
// host, so it needs no GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/error.h"
#include "compressors/payload_status.h"
#include "compressors/wire_format.h"
#include "gpu_test_util.h"

namespace gz {
namespace {

using test::bare;

TEST(PayloadHeaderCheck, AgreesWithTheCpuChecks) {
  std::mt19937_64 rng(test::test_seed());
  auto pick = [&](std::initializer_list<std::uint64_t> xs) {
    std::uniform_int_distribution<std::size_t> d(0, xs.size() - 1);
    return *(xs.begin() + d(rng));
  };
  std::uniform_int_distribution<int> coin(0, 9);
  std::size_t rejected = 0, accepted = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    wire::Header h;
    // Every registered codec, and ids no codec has.
    h.codec = static_cast<CodecId>(coin(rng) == 0 ? pick({0, kLastCodecId + 1u, 0xFFFF}) : 1 + rng() % kLastCodecId);
    h.count = pick({0, 1, 31, 1000, 4097, 0xFFFFFFFFull, 0x100000000ull, std::uint64_t{1} << 40,
                    (std::uint64_t{1} << 40) + 1, ~std::uint64_t{0}});
    const auto codec = static_cast<std::uint32_t>(h.codec);
    // Params that some codec takes (a block, a count, a format byte over a block) and some none does.
    h.param = static_cast<std::uint32_t>(pick({0, 0, 1, 7, 32, 512, 1000, (4u << 24) | 512, (8u << 24) | 100,
                                               (5u << 24) | 64, (2u << 24) | 1, (9u << 24) | 512, 4u << 24}));
    if (coin(rng) < 3) h.param = static_cast<std::uint32_t>(std::min<std::uint64_t>(h.count, pick({0, 1, 10, 1000})));
    if (coin(rng) == 0) h.param = static_cast<std::uint32_t>(pick({0, 1, 2, 0xFFFFFFFFull}));
    if (coin(rng) == 0) h.magic ^= 1u << pick({0, 8, 31});
    if (coin(rng) == 0) h.version = static_cast<std::uint16_t>(pick({0, 2, 0xFFFF}));
    if (coin(rng) == 0) h.flags = static_cast<std::uint32_t>(pick({1, 0x80000000ull}));
    const bool known = codec >= 1 && codec <= kLastCodecId && wire::check_param(codec, h.param, h.count) == 0;
    h.body_bytes = known ? wire::body_bytes(static_cast<CodecId>(codec), h.param, h.count) : 0;
    if (coin(rng) == 0) h.body_bytes += pick({1, 8, ~std::uint64_t{0}});
    std::uint64_t size = 32 + h.body_bytes;
    if (coin(rng) == 0) size = pick({32, 33, 40, 1u << 20});
    if (size < 32) size = 32;  // the host rejects shorter payloads before any check

    const auto want_codec = static_cast<CodecId>(coin(rng) < 8 && known ? codec : 1 + rng() % kLastCodecId);
    const std::uint64_t want_count = coin(rng) < 8 ? h.count : h.count + 1;
    const bool fixed = coin(rng) < 7;
    const std::uint32_t want_param = coin(rng) < 8 ? h.param : h.param + 1;

    std::byte buf[32];
    wire::write_header(h, buf);
    std::string cpu_msg;
    try {
      const wire::Header r = wire::read_header(buf, size);  // reads 32 bytes; `size` is what it checks
      wire::expect(r, want_codec, want_count, fixed ? &want_param : nullptr);
    } catch (const PayloadError& e) {
      cpu_msg = bare(e.what());
    }
    std::uint32_t words[8];
    std::memcpy(words, buf, 32);
    const HeaderVerdict v =
        check_header(words, size, static_cast<std::uint32_t>(want_codec), want_count, fixed, want_param);
    ASSERT_EQ(cpu_msg.empty(), v.code == PayloadCheck::Ok) << "cpu: '" << cpu_msg << "', device check code "
                                                           << static_cast<int>(v.code);
    if (!cpu_msg.empty()) {
      PayloadStatus s{};
      s.code = static_cast<std::uint32_t>(v.code);
      for (int i = 0; i < 3; ++i) s.detail[i] = v.detail[i];
      ASSERT_EQ(describe(s), cpu_msg);
      try {
        throw_if_failed(s);
        ADD_FAILURE() << "throw_if_failed did not throw";
      } catch (const PayloadError& e) {
        EXPECT_EQ(bare(e.what()), cpu_msg);
      }
      ++rejected;
    } else {
      ++accepted;
    }
  }
  EXPECT_GT(accepted, 1000u);  // both verdicts were exercised
  EXPECT_GT(rejected, 1000u);
}

TEST(PayloadHeaderCheck, TopkIndexMessagesMatchTheCpu) {
  const std::uint32_t idx_range[] = {1, 5, 9};
  const std::uint32_t idx_order[] = {1, 5, 5};
  for (const auto* idx : {idx_range, idx_order}) {
    std::string cpu_msg;
    try {
      wire::check_topk_indices(idx, 3, 9);
    } catch (const PayloadError& e) {
      cpu_msg = bare(e.what());
    }
    PayloadStatus s{};
    if (idx[2] >= 9) {
      s.code = static_cast<std::uint32_t>(PayloadCheck::TopkIndexRange);
      s.detail[0] = 2, s.detail[1] = idx[2], s.detail[2] = 9;
    } else {
      s.code = static_cast<std::uint32_t>(PayloadCheck::TopkIndexOrder);
      s.detail[0] = 2, s.detail[1] = idx[1], s.detail[2] = idx[2];
    }
    EXPECT_EQ(describe(s), cpu_msg);
  }
}

TEST(PayloadHeaderCheck, CleanStatusDoesNotThrow) {
  PayloadStatus s{};
  EXPECT_EQ(describe(s), "");
  EXPECT_NO_THROW(throw_if_failed(s));
}

}  // namespace
}  // namespace gz
