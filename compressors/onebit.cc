// onebit: sign bits plus two reconstruction values per block (kernels/onebit.h).
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"
#if GZ_HAVE_CUDA
#include "compressors/cuda_codec.h"
#include "kernels/cuda.h"
#endif

namespace gz::codecs {
namespace {

using kernels::OnebitLayout;
using kernels::OnebitScales;

class OnebitCodec final : public Codec {
 public:
  explicit OnebitCodec(const CodecConfig& c) : Codec(c), block_(static_cast<std::uint32_t>(c.value("block"))) {}
  std::uint32_t header_param(std::size_t) const override { return block_; }

 protected:
  EncodedBody encode_cpu(GradRef g, float* r, std::size_t n, std::byte* body, const ExecContext&) override {
    auto* scales = reinterpret_cast<OnebitScales*>(body);
    auto* bits = reinterpret_cast<std::uint32_t*>(body + OnebitLayout::words_offset(block_, n));
    visit(g, [&](auto* gp) { kernels::cpu::onebit_encode(gp, r, n, block_, scales, bits); });
    return {block_, OnebitLayout::body_bytes(block_, n)};
  }
  void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) override {
    const auto* scales = reinterpret_cast<const OnebitScales*>(p.body);
    const auto* bits = reinterpret_cast<const std::uint32_t*>(p.body + OnebitLayout::words_offset(p.param, p.count));
    kernels::cpu::onebit_decode(scales, bits, p.param, begin, end, out, c);
  }
#if GZ_HAVE_CUDA
  std::size_t encode_cuda(GradRef g, float* r, std::size_t n, std::byte* payload, const ExecContext& ctx) override {
    std::byte* body = payload + wire::kHeaderBytes;
    const std::uint64_t body_bytes = OnebitLayout::body_bytes(block_, n);
    visit(g, [&](auto* gp) {
      kernels::cuda::onebit_encode(gp, r, n, block_, reinterpret_cast<OnebitScales*>(body),
                                   reinterpret_cast<std::uint32_t*>(body + OnebitLayout::words_offset(block_, n)),
                                   cuda_codec::header_blob(id(), block_, n, body_bytes, payload), ctx.stream);
    });
    return wire::kHeaderBytes + body_bytes;
  }
  // Runs only when the size matched max_payload_bytes(n), i.e. this codec's block.
  void decode_cuda(const std::byte* payload, std::size_t, const DecodeOut& out, std::size_t n, Combine c,
                   const ExecContext& ctx) override {
    const std::byte* body = payload + wire::kHeaderBytes;
    kernels::cuda::onebit_decode(reinterpret_cast<const OnebitScales*>(body),
                                 reinterpret_cast<const std::uint32_t*>(body + OnebitLayout::words_offset(block_, n)),
                                 n, block_, out, c, &ctx.status->code, ctx.stream);
  }
#endif

 private:
  std::uint32_t block_;
};

constexpr CodecKey kKeys[] = {
    {.name = "block", .fallback = kernels::kOnebitDefaultBlock, .lo = 1, .hi = 1u << 30, .range = "in [1, 2^30]",
     .always_shown = true},
};

std::string describe_param(std::uint32_t, std::uint32_t, std::uint64_t) { return "onebit payload with block size 0"; }

// Block sizes: the default, one that straddles sign words, one element per block.
constexpr std::string_view kTestSpecs[] = {"onebit:block=512", "onebit:block=100", "onebit:block=1",
                                           "onebit:block=8", "onebit:block=64,ef=off"};
constexpr BenchSpec kBench[] = {{"onebit", "onebit:block=512"}};

}  // namespace

extern const CodecDescriptor onebit{
    .name = "onebit",
    .id = CodecId::Onebit,
    .summary = "1 sign bit per element + the means of the non-negative and negative values per block of B",
    .keys = kKeys,
    .make = [](const CodecConfig& c) -> std::unique_ptr<Codec> { return std::make_unique<OnebitCodec>(c); },
    // One step of 1-bit SGD is far from the sum (EF makes it up over steps):
    // a block's means are off by up to the block's spread.
    .error_bound = [](const CodecConfig&) { return 1.0; },
    // A onebit server phase delays the gradient through its error feedback:
    // digits lost 3 points at 4 ranks, 19 at 8 (docs/comm.md, "The server phase").
    .server_spec = "fp16",
    // Segments of whole blocks encode exactly as the whole buffer does.
    .segment_granule = [](const CodecConfig& c) { return static_cast<std::uint64_t>(c.value("block")); },
    .describe_param = describe_param,
    .test_specs = kTestSpecs,
    .bench_specs = kBench,
};

}  // namespace gz::codecs
