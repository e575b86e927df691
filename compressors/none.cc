// none: fp32 as is. With it, a compressed allreduce is an exact allreduce.
#include "compressors/codecs.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"

namespace gz::codecs {
namespace {

class NoneCodec final : public Codec {
 public:
  using Codec::Codec;
  std::size_t max_payload_bytes(std::size_t n) const override { return wire::kHeaderBytes + 4 * n; }

 protected:
  EncodedBody encode_cpu(const float* g, float* r, std::size_t n, std::byte* body, const ExecContext&) override {
    kernels::cpu::copy_encode(g, r, n, reinterpret_cast<float*>(body));
    return {0, 4 * n};
  }
  void decode_cpu(const PayloadView& p, float* out, const ExecContext&) override {
    kernels::cpu::add_accumulate(reinterpret_cast<const float*>(p.body), p.count, out);
  }
};

}  // namespace

std::unique_ptr<Codec> make_none(const CodecConfig& cfg) { return std::make_unique<NoneCodec>(cfg); }

}  // namespace gz::codecs
