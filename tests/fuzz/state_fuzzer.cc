// libFuzzer target: ErrorFeedback::restore, the parser of saved
// error-feedback states (checkpoint files). Odd byte 0: the rest is restored
// as it is, so the checksum refuses nearly all of it; even byte 0: the
// fuzzer's bytes get a correct checksum first (what a deliberate edit of a
// file would have), so the fields behind it are fuzzed too.
// Contract: restore succeeds, or throws InvalidArgument; never a crash, an
// out-of-bounds read, undefined behaviour, a length_error or an allocation
// beyond what the input's own size allows (libFuzzer's -rss_limit_mb).
// A restored state saves back to exactly the bytes it was given (version 1,
// which has no checksum, to those bytes as version 2: its version field 2
// and the checksum appended).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/engine/allreduce.h"
#include "common/bytes.h"
#include "common/checksum.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0 && in.size() >= 8) {
    in.resize(in.size() - 8);
    gz::bytes::Writer(in).put(gz::checksum64(in));
  }
  gz::ErrorFeedback state;
  try {
    state.restore(in);
  } catch (const gz::InvalidArgument&) {
    return 0;
  }
  std::string want = in;
  std::uint32_t version = 0;
  std::memcpy(&version, in.data() + 4, sizeof version);  // restore read it: the input has it
  if (version == 1) {
    const std::uint32_t now = 2;
    std::memcpy(want.data() + 4, &now, sizeof now);
    gz::bytes::Writer(want).put(gz::checksum64(want));
  }
  if (state.save() != want) std::abort();
  return 0;
}
