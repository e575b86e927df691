// fp16 and bf16: one 16-bit float per element (one template, two formats).
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "kernels/cast.h"
#include "kernels/cpu.h"
#if GZ_HAVE_CUDA
#include "compressors/cuda_codec.h"
#include "kernels/cuda.h"
#endif

namespace gz::codecs {
namespace {

template <class Fmt>
class CastCodec final : public Codec {
 public:
  using Codec::Codec;

 protected:
  EncodedBody encode_cpu(GradRef g, float* r, std::size_t n, std::byte* body, const ExecContext&) override {
    visit(g, [&](auto* gp) { kernels::cpu::cast_encode<Fmt>(gp, r, n, reinterpret_cast<std::uint16_t*>(body)); });
    return {0, 2 * n};
  }
  void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) override {
    kernels::cpu::cast_decode<Fmt>(reinterpret_cast<const std::uint16_t*>(p.body), begin, end, out, c);
  }
#if GZ_HAVE_CUDA
  std::size_t encode_cuda(GradRef g, float* r, std::size_t n, std::byte* payload, const ExecContext& ctx) override {
    visit(g, [&](auto* gp) {
      kernels::cuda::cast_encode<Fmt>(gp, r, n, reinterpret_cast<std::uint16_t*>(payload + wire::kHeaderBytes),
                                      cuda_codec::header_blob(id(), 0, n, 2 * n, payload), ctx.stream);
    });
    return wire::kHeaderBytes + 2 * n;
  }
  void decode_cuda(const std::byte* payload, std::size_t, const DecodeOut& out, std::size_t n, Combine c,
                   const ExecContext& ctx) override {
    kernels::cuda::cast_decode<Fmt>(reinterpret_cast<const std::uint16_t*>(payload + wire::kHeaderBytes), n, out, c,
                                    &ctx.status->code, ctx.stream);
  }
#endif
};

template <class Fmt>
std::unique_ptr<Codec> make(const CodecConfig& c) {
  return std::make_unique<CastCodec<Fmt>>(c);
}

template <class Fmt>
std::string describe_param(std::uint32_t, std::uint32_t param, std::uint64_t) {
  return std::string(Fmt::name) + " payload with non-zero param " + std::to_string(param);
}

constexpr std::string_view kFp16Tests[] = {"fp16", "fp16:ef=off"};
constexpr std::string_view kBf16Tests[] = {"bf16", "bf16:ef=off"};
constexpr BenchSpec kFp16Bench[] = {{"fp16", "fp16"}};
constexpr BenchSpec kBf16Bench[] = {{"bf16", "bf16"}};

}  // namespace

// Bounds: one rounding of the worker's values and one of each chunk's sum
// (half an ulp each: 2^-11 for fp16, 2^-8 for bf16), with room for the sums.
extern const CodecDescriptor fp16{
    .name = "fp16",
    .id = CodecId::Fp16,
    .summary = "2 bytes per element, IEEE binary16, round to nearest even, saturating",
    .make = make<kernels::HalfFormat>,
    .error_bound = [](const CodecConfig&) { return 1e-3; },
    .describe_param = describe_param<kernels::HalfFormat>,
    .test_specs = kFp16Tests,
    .bench_specs = kFp16Bench,
};

extern const CodecDescriptor bf16{
    .name = "bf16",
    .id = CodecId::Bf16,
    .summary = "2 bytes per element, bfloat16, round to nearest even, saturating",
    .make = make<kernels::BFloat16Format>,
    .error_bound = [](const CodecConfig&) { return 8e-3; },
    .describe_param = describe_param<kernels::BFloat16Format>,
    .test_specs = kBf16Tests,
    .bench_specs = kBf16Bench,
};

}  // namespace gz::codecs
