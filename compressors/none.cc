// none: fp32 as is. With it, a compressed allreduce is an exact allreduce.
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"
#if GZ_HAVE_CUDA
#include "compressors/cuda_codec.h"
#include "kernels/cuda.h"
#endif

namespace gz::codecs {
namespace {

class NoneCodec final : public Codec {
 public:
  using Codec::Codec;

 protected:
  EncodedBody encode_cpu(GradRef g, float* r, std::size_t n, std::byte* body, const ExecContext&) override {
    visit(g, [&](auto* gp) { kernels::cpu::copy_encode(gp, r, n, reinterpret_cast<float*>(body)); });
    return {0, 4 * n};
  }
  void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) override {
    kernels::cpu::copy_decode(reinterpret_cast<const float*>(p.body), begin, end, out, c);
  }
#if GZ_HAVE_CUDA
  std::size_t encode_cuda(GradRef g, float* r, std::size_t n, std::byte* payload, const ExecContext& ctx) override {
    visit(g, [&](auto* gp) {
      kernels::cuda::copy_encode(gp, r, n, reinterpret_cast<float*>(payload + wire::kHeaderBytes),
                                 cuda_codec::header_blob(id(), 0, n, 4 * n, payload), ctx.stream);
    });
    return wire::kHeaderBytes + 4 * n;
  }
  void decode_cuda(const std::byte* payload, std::size_t, const DecodeOut& out, std::size_t n, Combine c,
                   const ExecContext& ctx) override {
    kernels::cuda::copy_decode(reinterpret_cast<const float*>(payload + wire::kHeaderBytes), n, out, c,
                               &ctx.status->code, ctx.stream);
  }
#endif
};

std::string describe_param(std::uint32_t, std::uint32_t param, std::uint64_t) {
  return "none payload with non-zero param " + std::to_string(param);
}

constexpr std::string_view kTestSpecs[] = {"none"};
constexpr BenchSpec kBench[] = {{"none", "none"}};

}  // namespace

extern const CodecDescriptor none{
    .name = "none",
    .id = CodecId::None,
    .summary = "fp32 as is: the exact baseline",
    .lossless = true,
    .make = [](const CodecConfig& c) -> std::unique_ptr<Codec> { return std::make_unique<NoneCodec>(c); },
    // Only the summation order differs from an exact fp32 allreduce.
    .error_bound = [](const CodecConfig&) { return 1e-6; },
    .describe_param = describe_param,
    .test_specs = kTestSpecs,
    .bench_specs = kBench,
};

}  // namespace gz::codecs
