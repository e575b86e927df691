// qsgd: B-bit max-min quantization per bucket, rounding to nearest or
// stochastically (kernels/qsgd.h).
#include <cmath>

#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "kernels/qsgd.h"
#if GZ_HAVE_CUDA
#include "compressors/cuda_codec.h"
#endif

namespace gz::codecs {
namespace {

using kernels::QsgdLayout;
using kernels::QsgdScale;

// Key indices (kKeys below).
constexpr std::size_t kBits = 0, kBucket = 1, kStochastic = 2, kSeed = 3;

class QsgdCodec final : public Codec {
 public:
  explicit QsgdCodec(const CodecConfig& c)
      : Codec(c),
        bits_(static_cast<std::uint32_t>(c.values[kBits])),
        bucket_(static_cast<std::uint32_t>(c.values[kBucket])),
        stochastic_(c.values[kStochastic] != 0),
        seed_(static_cast<std::uint32_t>(c.values[kSeed])) {}

  std::uint32_t header_param(std::size_t) const override { return kernels::qsgd_param(bits_, bucket_); }

 protected:
  kernels::QsgdRounding rounding(const ExecContext& ctx) const { return {stochastic_, seed_, ctx.step}; }

  EncodedBody encode_cpu(GradRef g, float* r, std::size_t n, std::byte* body, const ExecContext& ctx) override {
    const std::uint32_t param = header_param(n);
    visit(g, [&](auto* gp) {
      kernels::cpu::qsgd_encode(gp, r, n, bits_, bucket_, rounding(ctx), reinterpret_cast<QsgdScale*>(body),
                                reinterpret_cast<std::uint32_t*>(body + QsgdLayout::words_offset(param, n)));
    });
    return {param, QsgdLayout::body_bytes(param, n)};
  }
  void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) override {
    kernels::cpu::qsgd_decode(
        reinterpret_cast<const QsgdScale*>(p.body),
        reinterpret_cast<const std::uint32_t*>(p.body + QsgdLayout::words_offset(p.param, p.count)),
        kernels::qsgd_bits(p.param), kernels::qsgd_bucket(p.param), begin, end, out, c);
  }
#if GZ_HAVE_CUDA
  std::size_t encode_cuda(GradRef g, float* r, std::size_t n, std::byte* payload, const ExecContext& ctx) override {
    const std::uint32_t param = header_param(n);
    std::byte* body = payload + wire::kHeaderBytes;
    const std::uint64_t body_bytes = QsgdLayout::body_bytes(param, n);
    visit(g, [&](auto* gp) {
      kernels::cuda::qsgd_encode(gp, r, n, bits_, bucket_, rounding(ctx), reinterpret_cast<QsgdScale*>(body),
                                 reinterpret_cast<std::uint32_t*>(body + QsgdLayout::words_offset(param, n)),
                                 cuda_codec::header_blob(id(), param, n, body_bytes, payload), ctx.stream);
    });
    return wire::kHeaderBytes + body_bytes;
  }
  // Runs only when the size matched max_payload_bytes(n), i.e. this codec's bits and bucket.
  void decode_cuda(const std::byte* payload, std::size_t, const DecodeOut& out, std::size_t n, Combine c,
                   const ExecContext& ctx) override {
    const std::uint32_t param = header_param(n);
    const std::byte* body = payload + wire::kHeaderBytes;
    kernels::cuda::qsgd_decode(reinterpret_cast<const QsgdScale*>(body),
                               reinterpret_cast<const std::uint32_t*>(body + QsgdLayout::words_offset(param, n)), n,
                               bits_, bucket_, out, c, &ctx.status->code, ctx.stream);
  }
#endif

 private:
  std::uint32_t bits_, bucket_;
  bool stochastic_;
  std::uint32_t seed_;
};

constexpr std::string_view kOnOff[] = {"off", "on"};
constexpr CodecKey kKeys[] = {
    {.name = "bits", .fallback = kernels::kQsgdDefaultBits, .lo = kernels::kQsgdMinBits, .hi = kernels::kQsgdMaxBits,
     .range = "in [2, 8]", .always_shown = true},
    {.name = "bucket", .fallback = kernels::kQsgdDefaultBucket, .lo = 1, .hi = kernels::kQsgdMaxBucket,
     .range = "in [1, 2^24 - 1]", .always_shown = true},
    {.name = "stochastic", .kind = CodecKey::Kind::Choice, .fallback = 0, .choices = kOnOff},
    // Philox key of stochastic rounding (with the step): the same on every rank.
    {.name = "seed", .fallback = 0, .lo = 0, .hi = 0xFFFFFFFFu, .range = "in [0, 2^32 - 1]"},
};

// Relative error of one allreduce, scatter_reduce (two quantizations: the
// workers' and the chunk sums'): per quantization about range / (L sqrt 12)
// for round to nearest, range / (L sqrt 6) stochastic, with a bucket's range
// about 6 standard deviations of normal data: ~2.5 / L and ~3.5 / L. The
// bound leaves a factor of two and more: 8 / L (0.53 at 4 bits).
double error_bound(const CodecConfig& c) { return 8.0 / static_cast<double>(kernels::qsgd_levels(static_cast<std::uint32_t>(c.values[kBits]))); }

std::string describe_param(std::uint32_t reason, std::uint32_t param, std::uint64_t) {
  if (reason == 1)
    return "qsgd payload with " + std::to_string(kernels::qsgd_bits(param)) + " bits per element (valid: 2..8)";
  return "qsgd payload with bucket size 0";
}

// Widths with and without lane-wide paths (2, 4, 8; 3, 5, 7), buckets that are
// and are not multiples of 32, one element per bucket, stochastic rounding.
constexpr std::string_view kTestSpecs[] = {
    "qsgd:bits=4,bucket=512", "qsgd:bits=2,bucket=64",  "qsgd:bits=8,bucket=1024",
    "qsgd:bits=3,bucket=100", "qsgd:bits=5,bucket=33",  "qsgd:bits=7,bucket=1",
    "qsgd:bits=4,bucket=100", "qsgd:bits=4,bucket=512,stochastic=on,seed=7",
    "qsgd:bits=3,bucket=50,stochastic=on", "qsgd:bits=8,bucket=512,ef=off"};
constexpr BenchSpec kBench[] = {{"qsgd", "qsgd:bits=4,bucket=512"},
                                {"qsgd_sr", "qsgd:bits=4,bucket=512,stochastic=on"},
                                {"qsgd8", "qsgd:bits=8,bucket=512"}};

}  // namespace

extern const CodecDescriptor qsgd{
    .name = "qsgd",
    .id = CodecId::Qsgd,
    .summary = "B bits per element + the min and step of each bucket of S (max-min quantization), rounding to "
               "nearest or stochastically",
    .keys = kKeys,
    .make = [](const CodecConfig& c) -> std::unique_ptr<Codec> { return std::make_unique<QsgdCodec>(c); },
    .error_bound = error_bound,
    // Segments of whole buckets quantize as the whole buffer does (stochastic
    // rounding draws by element index within the segment: other draws, the
    // same on every rank).
    .segment_granule = [](const CodecConfig& c) { return static_cast<std::uint64_t>(c.values[kBucket]); },
    .describe_param = describe_param,
    .test_specs = kTestSpecs,
    .bench_specs = kBench,
};

}  // namespace gz::codecs
