#include "compressors/wire_format.h"

#include <bit>
#include <cstring>

#include "common/error.h"
#include "kernels/onebit.h"

static_assert(std::endian::native == std::endian::little,
              "gradzip's wire format is little-endian and so far only little-endian hosts are supported");

namespace gz::wire {
namespace {

bool known_codec(std::uint16_t c) {
  return c >= static_cast<std::uint16_t>(CodecId::None) && c <= static_cast<std::uint16_t>(CodecId::TopK);
}

}  // namespace

std::uint64_t body_bytes(CodecId codec, std::uint32_t param, std::uint64_t count) {
  switch (codec) {
    case CodecId::None:
      return 4 * count;
    case CodecId::Fp16:
    case CodecId::Bf16:
      return 2 * count;
    case CodecId::OneBit:
      return 8 * kernels::onebit_blocks(count, param) + 4 * kernels::onebit_words(count);
    case CodecId::TopK:
      return 8 * static_cast<std::uint64_t>(param);
  }
  return 0;
}

void write_header(const Header& h, std::byte* dst) { std::memcpy(dst, &h, kHeaderBytes); }

Header read_header(const std::byte* payload, std::size_t size) {
  if (!payload && size) GZ_THROW(PayloadError, "payload pointer is null");
  if (size < kHeaderBytes)
    GZ_THROW(PayloadError, "payload truncated: ", size, " bytes, the header alone is ", kHeaderBytes);
  Header h;
  std::memcpy(&h, payload, kHeaderBytes);
  if (h.magic != kMagic) GZ_THROW(PayloadError, "not a gradzip payload: bad magic 0x", std::hex, h.magic);
  if (h.version != kVersion)
    GZ_THROW(PayloadError, "unsupported wire format version ", h.version, " (this build reads ", kVersion, ")");
  const auto codec = static_cast<std::uint16_t>(h.codec);
  if (!known_codec(codec)) GZ_THROW(PayloadError, "unknown codec id ", codec, " in payload header");
  if (h.flags != 0) GZ_THROW(PayloadError, "reserved header flags set: 0x", std::hex, h.flags);
  if (h.count > kMaxCount) GZ_THROW(PayloadError, "absurd element count ", h.count, " (limit 2^40)");
  switch (h.codec) {
    case CodecId::None:
    case CodecId::Fp16:
    case CodecId::Bf16:
      if (h.param != 0) GZ_THROW(PayloadError, codec_name(h.codec), " payload with non-zero param ", h.param);
      break;
    case CodecId::OneBit:
      if (h.param == 0) GZ_THROW(PayloadError, "onebit payload with block size 0");
      break;
    case CodecId::TopK:
      if (h.count > kMaxTopkCount) GZ_THROW(PayloadError, "topk payload count ", h.count, " exceeds u32 indices");
      if (h.param > h.count)
        GZ_THROW(PayloadError, "topk payload has ", h.param, " entries for only ", h.count, " elements");
      break;
  }
  const std::uint64_t want = body_bytes(h.codec, h.param, h.count);
  if (h.body_bytes != want)
    GZ_THROW(PayloadError, codec_name(h.codec), " header says ", h.body_bytes, " body bytes, the format needs ", want);
  if (size - kHeaderBytes != h.body_bytes)
    GZ_THROW(PayloadError, "payload is ", size, " bytes but header + body is ", kHeaderBytes + h.body_bytes,
             size - kHeaderBytes < h.body_bytes ? " (truncated)" : " (trailing bytes)");
  return h;
}

void expect(const Header& h, CodecId codec, std::uint64_t count, const std::uint32_t* param) {
  if (h.codec != codec)
    GZ_THROW(PayloadError, "payload was encoded by ", codec_name(h.codec), ", this decoder is ", codec_name(codec));
  if (h.count != count)
    GZ_THROW(PayloadError, "payload holds ", h.count, " elements, the output buffer has ", count);
  if (param && h.param != *param)
    GZ_THROW(PayloadError, codec_name(codec), " payload parameter ", h.param, " differs from the decoder's ", *param);
}

void check_topk_indices(const std::uint32_t* idx, std::size_t k, std::uint64_t n) {
  for (std::size_t j = 0; j < k; ++j) {
    if (idx[j] >= n) GZ_THROW(PayloadError, "topk index ", idx[j], " at entry ", j, " is out of range (n = ", n, ")");
    if (j > 0 && idx[j] <= idx[j - 1])
      GZ_THROW(PayloadError, "topk indices not strictly increasing at entry ", j, " (", idx[j - 1], " then ", idx[j],
               ")");
  }
}

}  // namespace gz::wire
