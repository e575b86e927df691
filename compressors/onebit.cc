// onebit: sign bits plus two reconstruction values per block (kernels/onebit.h).
#include "compressors/codecs.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"
#if GZ_HAVE_CUDA
#include "compressors/cuda_codec.h"
#include "kernels/cuda.h"
#endif

namespace gz::codecs {
namespace {

class OnebitCodec final : public Codec {
 public:
  using Codec::Codec;
  std::size_t max_payload_bytes(std::size_t n) const override {
    return wire::kHeaderBytes + wire::body_bytes(CodecId::OneBit, config().block, n);
  }

 protected:
  bool expected_param(std::size_t, std::uint32_t* param) const override {
    *param = config().block;
    return true;
  }
  EncodedBody encode_cpu(const float* g, float* r, std::size_t n, std::byte* body, const ExecContext&) override {
    const std::uint32_t block = config().block;
    auto* scales = reinterpret_cast<kernels::OnebitScales*>(body);
    auto* bits = reinterpret_cast<std::uint32_t*>(body + 8 * kernels::onebit_blocks(n, block));
    kernels::cpu::onebit_encode(g, r, n, block, scales, bits);
    return {block, wire::body_bytes(CodecId::OneBit, block, n)};
  }
  void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) override {
    const auto* scales = reinterpret_cast<const kernels::OnebitScales*>(p.body);
    const auto* bits = reinterpret_cast<const std::uint32_t*>(p.body + 8 * kernels::onebit_blocks(p.count, p.param));
    kernels::cpu::onebit_decode(scales, bits, p.param, begin, end, out, c);
  }
#if GZ_HAVE_CUDA
  std::size_t encode_cuda(const float* g, float* r, std::size_t n, std::byte* payload,
                          const ExecContext& ctx) override {
    const std::uint32_t block = config().block;
    std::byte* body = payload + wire::kHeaderBytes;
    const std::uint64_t body_bytes = wire::body_bytes(CodecId::OneBit, block, n);
    kernels::cuda::onebit_encode(g, r, n, block, reinterpret_cast<kernels::OnebitScales*>(body),
                                 reinterpret_cast<std::uint32_t*>(body + 8 * kernels::onebit_blocks(n, block)),
                                 cuda_codec::header_blob(id(), block, n, body_bytes, payload), ctx.stream);
    return wire::kHeaderBytes + body_bytes;
  }
  // Runs only when the size matched max_payload_bytes(n), i.e. this codec's block.
  void decode_cuda(const std::byte* payload, std::size_t, float* out, std::size_t n, Combine c,
                   const ExecContext& ctx) override {
    const std::uint32_t block = config().block;
    const std::byte* body = payload + wire::kHeaderBytes;
    kernels::cuda::onebit_decode(reinterpret_cast<const kernels::OnebitScales*>(body),
                                 reinterpret_cast<const std::uint32_t*>(body + 8 * kernels::onebit_blocks(n, block)),
                                 n, block, out, c, &ctx.status->code, ctx.stream);
  }
#endif
};

}  // namespace

std::unique_ptr<Codec> make_onebit(const CodecConfig& cfg) { return std::make_unique<OnebitCodec>(cfg); }

}  // namespace gz::codecs
