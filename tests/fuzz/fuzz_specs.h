// The decoders the fuzz target runs and the seeds cover: every registered
// codec's test specs, in registry order. Byte 0 of an input picks one (so the
// seeds and the target must agree on this list: both take it from here).
#pragma once

#include <string>
#include <vector>

#include "compressors/descriptor.h"

namespace gz::fuzz {

inline const std::vector<std::string>& specs() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> out;
    for (const CodecDescriptor* d : all_codecs())
      for (std::string_view s : d->test_specs) out.emplace_back(s);
    return out;
  }();
  return all;
}

}  // namespace gz::fuzz
