// fp16 and bf16: one 16-bit float per element (one template, two formats).
#include "compressors/codecs.h"
#include "compressors/wire_format.h"
#include "kernels/cast.h"
#include "kernels/cpu.h"

namespace gz::codecs {
namespace {

template <class Fmt>
class CastCodec final : public Codec {
 public:
  using Codec::Codec;
  std::size_t max_payload_bytes(std::size_t n) const override { return wire::kHeaderBytes + 2 * n; }

 protected:
  EncodedBody encode_cpu(const float* g, float* r, std::size_t n, std::byte* body, const ExecContext&) override {
    kernels::cpu::cast_encode<Fmt>(g, r, n, reinterpret_cast<std::uint16_t*>(body));
    return {0, 2 * n};
  }
  void decode_cpu(const PayloadView& p, float* out, const ExecContext&) override {
    kernels::cpu::cast_decode_accumulate<Fmt>(reinterpret_cast<const std::uint16_t*>(p.body), p.count, out);
  }
};

}  // namespace

std::unique_ptr<Codec> make_fp16(const CodecConfig& cfg) {
  return std::make_unique<CastCodec<kernels::HalfFormat>>(cfg);
}
std::unique_ptr<Codec> make_bf16(const CodecConfig& cfg) {
  return std::make_unique<CastCodec<kernels::BFloat16Format>>(cfg);
}

}  // namespace gz::codecs
