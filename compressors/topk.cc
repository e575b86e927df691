// topk: the K largest magnitudes as (index, value) pairs, indices increasing.
#include <cstring>

#include "common/error.h"
#include "compressors/codecs.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"
#if GZ_HAVE_CUDA
#include "compressors/cuda_codec.h"
#include "kernels/cuda.h"
#endif

namespace gz::codecs {
namespace {

class TopkCodec final : public Codec {
 public:
  using Codec::Codec;

  std::size_t max_payload_bytes(std::size_t n) const override { return wire::kHeaderBytes + 8 * max_entries(n); }

  std::size_t workspace_bytes(std::size_t n, Device device) const override {
    std::size_t bytes = 0;
    if (device == Device::Cpu) {
      kernels::cpu::topk_encode(nullptr, bytes, nullptr, nullptr, n, config().topk_k(n), nullptr, nullptr);
      return bytes;
    }
#if GZ_HAVE_CUDA
    kernels::cuda::topk_encode(nullptr, bytes, nullptr, nullptr, n, config().topk_k(n), sampled(), nullptr, {},
                               nullptr, nullptr);
#endif
    return Codec::workspace_bytes(n, device) + bytes;  // status slot, then the top-k scratch
  }

 protected:
  bool sampled() const { return config().select == TopkSelect::Sample; }

  // Entries a payload of n elements may hold.
  std::size_t max_entries(std::size_t n) const {
    const std::size_t k = config().topk_k(n);
    return sampled() ? std::min(n, kernels::cpu::topk_sampled_max(k)) : k;
  }

  bool expected_param(std::size_t n, std::uint32_t* param) const override {
    *param = static_cast<std::uint32_t>(config().topk_k(n));
    return !sampled();
  }

  EncodedBody encode_cpu(const float* g, float* r, std::size_t n, std::byte* body, const ExecContext& ctx) override {
    GZ_ENFORCE_LE(n, wire::kMaxTopkCount, "topk indexes elements with u32");
    const std::size_t k = config().topk_k(n), cap = max_entries(n);
    std::size_t ws_bytes = workspace_bytes(n, Device::Cpu);
    void* ws = scratch(ctx, ws_bytes);
    auto* idx = reinterpret_cast<std::uint32_t*>(body);
    auto* val = reinterpret_cast<float*>(body + 4 * cap);
    const std::size_t count = sampled() ? kernels::cpu::topk_encode_sampled(ws, ws_bytes, g, r, n, k, idx, val)
                                        : kernels::cpu::topk_encode(ws, ws_bytes, g, r, n, k, idx, val);
    if (count != cap) std::memmove(body + 4 * count, val, count * sizeof(float));
    return {static_cast<std::uint32_t>(count), 8 * count};
  }

  void check_body_cpu(const PayloadView& p) const override {
    wire::check_topk_indices(reinterpret_cast<const std::uint32_t*>(p.body), p.param, p.count);
  }

  void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) override {
    const auto* idx = reinterpret_cast<const std::uint32_t*>(p.body);
    const auto* val = reinterpret_cast<const float*>(p.body + 4 * std::size_t{p.param});
    kernels::cpu::topk_decode(idx, val, p.param, begin, end, out, c);
  }

#if GZ_HAVE_CUDA
  std::size_t encode_cuda(const float* g, float* r, std::size_t n, std::byte* payload,
                          const ExecContext& ctx) override {
    GZ_ENFORCE_LE(n, wire::kMaxTopkCount, "topk indexes elements with u32");
    const std::size_t k = config().topk_k(n);
    const std::size_t ws_bytes = workspace_bytes(n, Device::Cuda);
    std::byte* ws = static_cast<std::byte*>(scratch(ctx, ws_bytes)) + kCudaStatusBytes;
    std::size_t topk_bytes = ws_bytes - kCudaStatusBytes;
    auto* body = reinterpret_cast<std::uint32_t*>(payload + wire::kHeaderBytes);
    if (!sampled()) {  // k entries: the header is known now and goes out with them
      kernels::cuda::topk_encode(ws, topk_bytes, g, r, n, k, false, body,
                                 cuda_codec::header_blob(id(), static_cast<std::uint32_t>(k), n, 8 * k, payload),
                                 nullptr, ctx.stream);
      return wire::kHeaderBytes + 8 * k;
    }
    // select=sample: the count is decided on the device; read it back (synchronizes).
    const std::uint32_t* d_count = nullptr;
    kernels::cuda::topk_encode(ws, topk_bytes, g, r, n, k, true, body, {}, &d_count, ctx.stream);
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

  void decode_cuda(const std::byte* payload, std::size_t bytes, float* out, std::size_t n, Combine c,
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

}  // namespace

std::unique_ptr<Codec> make_topk(const CodecConfig& cfg) { return std::make_unique<TopkCodec>(cfg); }

}  // namespace gz::codecs
