// Codec spec strings: "name[:key=value[,key=value...]]", parsed here and only here.
//
//   none                      fp32 as is
//   fp16 | bf16               16-bit floats, round to nearest even
//   onebit[:block=B]          1 sign bit per element + 2 floats per block (B >= 1, default 512)
//   topk[:density=D|k=K]      the K largest |v| (0 < D <= 1, default density=0.01; K >= 1)
//        [,select=exact|sample]
// Every codec also takes ef=on|off (error feedback; default on, none ignores it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gz {

/// Codec identifiers; the numbers are part of the wire format.
enum class CodecId : std::uint16_t { None = 1, Fp16 = 2, Bf16 = 3, OneBit = 4, TopK = 5 };

enum class TopkSelect : std::uint8_t { Exact, Sample };

/// A parsed spec string. Fields that do not apply to the codec keep their defaults.
struct CodecConfig {
  CodecId id = CodecId::None;
  bool ef = true;
  std::uint32_t block = 512;  ///< onebit
  double density = 0.01;      ///< topk, when k == 0
  std::uint64_t k = 0;        ///< topk: fixed count (0: use density)
  TopkSelect select = TopkSelect::Exact;

  /// The canonical spec string; parse_spec(canonical()) == *this.
  std::string canonical() const;
  /// Top-k entries for a buffer of n elements (0 for other codecs).
  std::uint64_t topk_k(std::uint64_t n) const;
  bool operator==(const CodecConfig&) const = default;
};

/// Parses one spec string; throws InvalidArgument naming the valid choices.
CodecConfig parse_spec(std::string_view spec);

/// Splits a comma-separated list of specs ("none,fp16,topk:density=0.01,ef=off")
/// into specs: an element with '=' and no ':' continues the previous spec.
std::vector<std::string> split_spec_list(std::string_view list);

/// Expands a grid of specs for sweeps: an element with neither ':' nor '=' that
/// is not a codec name is one more value for the previous key.
/// "topk:density=0.1,0.01,onebit:block=256,1024" ->
///   topk:density=0.1, topk:density=0.01, onebit:block=256, onebit:block=1024
std::vector<std::string> expand_spec_grid(std::string_view list);

/// Names of the codecs, for help texts.
std::string_view codec_names();
const char* codec_name(CodecId id);

}  // namespace gz
