// fp16 and bf16: one 16-bit float per element (one template, two formats).
#include "compressors/codecs.h"
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
  std::size_t max_payload_bytes(std::size_t n) const override { return wire::kHeaderBytes + 2 * n; }

 protected:
  EncodedBody encode_cpu(const float* g, float* r, std::size_t n, std::byte* body, const ExecContext&) override {
    kernels::cpu::cast_encode<Fmt>(g, r, n, reinterpret_cast<std::uint16_t*>(body));
    return {0, 2 * n};
  }
  void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) override {
    kernels::cpu::cast_decode<Fmt>(reinterpret_cast<const std::uint16_t*>(p.body), begin, end, out, c);
  }
#if GZ_HAVE_CUDA
  std::size_t encode_cuda(const float* g, float* r, std::size_t n, std::byte* payload,
                          const ExecContext& ctx) override {
    kernels::cuda::cast_encode<Fmt>(g, r, n, reinterpret_cast<std::uint16_t*>(payload + wire::kHeaderBytes),
                                    cuda_codec::header_blob(id(), 0, n, 2 * n, payload), ctx.stream);
    return wire::kHeaderBytes + 2 * n;
  }
  void decode_cuda(const std::byte* payload, std::size_t, float* out, std::size_t n, Combine c,
                   const ExecContext& ctx) override {
    kernels::cuda::cast_decode<Fmt>(reinterpret_cast<const std::uint16_t*>(payload + wire::kHeaderBytes), n, out, c,
                                    &ctx.status->code, ctx.stream);
  }
#endif
};

}  // namespace

std::unique_ptr<Codec> make_fp16(const CodecConfig& cfg) {
  return std::make_unique<CastCodec<kernels::HalfFormat>>(cfg);
}
std::unique_ptr<Codec> make_bf16(const CodecConfig& cfg) {
  return std::make_unique<CastCodec<kernels::BFloat16Format>>(cfg);
}

}  // namespace gz::codecs
