// The descriptors of every codec (registry.h's list), and make_codec.
#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/descriptor.h"

namespace gz {

std::span<const CodecDescriptor* const> all_codecs() {
  static constexpr const CodecDescriptor* kAll[] = {
#define GZ_CODEC_ADDRESS(E, id, name, layout) &codecs::name,
      GZ_CODEC_REGISTRY(GZ_CODEC_ADDRESS)
#undef GZ_CODEC_ADDRESS
  };
  return kAll;
}

const CodecDescriptor* find_codec(std::string_view name) {
  for (const CodecDescriptor* d : all_codecs())
    if (d->name == name) return d;
  return nullptr;
}

const CodecDescriptor* find_codec(CodecId id) {
  for (const CodecDescriptor* d : all_codecs())
    if (d->id == id) return d;
  return nullptr;
}

std::unique_ptr<Codec> make_codec(const CodecConfig& cfg) {
  const CodecDescriptor* d = find_codec(cfg.id);
  if (!d) GZ_THROW(InvalidArgument, "unknown codec id ", static_cast<int>(cfg.id), "; valid codecs: ", codec_names());
  return d->make(cfg);
}

std::unique_ptr<Codec> make_codec(std::string_view spec) { return make_codec(parse_spec(spec)); }

}  // namespace gz
