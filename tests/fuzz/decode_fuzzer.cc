// libFuzzer target: feeds arbitrary bytes to every codec's decoder.
// Byte 0 picks the decoder; the rest is the payload. The element count given
// to the decoder is the one the payload claims (capped), so the fuzzer can
// get past the count check and into the body validation.
// Byte 0 with its top bit set picks the bare framing of the allreduce's
// exchanges (comm/engine/allreduce_run.h, Run::arrived): bytes 1-4 are the
// element count the receiver expects (little-endian, capped), the rest is
// the body a peer sent; the receiver writes the codec's header for that
// count in front of it (Codec::write_header) and decodes, as the engine does.
// Contract checked: a decode either succeeds or throws gz::PayloadError /
// gz::InvalidArgument, never crashes or reads out of bounds (ASan), and a
// rejected payload leaves the output untouched.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "fuzz_specs.h"

namespace {

// A bare body of a fixed-size codec's payload: the expected header, then the
// bytes as they arrived, in a buffer sized exactly to them (ASan sees an
// overread); decoded as Run::arrived hands it on.
int bare_body(const gz::Codec& codec, const std::uint8_t* data, std::size_t size) {
  if (!codec.fixed_size() || size < 4) return 0;
  std::uint32_t count = 0;
  std::memcpy(&count, data, sizeof count);
  const std::size_t n = count & 0xFFFFu;
  const std::size_t body = size - 4, bytes = gz::wire::kHeaderBytes + body;
  std::unique_ptr<std::uint32_t[]> buf(new std::uint32_t[(bytes + 3) / 4]);
  auto* payload = reinterpret_cast<std::byte*>(buf.get());
  codec.write_header(n, payload);
  std::memcpy(payload + gz::wire::kHeaderBytes, data + 4, body);
  std::vector<float> out(n, 3.0f);
  std::vector<std::byte> ws(codec.workspace_bytes(n, gz::Device::Cpu));
  const gz::PayloadRef p{payload, bytes};
  try {
    const_cast<gz::Codec&>(codec).decode_sum(std::span(&p, 1), out.data(), n, 0.5f,
                                             {gz::Device::Cpu, nullptr, ws.data(), ws.size()});
  } catch (const gz::PayloadError&) {
    for (float x : out)
      if (x != 3.0f) std::abort();  // a rejected body must not touch the output
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static std::vector<std::unique_ptr<gz::Codec>> codecs = [] {
    std::vector<std::unique_ptr<gz::Codec>> v;
    for (const std::string& s : gz::fuzz::specs()) v.push_back(gz::make_codec(s));
    return v;
  }();
  if (data[0] & 0x80) return bare_body(*codecs[(data[0] & 0x7f) % codecs.size()], data + 1, size - 1);
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
