// Spec name -> codec factory. Adding a codec: kernels/<codec>.h, a
// compressors/<codec>.cc with its factory, one line here, a test.
#include "common/error.h"
#include "compressors/codecs.h"

namespace gz {

std::unique_ptr<Codec> make_codec(const CodecConfig& cfg) {
  switch (cfg.id) {
    case CodecId::None: return codecs::make_none(cfg);
    case CodecId::Fp16: return codecs::make_fp16(cfg);
    case CodecId::Bf16: return codecs::make_bf16(cfg);
    case CodecId::OneBit: return codecs::make_onebit(cfg);
    case CodecId::TopK: return codecs::make_topk(cfg);
  }
  GZ_THROW(InvalidArgument, "unknown codec id ", static_cast<int>(cfg.id), "; valid codecs: ", codec_names());
}

std::unique_ptr<Codec> make_codec(std::string_view spec) { return make_codec(parse_spec(spec)); }

}  // namespace gz
