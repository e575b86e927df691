// Device-side payload verdicts, reported with the CPU path's messages.
#include "compressors/payload_status.h"

#include "common/error.h"

namespace gz {

std::string describe(const PayloadStatus& s) { return wire::describe(static_cast<PayloadCheck>(s.code), s.detail); }

void throw_if_failed(const PayloadStatus& s) {
  if (s.code != 0) GZ_THROW(PayloadError, "(checked on the device) ", describe(s));
}

#if !GZ_HAVE_CUDA
void check_payload_status(const PayloadStatus*, Stream) {
  GZ_THROW(InvalidArgument, "check_payload_status: this build of gradzip has no CUDA support");
}
#endif

}  // namespace gz
