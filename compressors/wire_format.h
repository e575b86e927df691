// The wire format of a compressed buffer: a fixed 32-byte little-endian header
// followed by the codec's body. docs/wire_format.md is the byte-level spec.
//
//   offset size field
//        0    4 magic        "GZP1" (0x31505A47)
//        4    2 version      1
//        6    2 codec        CodecId
//        8    4 param        onebit: block size; topk: entries in this payload; else 0
//       12    4 flags        0 (reserved; a payload with other bits set is rejected)
//       16    8 count        elements n of the gradient buffer
//       24    8 body_bytes   bytes after the header
//
// Bodies (n elements, all little-endian):
//   none     n x f32
//   fp16     n x u16 binary16
//   bf16     n x u16 bfloat16
//   onebit   ceil(n/B) x {f32 pos_mean, f32 neg_mean}, then ceil(n/32) x u32 sign words
//            (bit j of word w is element 32w+j; 1 = negative)
//   topk     K x u32 index (strictly increasing, < n), then K x f32 value
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/spec.h"

namespace gz::wire {

inline constexpr std::uint32_t kMagic = 0x31505A47u;  // "GZP1"
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 32;
/// Largest element count a payload may claim (2^40): guards size arithmetic.
inline constexpr std::uint64_t kMaxCount = std::uint64_t{1} << 40;
/// Top-k indices are u32.
inline constexpr std::uint64_t kMaxTopkCount = 0xFFFFFFFFu;

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

/// Body bytes a payload of `codec` with `param` and `count` must have.
std::uint64_t body_bytes(CodecId codec, std::uint32_t param, std::uint64_t count);

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
