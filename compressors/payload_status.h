// Payload validation that runs on the device: a status word the CUDA decode
// path writes instead of throwing, and the header check it runs, written once
// as __host__ __device__ code so the host can test it against
// wire::read_header + wire::expect (tests/gpu/test_payload_status.cc).
//
// Contract (also in compressors/codec.h):
//   - A PayloadStatus lives in device memory. Zero it (cudaMemsetAsync) before
//     the first decode that reports into it.
//   - Every CUDA decode validates the payload on the device, in stream order,
//     before its decode kernels run; those kernels do nothing unless the status
//     is still clean. So a malformed payload leaves `out` unchanged.
//   - The first error is kept ("sticky"): a later decode that shares the status
//     sees it and does nothing, so a sequence of decodes into one output stops
//     at the first bad payload.
//   - Read it back with check_payload_status() (synchronizes the stream), or
//     copy it yourself and call throw_if_failed().
#pragma once

#include <cstdint>
#include <string>

#include "common/stream.h"
#include "compressors/wire_format.h"
#include "kernels/hd.h"

namespace gz {

/// Why a payload was rejected. 0 = valid (so far). Values mirror the checks of
/// wire::read_header, wire::expect and wire::check_topk_indices, in their order.
enum class PayloadCheck : std::uint32_t {
  Ok = 0,
  BadMagic,           ///< detail: magic
  BadVersion,         ///< detail: version
  UnknownCodec,       ///< detail: codec id
  BadFlags,           ///< detail: flags
  AbsurdCount,        ///< detail: count
  NonzeroParam,       ///< detail: codec id, param
  ZeroBlock,          ///< onebit block size 0
  TopkCountTooLarge,  ///< detail: count
  TopkParamOverCount, ///< detail: param, count
  BodyBytesMismatch,  ///< detail: header body_bytes, bytes the format needs, codec id
  SizeMismatch,       ///< detail: payload size, header + body
  CodecMismatch,      ///< detail: payload codec, decoder codec
  CountMismatch,      ///< detail: payload count, decoder count
  ParamMismatch,      ///< detail: codec, payload param, decoder param
  TopkIndexRange,     ///< detail: entry, index, n
  TopkIndexOrder,     ///< detail: entry, previous index, index
};

/// A decode's verdict, in device memory (40 bytes, 8-byte aligned).
struct PayloadStatus {
  std::uint32_t code;            ///< PayloadCheck of the first error; 0 while valid
  std::uint32_t reserved;
  std::uint64_t detail[3];       ///< values for the message (see PayloadCheck)
  std::uint64_t first_bad_entry; ///< internal to the top-k index check: 2^64-1 - entry; 0 = none
};

/// The result of check_header.
struct HeaderVerdict {
  PayloadCheck code = PayloadCheck::Ok;
  std::uint64_t detail[3] = {0, 0, 0};
};

namespace wire_hd {

// The header fields as 8 little-endian 32-bit words (compressors/wire_format.h).
GZ_HD std::uint64_t word64(const std::uint32_t* w, int i) {
  return static_cast<std::uint64_t>(w[i]) | (static_cast<std::uint64_t>(w[i + 1]) << 32);
}

constexpr std::uint32_t id(CodecId c) { return static_cast<std::uint32_t>(c); }

/// Body bytes of a payload: wire::body_bytes, for host and device (param >= 1 for onebit).
GZ_HD std::uint64_t body_bytes(std::uint32_t codec, std::uint32_t param, std::uint64_t count) {
  if (codec == id(CodecId::None)) return 4 * count;
  if (codec == id(CodecId::Fp16) || codec == id(CodecId::Bf16)) return 2 * count;
  if (codec == id(CodecId::OneBit)) return 8 * ((count + param - 1) / param) + 4 * ((count + 31) / 32);
  if (codec == id(CodecId::TopK)) return 8 * static_cast<std::uint64_t>(param);
  return 0;
}

}  // namespace wire_hd

/// Checks a header (8 words) of a payload of `size` >= 32 bytes against what the
/// decoder expects: codec `want_codec`, `want_count` elements and, when
/// `fixed_param`, parameter `want_param`. The same checks, in the same order,
/// as wire::read_header then wire::expect.
GZ_HD HeaderVerdict check_header(const std::uint32_t* w, std::uint64_t size, std::uint32_t want_codec,
                                 std::uint64_t want_count, bool fixed_param, std::uint32_t want_param) {
  HeaderVerdict v;
  auto fail = [&v](PayloadCheck c, std::uint64_t a = 0, std::uint64_t b = 0, std::uint64_t d = 0) {
    v.code = c;
    v.detail[0] = a;
    v.detail[1] = b;
    v.detail[2] = d;
    return v;
  };
  const std::uint32_t magic = w[0], version = w[1] & 0xFFFFu, codec = w[1] >> 16, param = w[2], flags = w[3];
  const std::uint64_t count = wire_hd::word64(w, 4), body = wire_hd::word64(w, 6);
  using wire_hd::id;
  if (magic != wire::kMagic) return fail(PayloadCheck::BadMagic, magic);
  if (version != wire::kVersion) return fail(PayloadCheck::BadVersion, version);
  if (codec < id(CodecId::None) || codec > id(CodecId::TopK)) return fail(PayloadCheck::UnknownCodec, codec);
  if (flags != 0) return fail(PayloadCheck::BadFlags, flags);
  if (count > wire::kMaxCount) return fail(PayloadCheck::AbsurdCount, count);
  if (codec <= id(CodecId::Bf16) && param != 0) return fail(PayloadCheck::NonzeroParam, codec, param);
  if (codec == id(CodecId::OneBit) && param == 0) return fail(PayloadCheck::ZeroBlock);
  if (codec == id(CodecId::TopK)) {
    if (count > wire::kMaxTopkCount) return fail(PayloadCheck::TopkCountTooLarge, count);
    if (param > count) return fail(PayloadCheck::TopkParamOverCount, param, count);
  }
  const std::uint64_t want_body = wire_hd::body_bytes(codec, param, count);
  if (body != want_body) return fail(PayloadCheck::BodyBytesMismatch, body, want_body, codec);
  if (size - wire::kHeaderBytes != body) return fail(PayloadCheck::SizeMismatch, size, wire::kHeaderBytes + body);
  if (codec != want_codec) return fail(PayloadCheck::CodecMismatch, codec, want_codec);
  if (count != want_count) return fail(PayloadCheck::CountMismatch, count, want_count);
  if (fixed_param && param != want_param) return fail(PayloadCheck::ParamMismatch, codec, param, want_param);
  return v;
}

/// The message the CPU path would give for this status ("" when valid).
std::string describe(const PayloadStatus& s);

/// Throws PayloadError with describe(s) unless s.code == 0.
void throw_if_failed(const PayloadStatus& s);

/// Copies a device status to the host, synchronizes `stream`, and throws
/// PayloadError if a decode reported into it failed. Needs a CUDA build.
void check_payload_status(const PayloadStatus* device_status, Stream stream);

}  // namespace gz
