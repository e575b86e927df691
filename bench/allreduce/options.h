// gradzip-bench command line.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/engine/allreduce.h"
#include "comm/engine/communicator.h"

namespace gz::bench {

/// Every registered codec's first benchmark spec (descriptor.h), in registry order.
std::vector<std::string> default_codecs();

struct Options {
  std::vector<std::string> codecs = default_codecs();
  std::vector<std::size_t> sizes = {1 << 20, 4 << 20, 16 << 20};  ///< floats
  std::string transport{kDefaultTransport};  ///< a registered transport's name (comm/transports/registry.h)
  Algorithm algorithm = Algorithm::Auto;
  int iters = 5;
  int warmup = 2;
  Device device = Device::Cpu;
  std::string json;       ///< write records here when set
  std::string jsonl;      ///< append each record here as it finishes
  double timeout_s = 0;   ///< 0: GRADZIP_TIMEOUT_S or 60
  std::size_t segment_bytes = 0;  ///< payload bytes per pipeline segment (0: the library's default)
  /// Print the cost model's prediction and the memory-traffic limit next to
  /// each row (needs a link: --link or GRADZIP_LINK, as gradzip-run --link sets).
  bool predict = false;
  std::string link;       ///< the link for the cost model (empty: GRADZIP_LINK)
};

/// "4096", "512K", "2M" (powers of 1024), counts of bytes.
std::size_t parse_bytes(const std::string& s);

/// "64", "1K", "16M", "2G" (powers of 1024), counts of floats.
std::size_t parse_size(const std::string& s);

/// Parses argv; prints usage and exits on --help or an error.
Options parse_options(int argc, char** argv);

}  // namespace gz::bench
