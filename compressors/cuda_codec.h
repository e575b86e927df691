// Pieces the codecs' CUDA paths share: the payload header as a blob the body
// kernel writes, and the device-side payload checks that feed a
// PayloadStatus (compressors/payload_status.h). Internal to compressors/;
// only built with CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/stream.h"
#include "compressors/payload_status.h"
#include "compressors/spec.h"
#include "kernels/cuda.h"

namespace gz::cuda_codec {

/// The 32-byte header of a payload, to be stored at `payload` by a kernel.
kernels::cuda::Blob32 header_blob(CodecId codec, std::uint32_t param, std::uint64_t count, std::uint64_t body_bytes,
                                  std::byte* payload);

/// Checks the header of a device payload of `bytes` >= 32 bytes against what
/// the decoder expects (see check_header) and records the first error in
/// *status, unless *status already holds one. `host_size_ok` = false marks a
/// size the host already knows is wrong; the status then always ends bad.
void validate_header(const std::byte* payload, std::uint64_t bytes, CodecId codec, std::uint64_t n, bool fixed_param,
                     std::uint32_t param, bool host_size_ok, PayloadStatus* status, Stream stream);

/// Checks k top-k indices (each < n, strictly increasing) when the status is
/// still clean, and records the first bad entry the way wire::check_topk_indices
/// names it. Two launches (check, then name the lowest bad entry).
void validate_topk_indices(const std::uint32_t* idx, std::size_t k, std::uint64_t n, PayloadStatus* status,
                           Stream stream);

}  // namespace gz::cuda_codec
