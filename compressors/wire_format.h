// The wire format of a compressed buffer: a fixed 32-byte little-endian header
// followed by the codec's body. docs/wire_format.md is the byte-level spec.
//
//   offset size field
//        0    4 magic        "GZP1" (0x31505A47)
//        4    2 version      1
//        6    2 codec        CodecId
//        8    4 param        the codec's (its body layout says what it holds)
//       12    4 flags        0 (reserved; a payload with other bits set is rejected)
//       16    8 count        elements n of the gradient buffer
//       24    8 body_bytes   bytes after the header
//
// Bodies: each codec's body layout, in its kernels/<codec>.h (the *Layout
// struct that registry.h names), written down in docs/wire_format.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "compressors/registry.h"
#include "kernels/hd.h"

namespace gz::wire {

inline constexpr std::uint32_t kMagic = 0x31505A47u;  // "GZP1"
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 32;
/// Largest element count a payload may claim (2^40): guards size arithmetic.
inline constexpr std::uint64_t kMaxCount = std::uint64_t{1} << 40;

struct Header {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  CodecId codec = CodecId::None;
  std::uint32_t param = 0;
  std::uint32_t flags = 0;
  std::uint64_t count = 0;
  std::uint64_t body_bytes = 0;
};
static_assert(sizeof(Header) == kHeaderBytes, "header layout must be packed to 32 bytes");

/// 0 when `param` is a valid header param of `codec` for `count` elements,
/// else the codec layout's reason (~0u for an id no codec has). The one
/// switch on codec ids, generated from the registry: it runs on the device too.
GZ_HD std::uint32_t check_param(std::uint32_t codec, std::uint32_t param, std::uint64_t count) {
  switch (codec) {
#define GZ_CODEC_CHECK_PARAM(E, id, name, layout) \
  case id: return layout::check_param(param, count);
    GZ_CODEC_REGISTRY(GZ_CODEC_CHECK_PARAM)
#undef GZ_CODEC_CHECK_PARAM
  }
  return ~0u;
}

/// Body bytes a payload of `codec` with a valid `param` and `count` has (0 for
/// an id no codec has).
GZ_HD std::uint64_t body_bytes(CodecId codec, std::uint32_t param, std::uint64_t count) {
  switch (static_cast<std::uint32_t>(codec)) {
#define GZ_CODEC_BODY_BYTES(E, id, name, layout) \
  case id: return layout::body_bytes(param, count);
    GZ_CODEC_REGISTRY(GZ_CODEC_BODY_BYTES)
#undef GZ_CODEC_BODY_BYTES
  }
  return 0;
}

/// Writes the header to `dst` (32 bytes) in little-endian order.
void write_header(const Header& h, std::byte* dst);

/// Reads and validates a payload of `size` bytes: header fields, and that the
/// body has exactly the size the header implies. Throws PayloadError.
Header read_header(const std::byte* payload, std::size_t size);

/// Checks that a payload is what a decoder expects: same codec, `count`
/// elements and, when `param` is given, the same parameter. Throws PayloadError.
void expect(const Header& h, CodecId codec, std::uint64_t count, const std::uint32_t* param = nullptr);

/// Checks top-k indices: each < n and strictly increasing. Throws PayloadError
/// naming the first bad position.
void check_topk_indices(const std::uint32_t* idx, std::size_t k, std::uint64_t n);

}  // namespace gz::wire

