// Payload validation that runs on the device: a status word the CUDA decode
// path writes instead of throwing. The checks themselves are the host/device
// functions of wire_format.h, which the CPU path runs too.
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

namespace gz {

/// A decode's verdict, in device memory (40 bytes, 8-byte aligned).
struct PayloadStatus {
  std::uint32_t code;            ///< PayloadCheck of the first error; 0 while valid
  std::uint32_t reserved;
  std::uint64_t detail[3];       ///< values for the message (see PayloadCheck)
  std::uint64_t first_bad_entry; ///< internal to the top-k index check: 2^64-1 - entry; 0 = none
};

using wire::check_header;

/// The message the CPU path would give for this status ("" when valid).
std::string describe(const PayloadStatus& s);

/// Throws PayloadError with describe(s) unless s.code == 0.
void throw_if_failed(const PayloadStatus& s);

/// Copies a device status to the host, synchronizes `stream`, and throws
/// PayloadError if a decode reported into it failed. Needs a CUDA build.
void check_payload_status(const PayloadStatus* device_status, Stream stream);

}  // namespace gz
