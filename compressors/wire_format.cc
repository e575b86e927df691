#include "compressors/wire_format.h"

#include <bit>
#include <cstring>
#include <sstream>

#include "common/error.h"
#include "compressors/descriptor.h"

static_assert(std::endian::native == std::endian::little,
              "gradzip's wire format is little-endian and so far only little-endian hosts are supported");

namespace gz::wire {
namespace {

const char* name_of(std::uint64_t codec) {
  const CodecDescriptor* d = codec <= kLastCodecId ? find_codec(static_cast<CodecId>(codec)) : nullptr;
  return d ? d->name.data() : "unknown codec";
}

std::string bad_param(std::uint64_t codec_reason, std::uint64_t param, std::uint64_t count) {
  const auto codec = static_cast<std::uint32_t>(codec_reason), reason = static_cast<std::uint32_t>(codec_reason >> 32);
  const CodecDescriptor* d = codec <= kLastCodecId ? find_codec(static_cast<CodecId>(codec)) : nullptr;
  if (d && d->describe_param) return d->describe_param(reason, static_cast<std::uint32_t>(param), count);
  std::ostringstream os;
  os << name_of(codec) << " payload with invalid param " << param << " for " << count << " elements";
  return os.str();
}

void throw_if_bad(const HeaderVerdict& v) {
  if (v.code != PayloadCheck::Ok) GZ_THROW(PayloadError, describe(v.code, v.detail));
}

}  // namespace

std::string describe(PayloadCheck code, const std::uint64_t* d) {
  std::ostringstream os;
  switch (code) {
    case PayloadCheck::Ok: return "";
    case PayloadCheck::BadMagic: os << "not a gradzip payload: bad magic 0x" << std::hex << d[0]; break;
    case PayloadCheck::BadVersion:
      os << "unsupported wire format version " << d[0] << " (this build reads " << kVersion << ")";
      break;
    case PayloadCheck::UnknownCodec: os << "unknown codec id " << d[0] << " in payload header"; break;
    case PayloadCheck::BadFlags: os << "reserved header flags set: 0x" << std::hex << d[0]; break;
    case PayloadCheck::AbsurdCount: os << "absurd element count " << d[0] << " (limit 2^40)"; break;
    case PayloadCheck::BadParam: os << bad_param(d[0], d[1], d[2]); break;
    case PayloadCheck::BodyBytesMismatch:
      os << name_of(d[2]) << " header says " << d[0] << " body bytes, the format needs " << d[1];
      break;
    case PayloadCheck::SizeMismatch:
      os << "payload is " << d[0] << " bytes but header + body is " << d[1]
         << (d[0] < d[1] ? " (truncated)" : " (trailing bytes)");
      break;
    case PayloadCheck::CodecMismatch:
      os << "payload was encoded by " << name_of(d[0]) << ", this decoder is " << name_of(d[1]);
      break;
    case PayloadCheck::CountMismatch:
      os << "payload holds " << d[0] << " elements, the output buffer has " << d[1];
      break;
    case PayloadCheck::ParamMismatch:
      os << name_of(d[0]) << " payload parameter " << d[1] << " differs from the decoder's " << d[2];
      break;
    case PayloadCheck::TopkIndexRange:
      os << "topk index " << d[1] << " at entry " << d[0] << " is out of range (n = " << d[2] << ")";
      break;
    case PayloadCheck::TopkIndexOrder:
      os << "topk indices not strictly increasing at entry " << d[0] << " (" << d[1] << " then " << d[2] << ")";
      break;
    default: os << "unknown payload check " << static_cast<std::uint32_t>(code); break;
  }
  return os.str();
}

void write_header(const Header& h, std::byte* dst) { std::memcpy(dst, &h, kHeaderBytes); }

Header read_header(const std::byte* payload, std::size_t size) {
  if (!payload && size) GZ_THROW(PayloadError, "payload pointer is null");
  if (size < kHeaderBytes)
    GZ_THROW(PayloadError, "payload truncated: ", size, " bytes, the header alone is ", kHeaderBytes);
  std::uint32_t w[8];
  std::memcpy(w, payload, kHeaderBytes);
  throw_if_bad(check_structure(w, size));
  Header h;
  std::memcpy(&h, w, kHeaderBytes);
  return h;
}

void expect(const Header& h, CodecId codec, std::uint64_t count, const std::uint32_t* param) {
  std::uint32_t w[8];
  std::memcpy(w, &h, kHeaderBytes);
  throw_if_bad(check_expected(w, static_cast<std::uint32_t>(codec), count, param != nullptr, param ? *param : 0));
}

void check_topk_indices(const std::uint32_t* idx, std::size_t k, std::uint64_t n) {
  for (std::size_t j = 0; j < k; ++j) {
    if (idx[j] >= n) throw_if_bad(verdict(PayloadCheck::TopkIndexRange, j, idx[j], n));
    if (j > 0 && idx[j] <= idx[j - 1]) throw_if_bad(verdict(PayloadCheck::TopkIndexOrder, j, idx[j - 1], idx[j]));
  }
}

}  // namespace gz::wire
