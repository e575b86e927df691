// Codec spec strings: "name[:key=value[,key=value...]]", parsed here and only
// here, by the keys each codec's descriptor declares (descriptor.h). Every
// codec also takes ef=on|off (error feedback; default on, none ignores it).
// The codecs and their keys: README.md, "Codecs", or gradzip.codec_info() in Python.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compressors/registry.h"

namespace gz {

/// Most keys a codec may declare (ef aside).
inline constexpr std::size_t kMaxCodecKeys = 4;

/// A parsed spec string: the codec and the value of each of its keys.
struct CodecConfig {
  CodecId id = CodecId::None;
  bool ef = true;
  /// Key values in the order of the descriptor's keys: integers and reals as
  /// numbers, a choice as the index of its name. Read them with value().
  std::array<double, kMaxCodecKeys> values{};

  /// The codec's descriptor.
  const CodecDescriptor& descriptor() const;
  /// The value of one of the codec's keys; throws InvalidArgument for a key it does not declare.
  double value(std::string_view key) const;
  /// The canonical spec string; parse_spec(canonical()) == *this.
  std::string canonical() const;
  bool operator==(const CodecConfig&) const = default;
};

/// Parses one spec string; throws InvalidArgument naming the valid choices.
CodecConfig parse_spec(std::string_view spec);

/// `spec` with some keys set to other values: `changes` is "key=value,..."
/// (ef included). Returns the canonical spec; throws InvalidArgument as
/// parse_spec does, for `spec` itself and for the result. The one way to edit
/// a spec: the grammar stays here ("topk:density=0.01" + "density=0.05" ->
/// "topk:density=0.05").
std::string respec(std::string_view spec, std::string_view changes);
/// The keys `spec` writes (ef included), in its order, after checking it:
/// "onebit:ef=off" -> {"ef"}; what the caller chose rather than a default.
std::vector<std::string> spec_keys(std::string_view spec);

/// Splits a comma-separated list of specs ("none,fp16,topk:density=0.01,ef=off")
/// into specs: an element with '=' and no ':' continues the previous spec.
std::vector<std::string> split_spec_list(std::string_view list);

/// Expands a grid of specs for sweeps: an element with neither ':' nor '=' that
/// is not a codec name is one more value for the previous key.
/// "topk:density=0.1,0.01,onebit:block=256,1024" ->
///   topk:density=0.1, topk:density=0.01, onebit:block=256, onebit:block=1024
std::vector<std::string> expand_spec_grid(std::string_view list);
/// The same expansion, each spec as the grid writes it ("onebit", not
/// "onebit:block=512"), each checked by parse_spec: the sweep's labels.
std::vector<std::string> expand_spec_grid_as_written(std::string_view list);

/// Names of the codecs, for help texts ("none, fp16, ...", in wire id order).
std::string_view codec_names();
/// The spec name of a codec id ("unknown" for an id no codec has).
const char* codec_name(CodecId id);

}  // namespace gz
