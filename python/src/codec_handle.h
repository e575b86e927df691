// A Codec shared with Python: the C++ codec and the lock that serialises
// calls on it (a Codec's scratch is not thread-safe, and bound calls run
// without the GIL).
#pragma once

#include <memory>
#include <mutex>
#include <string_view>

#include "compressors/codec.h"

namespace gzpy {

class CodecHandle {
 public:
  explicit CodecHandle(std::string_view spec) : codec_(gz::make_codec(spec)) {}
  gz::Codec& codec() const { return *codec_; }
  std::mutex& mutex() const { return mutex_; }

 private:
  std::unique_ptr<gz::Codec> codec_;
  mutable std::mutex mutex_;
};

}  // namespace gzpy
