// topk: the K largest magnitudes as (index, value) pairs, indices increasing.
#include <cstring>

#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"
#if GZ_HAVE_CUDA
#include "compressors/cuda_codec.h"
#include "kernels/cuda.h"
#endif

namespace gz::codecs {
namespace {

// Key indices (kKeys below) and the select choices.
constexpr std::size_t kDensity = 0, kK = 1, kSelect = 2;
constexpr double kSample = 1;

bool sampled(const CodecConfig& c) { return c.values[kSelect] == kSample; }

// K for n elements: k clamped to n, or from the density.
std::uint64_t topk_k(const CodecConfig& c, std::uint64_t n) {
  const auto k = static_cast<std::uint64_t>(c.values[kK]);
  if (k) return k < n ? k : n;
  return kernels::topk_k_for_density(n, c.values[kDensity]);
}

class TopkCodec final : public Codec {
 public:
  using Codec::Codec;

  std::uint32_t header_param(std::size_t n) const override { return static_cast<std::uint32_t>(topk_k(config(), n)); }
  std::size_t max_payload_bytes(std::size_t n) const override {
    return wire::kHeaderBytes + kernels::TopkLayout::body_bytes(static_cast<std::uint32_t>(max_entries(n)), n);
  }

  std::size_t codec_workspace_bytes(std::size_t n, Device device) const override {
    std::size_t bytes = 0;
    const float* no_grad = nullptr;
    if (device == Device::Cpu) {
      kernels::cpu::topk_encode(nullptr, bytes, no_grad, nullptr, n, topk_k(config(), n), nullptr, nullptr);
      return bytes;
    }
#if GZ_HAVE_CUDA
    kernels::cuda::topk_encode(nullptr, bytes, no_grad, nullptr, n, topk_k(config(), n), sampled(), nullptr, {},
                               nullptr, nullptr);
#endif
    return Codec::codec_workspace_bytes(n, device) + bytes;  // status slot, then the top-k scratch
  }

 protected:
  bool sampled() const { return codecs::sampled(config()); }

  // Entries a payload of n elements may hold.
  std::size_t max_entries(std::size_t n) const {
    const std::size_t k = topk_k(config(), n);
    return sampled() ? std::min(n, kernels::cpu::topk_sampled_max(k)) : k;
  }

  EncodedBody encode_cpu(GradRef g, float* r, std::size_t n, std::byte* body, const ExecContext& ctx) override {
    GZ_ENFORCE_LE(n, kernels::TopkLayout::kMaxCount, "topk indexes elements with u32");
    const std::size_t k = topk_k(config(), n), cap = max_entries(n);
    std::size_t ws_bytes = codec_workspace_bytes(n, Device::Cpu);
    void* ws = scratch(ctx, ws_bytes);
    auto* idx = reinterpret_cast<std::uint32_t*>(body);
    auto* val = reinterpret_cast<float*>(body + 4 * cap);
    const std::size_t count = visit(g, [&](auto* gp) {
      return sampled() ? kernels::cpu::topk_encode_sampled(ws, ws_bytes, gp, r, n, k, idx, val)
                       : kernels::cpu::topk_encode(ws, ws_bytes, gp, r, n, k, idx, val);
    });
    if (count != cap) std::memmove(body + 4 * count, val, count * sizeof(float));
    return {static_cast<std::uint32_t>(count), 8 * count};
  }

  void check_body_cpu(const PayloadView& p) const override {
    wire::check_topk_indices(reinterpret_cast<const std::uint32_t*>(p.body), p.param, p.count);
  }

  void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) override {
    const auto* idx = reinterpret_cast<const std::uint32_t*>(p.body);
    const auto* val = reinterpret_cast<const float*>(p.body + kernels::TopkLayout::values_offset(p.param));
    kernels::cpu::topk_decode(idx, val, p.param, begin, end, out, c);
  }

#if GZ_HAVE_CUDA
  std::size_t encode_cuda(GradRef g, float* r, std::size_t n, std::byte* payload, const ExecContext& ctx) override {
    GZ_ENFORCE_LE(n, kernels::TopkLayout::kMaxCount, "topk indexes elements with u32");
    const std::size_t k = topk_k(config(), n);
    const std::size_t ws_bytes = codec_workspace_bytes(n, Device::Cuda);
    std::byte* ws = static_cast<std::byte*>(scratch(ctx, ws_bytes)) + kCudaStatusBytes;
    std::size_t topk_bytes = ws_bytes - kCudaStatusBytes;
    auto* body = reinterpret_cast<std::uint32_t*>(payload + wire::kHeaderBytes);
    if (!sampled()) {  // k entries: the header is known now and goes out with them
      const auto head = cuda_codec::header_blob(id(), static_cast<std::uint32_t>(k), n, 8 * k, payload);
      visit(g, [&](auto* gp) {
        kernels::cuda::topk_encode(ws, topk_bytes, gp, r, n, k, false, body, head, nullptr, ctx.stream);
      });
      return wire::kHeaderBytes + 8 * k;
    }
    // select=sample: the count is decided on the device; read it back (synchronizes).
    const std::uint32_t* d_count = nullptr;
    visit(g, [&](auto* gp) {
      kernels::cuda::topk_encode(ws, topk_bytes, gp, r, n, k, true, body, {}, &d_count, ctx.stream);
    });
    const std::uint32_t count = kernels::cuda::fetch_word(d_count, ctx.stream);
    GZ_CHECK_AS(CudaError, count <= max_entries(n), "topk: device reported ", count, " entries, more than ",
                max_entries(n));
    kernels::cuda::write_blob(cuda_codec::header_blob(id(), count, n, 8 * std::uint64_t{count}, payload), ctx.stream);
    return wire::kHeaderBytes + 8 * std::size_t{count};
  }

