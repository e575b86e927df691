// topk: the K largest magnitudes as (index, value) pairs, indices increasing.
#include <cstring>

#include "common/error.h"
#include "compressors/codecs.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"

namespace gz::codecs {
namespace {

class TopkCodec final : public Codec {
 public:
  using Codec::Codec;

  std::size_t max_payload_bytes(std::size_t n) const override { return wire::kHeaderBytes + 8 * max_entries(n); }

  std::size_t workspace_bytes(std::size_t n, Device device) const override {
    if (device != Device::Cpu) return 0;
    std::size_t bytes = 0;
    kernels::cpu::topk_encode(nullptr, bytes, nullptr, nullptr, n, config().topk_k(n), nullptr, nullptr);
    return bytes;
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

  void decode_cpu(const PayloadView& p, float* out, const ExecContext&) override {
    const auto* idx = reinterpret_cast<const std::uint32_t*>(p.body);
    const auto* val = reinterpret_cast<const float*>(p.body + 4 * std::size_t{p.param});
    wire::check_topk_indices(idx, p.param, p.count);  // before touching out
    kernels::cpu::topk_decode_accumulate(idx, val, p.param, out);
  }
};

}  // namespace

std::unique_ptr<Codec> make_topk(const CodecConfig& cfg) { return std::make_unique<TopkCodec>(cfg); }

}  // namespace gz::codecs
