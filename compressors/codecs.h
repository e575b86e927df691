// Factories of the built-in codecs, one per file; make_codec() (registry.cc)
// maps a parsed spec to one of them. Internal to compressors/.
#pragma once

#include <memory>

#include "compressors/codec.h"

namespace gz::codecs {

std::unique_ptr<Codec> make_none(const CodecConfig& cfg);
std::unique_ptr<Codec> make_fp16(const CodecConfig& cfg);
std::unique_ptr<Codec> make_bf16(const CodecConfig& cfg);
std::unique_ptr<Codec> make_onebit(const CodecConfig& cfg);
std::unique_ptr<Codec> make_topk(const CodecConfig& cfg);

}  // namespace gz::codecs
