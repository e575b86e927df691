// The codecs' rates on this machine, for the cost model (cost_model.h):
// measured on one core (a few calls on 8M elements: 0.1-0.2 s per codec) and
// kept in a per-user cache file, so that each codec is measured once per
// machine.
//
// The cache is a hint, never trusted blindly. It is read only when it is a
// regular file owned by this user and writable by nobody else; its first
// lines name the format version and the machine (CPU model, vector
// extensions, CPU count); every entry carries a checksum and values within
// physical ranges. Anything else (another machine's file, an older format, a
// truncated or edited line) makes the whole file ignored with one warning on
// stderr, and the rates are measured again and the file rewritten (atomically:
// a temporary file renamed over it).
//
//   GRADZIP_RATES_CACHE   the cache file (default: $XDG_CACHE_HOME/gradzip/
//                         codec-rates.tsv, else ~/.cache/gradzip/...); "off":
//                         no cache, measure every time.
#pragma once

#include <optional>
#include <string>

#include "comm/cost/cost_model.h"
#include "compressors/spec.h"

namespace gz {

/// Measures `codec` on this core: encode (with error feedback) of n
/// elements, decode_sum of 1 and of 4 payloads; the best of `reps` calls each.
/// 8M elements: buffers beyond the caches, as a gradient's are.
CodecRates measure_codec_rates(const CodecConfig& codec, std::size_t n = std::size_t{1} << 23, int reps = 2);
/// Measures memcpy and kernels::cpu::sum on n floats.
MachineRates measure_machine_rates(std::size_t n = std::size_t{1} << 23, int reps = 2);

/// The text that names this machine in the cache ("model | avx2 avx512f | 16 cpus").
std::string machine_identity();

/// A cache of rates in one file (see the top of this file).
class RatesCache {
 public:
  /// `path` empty: no cache (every lookup measures).
  explicit RatesCache(std::string path, std::string identity = machine_identity());
  /// GRADZIP_RATES_CACHE or the default path ("" when off or no home).
  static std::string default_path();

  /// From the cache when a valid entry is there, else measured (and stored).
  CodecRates codec(const CodecConfig& codec);
  MachineRates machine();

  /// Whether the last lookup was answered from the file.
  bool last_hit() const { return last_hit_; }
  /// The warning the file earned when loaded ("" when none).
  const std::string& warning() const { return warning_; }
  const std::string& path() const { return path_; }

 private:
  void load();
  void store(const std::string& key, const std::string& values);
  std::optional<std::string> find(const std::string& key);

  std::string path_, identity_, warning_;
  bool loaded_ = false, last_hit_ = false;
  std::vector<std::pair<std::string, std::string>> entries_;  // key, values text
};

/// One entry's line, checksummed (exposed for the tests).
std::string rates_cache_line(const std::string& identity, const std::string& key, const std::string& values);

}  // namespace gz
