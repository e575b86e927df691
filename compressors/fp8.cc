// fp8: one 8-bit float per element (e4m3 or e5m2) with a scale per block
// (kernels/fp8.h).
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "kernels/fp8.h"
#if GZ_HAVE_CUDA
#include "compressors/cuda_codec.h"
#endif

namespace gz::codecs {
namespace {

using kernels::Fp8Layout;

// Key indices (kKeys below); format choice 0 is e4m3 (4 exponent bits), 1 e5m2.
constexpr std::size_t kFormat = 0, kBlock = 1;

std::uint32_t exp_bits(const CodecConfig& c) { return c.values[kFormat] == 0 ? 4u : 5u; }

class Fp8Codec final : public Codec {
 public:
  explicit Fp8Codec(const CodecConfig& c)
      : Codec(c), exp_bits_(codecs::exp_bits(c)), block_(static_cast<std::uint32_t>(c.values[kBlock])) {}

  std::uint32_t header_param(std::size_t) const override { return kernels::fp8_param(exp_bits_, block_); }

 protected:
  EncodedBody encode_cpu(GradRef g, float* r, std::size_t n, std::byte* body, const ExecContext&) override {
    const std::uint32_t param = header_param(n);
    visit(g, [&](auto* gp) {
      kernels::cpu::fp8_encode(gp, r, n, exp_bits_, block_, reinterpret_cast<float*>(body),
                               reinterpret_cast<std::uint8_t*>(body + Fp8Layout::codes_offset(param, n)));
    });
    return {param, Fp8Layout::body_bytes(param, n)};
  }
  void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) override {
    kernels::cpu::fp8_decode(reinterpret_cast<const float*>(p.body),
                             reinterpret_cast<const std::uint8_t*>(p.body + Fp8Layout::codes_offset(p.param, p.count)),
                             kernels::fp8_exp_bits(p.param), kernels::fp8_block(p.param), begin, end, out, c);
  }
#if GZ_HAVE_CUDA
  std::size_t encode_cuda(GradRef g, float* r, std::size_t n, std::byte* payload, const ExecContext& ctx) override {
    const std::uint32_t param = header_param(n);
    std::byte* body = payload + wire::kHeaderBytes;
    const std::uint64_t body_bytes = Fp8Layout::body_bytes(param, n);
    visit(g, [&](auto* gp) {
      kernels::cuda::fp8_encode(gp, r, n, exp_bits_, block_, reinterpret_cast<float*>(body),
                                reinterpret_cast<std::uint8_t*>(body + Fp8Layout::codes_offset(param, n)),
                                cuda_codec::header_blob(id(), param, n, body_bytes, payload), ctx.stream);
    });
    return wire::kHeaderBytes + body_bytes;
  }
  // Runs only when the size matched max_payload_bytes(n), i.e. this codec's format and block.
  void decode_cuda(const std::byte* payload, std::size_t, const DecodeOut& out, std::size_t n, Combine c,
                   const ExecContext& ctx) override {
    const std::byte* body = payload + wire::kHeaderBytes;
    kernels::cuda::fp8_decode(reinterpret_cast<const float*>(body),
                              reinterpret_cast<const std::uint8_t*>(body + Fp8Layout::codes_offset(header_param(n), n)),
                              n, exp_bits_, block_, out, c, &ctx.status->code, ctx.stream);
  }
#endif

 private:
  std::uint32_t exp_bits_, block_;
};

constexpr std::string_view kFormats[] = {"e4m3", "e5m2"};
constexpr CodecKey kKeys[] = {
    {.name = "format", .kind = CodecKey::Kind::Choice, .fallback = 0, .choices = kFormats, .always_shown = true},
    {.name = "block", .fallback = kernels::kFp8DefaultBlock, .lo = 1, .hi = kernels::kFp8MaxBlock,
     .range = "in [1, 2^24 - 1]", .always_shown = true},
};

// Relative error of one allreduce, scatter_reduce (two conversions): half an
// ulp is 2^-4 (e4m3) or 2^-3 (e5m2) of a value at most; on average about a
// third of that per conversion. The bounds leave a factor of two and more.
double error_bound(const CodecConfig& c) { return exp_bits(c) == 4 ? 0.1 : 0.2; }

std::string describe_param(std::uint32_t reason, std::uint32_t param, std::uint64_t) {
  if (reason == 1)
    return "fp8 payload with " + std::to_string(kernels::fp8_exp_bits(param)) +
           " exponent bits (valid: 4 for e4m3, 5 for e5m2)";
  return "fp8 payload with block size 0";
}

// Both formats, blocks that are and are not multiples of 32 (the lanes and
// the tail), one element per block.
constexpr std::string_view kTestSpecs[] = {"fp8:format=e4m3,block=512", "fp8:format=e5m2,block=512",
                                           "fp8:format=e4m3,block=100", "fp8:format=e5m2,block=7",
                                           "fp8:format=e4m3,block=1",   "fp8:format=e5m2,block=4096,ef=off"};
constexpr BenchSpec kBench[] = {{"fp8", "fp8:format=e4m3,block=512"}, {"fp8_e5m2", "fp8:format=e5m2,block=512"}};

}  // namespace

extern const CodecDescriptor fp8{
    .name = "fp8",
    .id = CodecId::Fp8,
    .summary = "1 byte per element, an 8-bit float (e4m3 or e5m2, round to nearest even, saturating) + one scale "
               "per block of S that maps the block's largest |v| to the format's largest value",
    .keys = kKeys,
    .make = [](const CodecConfig& c) -> std::unique_ptr<Codec> { return std::make_unique<Fp8Codec>(c); },
    .error_bound = error_bound,
    // Segments of whole blocks encode exactly as the whole buffer does.
    .segment_granule = [](const CodecConfig& c) { return static_cast<std::uint64_t>(c.values[kBlock]); },
    .describe_param = describe_param,
    .test_specs = kTestSpecs,
    .bench_specs = kBench,
};

}  // namespace gz::codecs
