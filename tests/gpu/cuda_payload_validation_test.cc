// Malformed payloads on the GPU decode path: every one is rejected with the
// message the CPU path gives, `out` is left unchanged, in both verdict modes
// (synchronous throw, and a device status word), and a status that holds an
// error stops later decodes.
#include <functional>
#include <memory>

#include "compressors/codec.h"
#include "compressors/descriptor.h"
#include "compressors/wire_format.h"
#include "gpu_test_util.h"

namespace gz {
namespace {

using test::bare;
using test::DeviceBuffer;

struct Mutation {
  const char* name;
  std::function<void(std::vector<std::byte>& payload, std::size_t& bytes, std::size_t& n)> apply;
};

std::uint32_t get32(const std::vector<std::byte>& p, std::size_t off) {
  std::uint32_t v;
  std::memcpy(&v, p.data() + off, 4);
  return v;
}
void put32(std::vector<std::byte>& p, std::size_t off, std::uint32_t v) { std::memcpy(p.data() + off, &v, 4); }
std::uint64_t get64(const std::vector<std::byte>& p, std::size_t off) {
  std::uint64_t v;
  std::memcpy(&v, p.data() + off, 8);
  return v;
}
void put64(std::vector<std::byte>& p, std::size_t off, std::uint64_t v) { std::memcpy(p.data() + off, &v, 8); }

std::vector<Mutation> header_mutations() {
  using P = std::vector<std::byte>;
  return {
      {"truncated_by_1", [](P&, std::size_t& b, std::size_t&) { b -= 1; }},
      {"truncated_by_8", [](P&, std::size_t& b, std::size_t&) { b -= 8; }},
      {"header_only", [](P&, std::size_t& b, std::size_t&) { b = 32; }},
      {"below_header", [](P&, std::size_t& b, std::size_t&) { b = 31; }},
      {"empty", [](P&, std::size_t& b, std::size_t&) { b = 0; }},
      {"trailing_bytes", [](P& p, std::size_t& b, std::size_t&) { p.resize(b + 8, std::byte{0}), b += 8; }},
      {"bad_magic", [](P& p, std::size_t&, std::size_t&) { put32(p, 0, get32(p, 0) ^ 0x100u); }},
      {"bad_version", [](P& p, std::size_t&, std::size_t&) { put32(p, 4, (get32(p, 4) & 0xFFFF0000u) | 2u); }},
      {"unknown_codec", [](P& p, std::size_t&, std::size_t&) { put32(p, 4, (get32(p, 4) & 0xFFFFu) | ((kLastCodecId + 2u) << 16)); }},
      {"other_codec",
       [](P& p, std::size_t&, std::size_t&) {
         const std::uint32_t c = get32(p, 4) >> 16;
         put32(p, 4, (get32(p, 4) & 0xFFFFu) | ((c % kLastCodecId + 1) << 16));
       }},
      {"flags", [](P& p, std::size_t&, std::size_t&) { put32(p, 12, 4u); }},
      {"param_plus_1", [](P& p, std::size_t&, std::size_t&) { put32(p, 8, get32(p, 8) + 1); }},
      {"absurd_count", [](P& p, std::size_t&, std::size_t&) { put64(p, 16, std::uint64_t{1} << 41); }},
      {"count_plus_1", [](P& p, std::size_t&, std::size_t&) { put64(p, 16, get64(p, 16) + 1); }},
      {"count_minus_1", [](P& p, std::size_t&, std::size_t&) { put64(p, 16, get64(p, 16) - 1); }},
      {"body_bytes_plus_8", [](P& p, std::size_t&, std::size_t&) { put64(p, 24, get64(p, 24) + 8); }},
      {"decoder_n_plus_1", [](P&, std::size_t&, std::size_t& n) { n += 1; }},
      {"decoder_n_minus_1", [](P&, std::size_t&, std::size_t& n) { n -= 1; }},
  };
}

std::vector<Mutation> topk_mutations() {
  using P = std::vector<std::byte>;
  auto k_of = [](const P& p) { return std::size_t{get32(p, 8)}; };
  auto at = [](std::size_t j) { return 32 + 4 * j; };
  return {
      {"index_out_of_range", [=](P& p, std::size_t&, std::size_t& n) { put32(p, at(k_of(p) / 2), n); }},
      {"last_index_n", [=](P& p, std::size_t&, std::size_t& n) { put32(p, at(k_of(p) - 1), n); }},
      {"first_index_huge", [=](P& p, std::size_t&, std::size_t&) { put32(p, at(0), 0xFFFFFFFFu); }},
      {"index_repeated",
       [=](P& p, std::size_t&, std::size_t&) { put32(p, at(k_of(p) / 2), get32(p, at(k_of(p) / 2 - 1))); }},
      {"index_decreasing",
       [=](P& p, std::size_t&, std::size_t&) {
         const std::uint32_t a = get32(p, at(1)), b = get32(p, at(2));
         put32(p, at(1), b), put32(p, at(2), a);
       }},
      {"two_bad_entries",  // the lower one is named
       [=](P& p, std::size_t&, std::size_t& n) {
         put32(p, at(k_of(p) - 2), n + 5);
         put32(p, at(3), 0);
       }},
  };
}

class CudaPayloadValidation : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { GZ_REQUIRE_GPU(); }
};

TEST_P(CudaPayloadValidation, RejectedLikeTheCpuAndOutUnchanged) {
  const std::string spec = GetParam();
  const std::size_t n0 = 1000;
  auto codec = make_codec(spec);
  std::mt19937_64 rng(test::test_seed() + 5);
  const std::vector<float> g = test::gaussian(n0, rng);
  DeviceBuffer<float> dg(g), dr(std::vector<float>(n0, 0.0f));
  DeviceBuffer<std::byte> enc(codec->max_payload_bytes(n0));
  // Mutations may raise n by one: size the workspaces for that.
  const test::CudaWorkspace ws(*codec, n0 + 1);
  std::vector<std::byte> host_ws(codec->workspace_bytes(n0 + 1, Device::Cpu));
  const std::size_t valid_bytes = codec->encode(dg.get(), codec->error_feedback() ? dr.get() : nullptr, n0, enc.get(),
                                                enc.size(), ws.ctx());
  const std::vector<std::byte> valid = enc.download(valid_bytes);

  std::vector<Mutation> mutations = header_mutations();
  if (codec->descriptor().hint.sparse)  // index checks
    for (auto& m : topk_mutations()) mutations.push_back(m);

  cudaStream_t stream;
  GZ_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const Mutation& m : mutations) {
    SCOPED_TRACE(spec + " / " + m.name);
    std::vector<std::byte> bad = valid;
    std::size_t bytes = valid_bytes, n = n0;
    m.apply(bad, bytes, n);
    if (bad.size() < bytes) bad.resize(bytes);

    // The CPU path's verdict and message.
    std::string cpu_msg;
    std::vector<float> host_out(n + 1, 2.0f);
    try {
      codec->decode_accumulate(bad.data(), bytes, host_out.data(), n,
                               {Device::Cpu, nullptr, host_ws.data(), host_ws.size()});
    } catch (const PayloadError& e) {
      cpu_msg = bare(e.what());
    }
    ASSERT_FALSE(cpu_msg.empty()) << "the CPU decoder accepted the mutated payload";

    // A device copy of exactly `bytes` bytes (+ slack so a wrong read would be
    // inside the allocation and show only as a wrong result, never hidden).
    DeviceBuffer<std::byte> payload(std::max<std::size_t>(bad.size(), 1));
    payload.upload(bad);
    std::mt19937_64 orng(test::test_seed() + 9);
    const std::vector<float> out0 = test::gaussian(n + 1, orng);
    DeviceBuffer<float> out(out0);

    // Synchronous verdict: the same PayloadError, out unchanged.
    std::string gpu_msg;
    try {
      codec->decode_accumulate(payload.get(), bytes, out.get(), n, ws.ctx(stream));
    } catch (const PayloadError& e) {
      gpu_msg = bare(e.what());
    }
    EXPECT_EQ(gpu_msg, cpu_msg);
    const auto after = out.download();
    ASSERT_EQ(test::first_float_mismatch(after.data(), out0.data(), n + 1), -1) << "out was modified";

    // In a sum, after a valid payload whose overwrite would change out: the
    // same verdict, and out still unchanged.
    if (n == n0) {
      DeviceBuffer<std::byte> good(valid_bytes);
      good.upload(valid);
      const PayloadRef refs[2] = {{good.get(), valid_bytes}, {payload.get(), bytes}};
      std::string sum_msg;
      try {
        codec->decode_sum(refs, out.get(), n, 0.5f, ws.ctx(stream));
      } catch (const PayloadError& e) {
        sum_msg = bare(e.what());
      }
      EXPECT_EQ(sum_msg, cpu_msg);
      const auto after_sum = out.download();
      ASSERT_EQ(test::first_float_mismatch(after_sum.data(), out0.data(), n + 1), -1) << "decode_sum modified out";

      // A bfloat16 out, which the decodes write in the same pass: the same
      // verdict, alone and in the sum, and out unchanged.
      std::vector<std::uint16_t> out16_0(n);
      for (std::size_t i = 0; i < n; ++i) out16_0[i] = kernels::bf16_from_float_rne(out0[i]);
      DeviceBuffer<std::uint16_t> out16(out16_0);
      DeviceBuffer<std::byte> ws16(codec->workspace_bytes(n, Device::Cuda, Dtype::BFloat16));
      const ExecContext ctx16{Device::Cuda, stream, ws16.get(), ws16.size()};
      for (const bool in_sum : {false, true}) {
        std::string msg16;
        try {
          if (in_sum)
            codec->decode_sum(refs, out16.get(), Dtype::BFloat16, n, 0.5f, ctx16);
          else
            codec->decode_accumulate(payload.get(), bytes, out16.get(), Dtype::BFloat16, n, ctx16);
        } catch (const PayloadError& e) {
          msg16 = bare(e.what());
        }
        EXPECT_EQ(msg16, cpu_msg) << (in_sum ? "bfloat16 decode_sum" : "bfloat16 decode");
        ASSERT_EQ(out16.download(), out16_0) << (in_sum ? "bfloat16 decode_sum" : "bfloat16 decode") << " modified out";
      }
    }

    // Status-word verdict: no throw unless the host alone can tell.
    DeviceBuffer<PayloadStatus> status(1);
    status.fill_bytes(0);
    const ExecContext async = ws.ctx(stream, status.get());
    bool threw_at_call = false;
    try {
      codec->decode_accumulate(payload.get(), bytes, out.get(), n, async);
    } catch (const PayloadError& e) {
      threw_at_call = true;
      EXPECT_EQ(bare(e.what()), cpu_msg);
    }
    EXPECT_EQ(threw_at_call, bytes < wire::kHeaderBytes);
    if (!threw_at_call) {
      std::string status_msg;
      try {
        check_payload_status(status.get(), stream);
      } catch (const PayloadError& e) {
        status_msg = bare(e.what());
      }
      EXPECT_EQ(status_msg, cpu_msg);
      // Sticky: a valid payload decoded with the same status does nothing.
      payload.upload(valid);
      codec->decode_accumulate(payload.get(), valid_bytes, out.get(), n0, async);
      EXPECT_THROW(check_payload_status(status.get(), stream), PayloadError);
    }
    const auto after_async = out.download();
    ASSERT_EQ(test::first_float_mismatch(after_async.data(), out0.data(), n + 1), -1) << "out was modified";
  }
  GZ_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Every registered codec's test specs.
std::vector<std::string> registry_specs() {
  std::vector<std::string> specs;
  for (const CodecDescriptor* d : all_codecs())
    for (std::string_view s : d->test_specs) specs.emplace_back(s);
  return specs;
}

INSTANTIATE_TEST_SUITE_P(Codecs, CudaPayloadValidation, ::testing::ValuesIn(registry_specs()),
                         [](const auto& param_info) {
                           std::string s = param_info.param;
                           for (auto& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// Decoding a valid payload in status mode leaves the status clean, and many
// payloads can share one status (the allreduce pattern) without a sync.
TEST(CudaPayloadStatus, ValidPayloadsShareOneStatus) {
  GZ_REQUIRE_GPU();
  const std::size_t n = 5000;
  auto codec = make_codec("topk:density=0.1,ef=off");
  DeviceBuffer<PayloadStatus> status(1);
  status.fill_bytes(0);
  const test::CudaWorkspace ws(*codec, n);
  const ExecContext ctx = ws.ctx(nullptr, status.get());
  DeviceBuffer<float> out(std::vector<float>(n, 0.0f));
  std::vector<float> want(n, 0.0f);
  for (int rank = 0; rank < 4; ++rank) {
    std::mt19937_64 rng(test::test_seed() + rank);
    const std::vector<float> g = test::gaussian(n, rng);
    DeviceBuffer<float> dg(g);
    DeviceBuffer<std::byte> payload(codec->max_payload_bytes(n));
    const std::size_t bytes = codec->encode(dg.get(), nullptr, n, payload.get(), payload.size(), ws.ctx());
    codec->decode_accumulate(payload.get(), bytes, out.get(), n, ctx);
    const auto host = payload.download(bytes);
    auto cpu = make_codec("topk:density=0.1,ef=off");
    std::vector<std::byte> host_ws(cpu->workspace_bytes(n, Device::Cpu));
    cpu->decode_accumulate(host.data(), bytes, want.data(), n, {Device::Cpu, nullptr, host_ws.data(), host_ws.size()});
  }
  EXPECT_NO_THROW(check_payload_status(status.get(), nullptr));
  const auto got = out.download();
  EXPECT_EQ(test::first_float_mismatch(got.data(), want.data(), n), -1);
}

}  // namespace
}  // namespace gz