namespace gz {

/// Why a payload was rejected; 0 = valid. The checks below, in their order.
enum class PayloadCheck : std::uint32_t {
  Ok = 0,
  BadMagic,           ///< detail: magic
  BadVersion,         ///< detail: version
  UnknownCodec,       ///< detail: codec id
  BadFlags,           ///< detail: flags
  AbsurdCount,        ///< detail: count
  BadParam,           ///< detail: codec id | reason << 32 (the layout's check_param), param, count
  BodyBytesMismatch,  ///< detail: header body_bytes, bytes the format needs, codec id
  SizeMismatch,       ///< detail: payload size, header + body
  CodecMismatch,      ///< detail: payload codec, decoder codec
  CountMismatch,      ///< detail: payload count, decoder count
  ParamMismatch,      ///< detail: codec, payload param, decoder param
  TopkIndexRange,     ///< detail: entry, index, n
  TopkIndexOrder,     ///< detail: entry, previous index, index
};

struct HeaderVerdict {
  PayloadCheck code = PayloadCheck::Ok;
  std::uint64_t detail[3] = {0, 0, 0};
};

namespace wire {

// The one implementation of the header checks, for the host (read_header,
// expect) and for the device (the CUDA decoders' validation kernel).
// `w` is the header as 8 little-endian 32-bit words.

GZ_HD std::uint64_t word64(const std::uint32_t* w, int i) {
  return static_cast<std::uint64_t>(w[i]) | (static_cast<std::uint64_t>(w[i + 1]) << 32);
}

GZ_HD HeaderVerdict verdict(PayloadCheck c, std::uint64_t a = 0, std::uint64_t b = 0, std::uint64_t d = 0) {
  HeaderVerdict v;
  v.code = c;
  v.detail[0] = a;
  v.detail[1] = b;
  v.detail[2] = d;
  return v;
}

/// The header on its own, for a payload of `size` >= 32 bytes.
GZ_HD HeaderVerdict check_structure(const std::uint32_t* w, std::uint64_t size) {
  const std::uint32_t magic = w[0], version = w[1] & 0xFFFFu, codec = w[1] >> 16, param = w[2], flags = w[3];
  const std::uint64_t count = word64(w, 4), body = word64(w, 6);
  if (magic != kMagic) return verdict(PayloadCheck::BadMagic, magic);
  if (version != kVersion) return verdict(PayloadCheck::BadVersion, version);
  if (codec < 1 || codec > kLastCodecId) return verdict(PayloadCheck::UnknownCodec, codec);
  if (flags != 0) return verdict(PayloadCheck::BadFlags, flags);
  if (count > kMaxCount) return verdict(PayloadCheck::AbsurdCount, count);
  const std::uint32_t reason = check_param(codec, param, count);
  if (reason == ~0u) return verdict(PayloadCheck::UnknownCodec, codec);
  if (reason != 0) return verdict(PayloadCheck::BadParam, codec | (std::uint64_t{reason} << 32), param, count);
  const std::uint64_t want_body = body_bytes(static_cast<CodecId>(codec), param, count);
  if (body != want_body) return verdict(PayloadCheck::BodyBytesMismatch, body, want_body, codec);
  if (size - kHeaderBytes != body) return verdict(PayloadCheck::SizeMismatch, size, kHeaderBytes + body);
  return {};
}

/// A structurally valid header against what the decoder expects: codec
/// `want_codec`, `want_count` elements and, when `fixed_param`, `want_param`.
GZ_HD HeaderVerdict check_expected(const std::uint32_t* w, std::uint32_t want_codec, std::uint64_t want_count,
                                   bool fixed_param, std::uint32_t want_param) {
  const std::uint32_t codec = w[1] >> 16, param = w[2];
  const std::uint64_t count = word64(w, 4);
  if (codec != want_codec) return verdict(PayloadCheck::CodecMismatch, codec, want_codec);
  if (count != want_count) return verdict(PayloadCheck::CountMismatch, count, want_count);
  if (fixed_param && param != want_param) return verdict(PayloadCheck::ParamMismatch, codec, param, want_param);
  return {};
}

/// Both, in order.
GZ_HD HeaderVerdict check_header(const std::uint32_t* w, std::uint64_t size, std::uint32_t want_codec,
                                 std::uint64_t want_count, bool fixed_param, std::uint32_t want_param) {
  const HeaderVerdict v = check_structure(w, size);
  return v.code != PayloadCheck::Ok ? v : check_expected(w, want_codec, want_count, fixed_param, want_param);
}

/// The message for a rejected payload ("" for Ok).
std::string describe(PayloadCheck code, const std::uint64_t* detail);

}  // namespace wire
}  // namespace gz
