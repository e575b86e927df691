// The element type of a gradient buffer: what a codec encodes from and
// decodes into, and what the ranks of an allreduce agree on. Payloads do not
// depend on it (a payload of a bf16 gradient is the payload of its exact
// float widening); residuals are float whatever it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace gz {

enum class Dtype : std::uint8_t {
  Float32 = 0,   ///< IEEE binary32
  Float16 = 1,   ///< IEEE binary16
  BFloat16 = 2,  ///< bfloat16: binary32's upper half
};

inline constexpr Dtype kAllDtypes[] = {Dtype::Float32, Dtype::Float16, Dtype::BFloat16};

/// Bytes per element.
inline constexpr std::size_t dtype_bytes(Dtype d) { return d == Dtype::Float32 ? 4 : 2; }

/// "float32", "float16", "bfloat16" (torch's names).
inline constexpr const char* to_string(Dtype d) {
  switch (d) {
    case Dtype::Float32: return "float32";
    case Dtype::Float16: return "float16";
    case Dtype::BFloat16: return "bfloat16";
  }
  return "unknown dtype";
}

/// The dtype whose to_string is `name`, or nothing.
inline std::optional<Dtype> parse_dtype(std::string_view name) {
  for (Dtype d : kAllDtypes)
    if (name == to_string(d)) return d;
  return std::nullopt;
}

/// The dtype with enumerator value `v` (from the wire), or nothing.
inline std::optional<Dtype> dtype_from_int(std::uint64_t v) {
  for (Dtype d : kAllDtypes)
    if (v == static_cast<std::uint64_t>(d)) return d;
  return std::nullopt;
}

}  // namespace gz