  // Entries a payload of `bytes` holds; 0 when no valid header can have that
  // size (exact: the host already matched bytes to k; sampled: the header
  // check reports it), and nothing is launched.
  static std::size_t entries(std::size_t bytes, std::size_t n) {
    const std::size_t body_bytes = bytes - wire::kHeaderBytes;
    return body_bytes % 8 != 0 || body_bytes / 8 > n ? 0 : body_bytes / 8;
  }

  void check_body_cuda(const std::byte* payload, std::size_t bytes, std::size_t n, const ExecContext& ctx) override {
    cuda_codec::validate_topk_indices(reinterpret_cast<const std::uint32_t*>(payload + wire::kHeaderBytes),
                                      entries(bytes, n), n, ctx.status, ctx.stream);
  }

  void decode_cuda(const std::byte* payload, std::size_t bytes, const DecodeOut& out, std::size_t n, Combine c,
                   const ExecContext& ctx) override {
    const std::size_t body_bytes = bytes - wire::kHeaderBytes;
    if (body_bytes % 8 != 0 || body_bytes / 8 > n) return;  // the header check has closed the gate
    const std::size_t k = entries(bytes, n);
    const auto* idx = reinterpret_cast<const std::uint32_t*>(payload + wire::kHeaderBytes);
    const auto* val = reinterpret_cast<const float*>(idx + k);
    kernels::cuda::topk_decode(idx, val, k, n, out, c, &ctx.status->code, ctx.stream);
  }
#endif
};

constexpr std::string_view kSelectChoices[] = {"exact", "sample"};
constexpr CodecKey kKeys[] = {
    {.name = "density", .kind = CodecKey::Kind::Real, .fallback = 0.01, .lo = 0, .hi = 1, .range = "in (0, 1]"},
    // 0: not given (density applies). Up to the format's element limit.
    {.name = "k", .fallback = 0, .lo = 1, .hi = static_cast<double>(wire::kMaxCount), .range = "in [1, 2^40]"},
    {.name = "select", .kind = CodecKey::Kind::Choice, .fallback = 0, .choices = kSelectChoices},
};

void check(std::string_view spec, const CodecConfig&, std::uint32_t given) {
  if ((given & (1u << kDensity)) && (given & (1u << kK)))
    GZ_THROW(InvalidArgument, "codec spec '", spec, "': give either density or k, not both");
}

// density=D or k=K, whichever sets K; select when not the default.
bool shows(const CodecConfig& c, std::size_t key) {
  if (key == kDensity) return c.values[kK] == 0;
  if (key == kK) return c.values[kK] != 0;
  return c.values[key] != kKeys[key].fallback;
}

// k=K over n elements cut into segments: each segment keeps the same share,
// K / n, of its elements (at least one entry each).
bool segment_config(const CodecConfig& c, std::uint64_t n, CodecConfig* out) {
  if (c.values[kK] == 0) return false;  // density applies per segment as it is
  *out = c;
  out->values[kK] = 0;
  out->values[kDensity] = static_cast<double>(topk_k(c, n)) / static_cast<double>(n);
  return true;
}

std::string describe_param(std::uint32_t reason, std::uint32_t k, std::uint64_t count) {
  if (reason == 1) return "topk payload count " + std::to_string(count) + " exceeds u32 indices";
  return "topk payload has " + std::to_string(k) + " entries for only " + std::to_string(count) + " elements";
}

constexpr std::string_view kTestSpecs[] = {"topk:density=0.01", "topk:k=7", "topk:density=0.3,select=sample",
                                           "topk:density=0.05,ef=off", "topk:k=5",
                                           "topk:density=0.2,select=sample"};
constexpr BenchSpec kBench[] = {{"topk", "topk:density=0.01"}, {"topk_sample", "topk:density=0.01,select=sample"}};

}  // namespace

extern const CodecDescriptor topk{
    .name = "topk",
    .id = CodecId::TopK,
    .summary = "the K largest |v| as (u32 index, f32 value) pairs, indices increasing",
    .keys = kKeys,
    .make = [](const CodecConfig& c) -> std::unique_ptr<Codec> { return std::make_unique<TopkCodec>(c); },
    // select=sample decides the count on the data.
    .fixed_size = [](const CodecConfig& c) { return !sampled(c); },
    // One step sends a fraction of the mass (EF sends the rest later).
    .error_bound = [](const CodecConfig&) { return 1.0; },
    .hint = {.sparse = true, .allgather_up_to_ranks = 16},
    .segment_config = segment_config,
    .describe_param = describe_param,
    .check = check,
    .shows = shows,
    .test_specs = kTestSpecs,
    .bench_specs = kBench,
};

}  // namespace gz::codecs
