// libFuzzer target: feeds arbitrary bytes to every codec's decoder.
// Byte 0 picks the decoder; the rest is the payload. The element count given
// to the decoder is the one the payload claims (capped), so the fuzzer can
// get past the count check and into the body validation.
// Contract checked: a decode either succeeds or throws gz::PayloadError /
// gz::InvalidArgument, never crashes or reads out of bounds (ASan), and a
// rejected payload leaves the output untouched.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "fuzz_specs.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static std::vector<std::unique_ptr<gz::Codec>> codecs = [] {
    std::vector<std::unique_ptr<gz::Codec>> v;
    for (const std::string& s : gz::fuzz::specs()) v.push_back(gz::make_codec(s));
    return v;
  }();
  gz::Codec& codec = *codecs[data[0] % codecs.size()];
  const std::size_t bytes = size - 1;
  // An aligned copy sized exactly to the input, so ASan sees any overread.
  std::unique_ptr<std::uint32_t[]> buf(new std::uint32_t[bytes / 4 + 1]);
  std::memcpy(buf.get(), data + 1, bytes);
  std::uint64_t n = 0;
  if (bytes >= gz::wire::kHeaderBytes) std::memcpy(&n, data + 1 + 16, sizeof n);
  if (n > (1u << 16)) n = 1u << 16;
  std::vector<float> out(n, 3.0f);
  std::vector<std::byte> ws(codec.workspace_bytes(n, gz::Device::Cpu));
  try {
    codec.decode_accumulate(reinterpret_cast<const std::byte*>(buf.get()), bytes, out.data(), n,
                            {gz::Device::Cpu, nullptr, ws.data(), ws.size()});
  } catch (const gz::InvalidArgument&) {  // PayloadError derives from it
    for (float x : out)
      if (x != 3.0f) std::abort();  // a rejected payload must not touch the output
  }
  return 0;
}
