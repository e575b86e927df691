// The codec registry: every codec gradzip knows, one line each.
//
//   X(enumerator, wire id, name, body layout)
//
//   - enumerator: CodecId::<enumerator>.
//   - wire id: the number in every payload header. Part of the format: never
//     change or reuse one. Lines stay in id order, so the last is the largest.
//   - name: the spec name, which is also the name of the codec's descriptor,
//     gz::codecs::<name>, defined in compressors/<codec>.cc (descriptor.h).
//   - body layout: the kernels/ struct that sizes the body from the header
//     (check_param, body_bytes) on the host and on the device.
//
// Everything else (spec parsing, make_codec, the allreduce's choices and
// bounds, Python, the sweep, the benchmarks, the generic tests) iterates over
// the descriptors; only the header check, which also runs in CUDA kernels,
// switches on the id (wire_format.h), and that switch is generated from this
// list. Adding a codec: docs/ARCHITECTURE.md, "Adding a codec".
#pragma once

#include <cstdint>

#include "kernels/cast.h"
#include "kernels/fp8.h"
#include "kernels/onebit.h"
#include "kernels/qsgd.h"
#include "kernels/topk.h"

#define GZ_CODEC_REGISTRY(X)                 \
  X(None, 1, none, kernels::NoneLayout)      \
  X(Fp16, 2, fp16, kernels::CastLayout)      \
  X(Bf16, 3, bf16, kernels::CastLayout)      \
  X(Onebit, 4, onebit, kernels::OnebitLayout) \
  X(TopK, 5, topk, kernels::TopkLayout)      \
  X(Qsgd, 6, qsgd, kernels::QsgdLayout)      \
  X(Fp8, 7, fp8, kernels::Fp8Layout)

namespace gz {

/// Codec identifiers; the numbers are part of the wire format.
enum class CodecId : std::uint16_t {
#define GZ_CODEC_ENUMERATOR(E, id, name, layout) E = id,
  GZ_CODEC_REGISTRY(GZ_CODEC_ENUMERATOR)
#undef GZ_CODEC_ENUMERATOR
};

/// The largest wire id (ids run 1..kLastCodecId).
inline constexpr std::uint16_t kLastCodecId = [] {
  std::uint16_t last = 0;
#define GZ_CODEC_LAST(E, id, name, layout) last = id;
  GZ_CODEC_REGISTRY(GZ_CODEC_LAST)
#undef GZ_CODEC_LAST
  return last;
}();

struct CodecDescriptor;

namespace codecs {
#define GZ_CODEC_DESCRIPTOR(E, id, name, layout) extern const CodecDescriptor name;
GZ_CODEC_REGISTRY(GZ_CODEC_DESCRIPTOR)
#undef GZ_CODEC_DESCRIPTOR
}  // namespace codecs

}  // namespace gz
