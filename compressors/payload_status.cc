// Messages for device-side payload verdicts, worded like the CPU checks in
// compressors/wire_format.cc so both paths report a bad payload the same way.
#include "compressors/payload_status.h"

#include <sstream>

#include "common/error.h"

namespace gz {
namespace {

const char* name_of(std::uint64_t codec) {
  if (codec < 1 || codec > 5) return "unknown codec";
  return codec_name(static_cast<CodecId>(codec));
}

}  // namespace

std::string describe(const PayloadStatus& s) {
  const auto* d = s.detail;
  std::ostringstream os;
  switch (static_cast<PayloadCheck>(s.code)) {
    case PayloadCheck::Ok: return "";
    case PayloadCheck::BadMagic: os << "not a gradzip payload: bad magic 0x" << std::hex << d[0]; break;
    case PayloadCheck::BadVersion:
      os << "unsupported wire format version " << d[0] << " (this build reads " << wire::kVersion << ")";
      break;
    case PayloadCheck::UnknownCodec: os << "unknown codec id " << d[0] << " in payload header"; break;
    case PayloadCheck::BadFlags: os << "reserved header flags set: 0x" << std::hex << d[0]; break;
    case PayloadCheck::AbsurdCount: os << "absurd element count " << d[0] << " (limit 2^40)"; break;
    case PayloadCheck::NonzeroParam: os << name_of(d[0]) << " payload with non-zero param " << d[1]; break;
    case PayloadCheck::ZeroBlock: os << "onebit payload with block size 0"; break;
    case PayloadCheck::TopkCountTooLarge: os << "topk payload count " << d[0] << " exceeds u32 indices"; break;
    case PayloadCheck::TopkParamOverCount:
      os << "topk payload has " << d[0] << " entries for only " << d[1] << " elements";
      break;
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
    default: os << "unknown payload status code " << s.code; break;
  }
  return os.str();
}

void throw_if_failed(const PayloadStatus& s) {
  if (s.code != 0) GZ_THROW(PayloadError, "(checked on the device) ", describe(s));
}

#if !GZ_HAVE_CUDA
void check_payload_status(const PayloadStatus*, Stream) {
  GZ_THROW(InvalidArgument, "check_payload_status: this build of gradzip has no CUDA support");
}
#endif

}  // namespace gz
