// The Codec interface: compress a float gradient with error feedback into a
// self-describing payload (compressors/wire_format.h), and add a payload's
// decoded values into an output buffer (or overwrite it with them, or with the
// sum of several payloads).
//
// Usage (host buffers), two phases as in CUB: sizes first, then the calls.
//
//   auto codec = gz::make_codec("topk:density=0.01");
//   std::vector<float> residual(n);                 // error feedback, starts at 0
//   std::vector<std::byte> payload(codec->max_payload_bytes(n));
//   std::vector<std::byte> ws(codec->workspace_bytes(n, gz::Device::Cpu));
//   gz::ExecContext ctx{gz::Device::Cpu, nullptr, ws.data(), ws.size()};
//   std::size_t bytes = codec->encode(grad, residual.data(), n, payload.data(), payload.size(), ctx);
//   codec->decode_accumulate(payload.data(), bytes, out, n, ctx);   // out += decoded
//   codec->decode_sum(payloads, out, n, 0.25f, ctx);                // out = (D(p0) + D(p1) + ...) / 4
//
// 16-bit gradients: the overloads with (void*, Dtype) take float32, float16
// or bfloat16 buffers (common/dtype.h); the float* ones are Dtype::Float32.
//   - encode widens each element exactly (v = float(grad) + residual), so the
//     payload of a 16-bit gradient is the payload of its float widening, and
//     the residual stays float. Without error feedback a 16-bit gradient is
//     first widened into the workspace (workspace_bytes(n, device, dtype)).
//   - decoding into a 16-bit output combines in float and rounds once to the
//     output type (round to nearest even; out of range -> inf, as torch's
//     .to()): out = round(combine(float(out), d, c)). decode_sum's sum of P
//     payloads accumulates in float (a tile on the CPU, a workspace buffer on
//     CUDA that the last payload's kernel adds and rounds into out: one pass
//     over out) and rounds once at the end. Same bits on the CPU and the GPU.
//
// Constraints:
//   - encode: v = grad + residual; payload = Q(v); residual = v - D(payload).
//     residual may be nullptr only when error feedback is off (spec "ef=off").
//   - decode / decode_accumulate / decode_sum validate every payload before
//     touching `out`; a malformed payload throws PayloadError and leaves `out`
//     unchanged. How decoded values land in `out` (add, overwrite, scale) is
//     kernels/combine.h's rule, the same bits on the CPU and the GPU.
//   - Payload buffers must be 4-byte aligned.
//   - Deterministic: the same input gives the same payload bits, on the CPU
//     and on the GPU.
//   - Scratch memory, two phases as in CUB: workspace_bytes(n, device), then
//     calls with ctx.workspace pointing at that many bytes. A call that needs
//     scratch and gets none, or too little, throws InvalidArgument; a Codec
//     never allocates. (Python's gradzip.Codec keeps a workspace per codec.)
//     A Codec holds no mutable state: calls with separate workspaces may run
//     concurrently.
//
// CUDA (ExecContext{Device::Cuda, stream, ...}; docs/cuda.md has the details):
//   - grad, residual, out and payload are device pointers; the work is queued
//     on ctx.stream. The payload is the same bytes the CPU path writes.
//   - Workspace: workspace_bytes(n, Device::Cuda) device bytes, 256-byte
//     aligned (at least kCudaStatusBytes: every CUDA call needs one); the same
//     workspace serves encode and decode, one call at a time per stream order.
//   - encode returns the payload size without synchronizing, except topk with
//     select=sample: its entry count is decided on the device, so that encode
//     synchronizes ctx.stream to read it back (and writes the header after).
//   - decoding validates the payloads on the device, in stream order,
//     before any kernel touches `out` (header checks of wire::read_header and
//     wire::expect, top-k indices of wire::check_topk_indices); on a malformed
//     payload `out` is left unchanged. What the host can see without reading
//     device memory throws at once: a null or misaligned payload pointer, or
//     fewer than 32 bytes. The verdict goes:
//       * ctx.status == nullptr: the call synchronizes ctx.stream and throws
//         PayloadError like the CPU path. Simple; not for the hot path.
//       * ctx.status != nullptr: a device PayloadStatus (payload_status.h)
//         that the caller zeroed; nothing synchronizes. The first error is
//         recorded there and every later decode that shares the status does
//         nothing. Check it when convenient with
//         check_payload_status(ctx.status, stream), which throws PayloadError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "common/dtype.h"
#include "common/stream.h"
#include "compressors/descriptor.h"
#include "compressors/payload_status.h"
#include "compressors/spec.h"
#include "kernels/combine.h"
#include "kernels/decode_out.h"
#include "kernels/element.h"

namespace gz {

/// Where and how a codec call runs.
struct ExecContext {
  Device device = Device::Cpu;
  Stream stream = nullptr;          ///< CUDA stream (Device::Cuda only)
  void* workspace = nullptr;        ///< optional scratch; see Codec::workspace_bytes
  std::size_t workspace_bytes = 0;
  /// CUDA decode only: device status word that receives the verdict instead of
  /// a synchronizing throw (see "CUDA" above). Zero it before first use.
  PayloadStatus* status = nullptr;
  /// The training step, for codecs that draw random numbers (qsgd's
  /// stochastic rounding): the same (seed, step, element) gives the same bits,
  /// on the CPU and on the GPU, run after run. Advance it once per step.
  std::uint64_t step = 0;
};

/// A payload whose header has been read and validated (host memory).
struct PayloadView {
  std::uint32_t param;
  std::uint64_t count;
  const std::byte* body;
  std::uint64_t body_bytes;
};

/// A payload to decode (host or device memory, as the call's ExecContext says).
struct PayloadRef {
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
};

/// How a decode writes into its output: kernels/combine.h.
using Combine = kernels::Combine;
/// Where a CUDA decode writes, float or 16-bit: kernels/decode_out.h.
using DecodeOut = kernels::cuda::DecodeOut;

/// A gradient an encode reads: its elements and their type.
struct GradRef {
  const void* data = nullptr;
  Dtype dtype = Dtype::Float32;
};

/// f(typed pointer) for the gradient's element type: a codec's encode calls
/// its kernel template through this.
template <class F>
decltype(auto) visit(GradRef g, F&& f) {
  return kernels::with_elements(g.dtype, g.data, std::forward<F>(f));
}

/// What a codec's encode wrote after the header.
struct EncodedBody {
  std::uint32_t param;      ///< the header's param field
  std::uint64_t body_bytes;
};

class Codec {
 public:
  explicit Codec(CodecConfig config) : config_(config), descriptor_(config_.descriptor()) {}
  virtual ~Codec() = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  const CodecConfig& config() const { return config_; }
  const CodecDescriptor& descriptor() const { return descriptor_; }
  CodecId id() const { return config_.id; }
  /// The canonical spec string.
  std::string spec() const { return config_.canonical(); }
  bool error_feedback() const { return config_.ef; }
  /// Whether every payload of n elements is exactly max_payload_bytes(n) bytes
  /// and carries header_param(n) (the descriptor's rule).
  bool fixed_size() const { return payload_size_fixed(config_); }

  /// The header param of a payload of n elements (for a codec whose size
  /// varies, the one a full-size payload would carry).
  virtual std::uint32_t header_param(std::size_t) const { return 0; }
  /// Payload bytes (header included) for n elements: exact for a fixed-size
  /// codec, the upper bound otherwise.
  virtual std::size_t max_payload_bytes(std::size_t n) const;
  /// Writes the 32-byte header of a payload of n elements to `dst` (host
  /// memory): for a fixed-size codec it is the same for every payload of n
  /// elements, so a payload may travel as its body alone (a bare body) to a
  /// receiver that knows the codec and n, which writes this header in front
  /// of what arrived; the decode then checks that body's size like any
  /// payload's (truncated or trailing bytes: PayloadError). Returns 32.
  /// InvalidArgument for a codec whose size varies (its header counts entries).
  std::size_t write_header(std::size_t n, std::byte* dst) const;
  /// Scratch bytes a call on n elements of `dtype` needs on `device`: an
  /// encode's scratch, on CUDA the status word of a decode, and for a 16-bit
  /// dtype a float buffer of n (CUDA decodes: a sum's partial sum, top-k's
  /// scratch; encodes without error feedback: the widened gradient). None for
  /// a float decode on the CPU.
  std::size_t workspace_bytes(std::size_t n, Device device, Dtype dtype = Dtype::Float32) const;
  /// CUDA workspaces start with this many bytes (the status word of a
  /// synchronous decode); a codec's own scratch follows.
  static constexpr std::size_t kCudaStatusBytes = 256;

  /// Encodes grad (n floats) into payload, fused with error feedback.
  /// @param[in] grad        gradient, n floats
  /// @param[in,out] residual error-feedback state, n floats (nullptr iff EF is off)
  /// @param[out] payload    at least max_payload_bytes(n) bytes
  /// @return bytes written
  std::size_t encode(const float* grad, float* residual, std::size_t n, std::byte* payload, std::size_t capacity,
                     const ExecContext& ctx = {}) {
    return encode(grad, Dtype::Float32, residual, n, payload, capacity, ctx);
  }
  /// The same for a gradient of n elements of `dtype` (residual: n floats).
  std::size_t encode(const void* grad, Dtype dtype, float* residual, std::size_t n, std::byte* payload,
                     std::size_t capacity, const ExecContext& ctx = {});

  /// out[0..n) += decoded payload. Validates first; throws PayloadError.
  void decode_accumulate(const std::byte* payload, std::size_t bytes, float* out, std::size_t n,
                         const ExecContext& ctx = {}) {
    decode(payload, bytes, out, Dtype::Float32, n, Combine{}, ctx);
  }
  void decode_accumulate(const std::byte* payload, std::size_t bytes, void* out, Dtype dtype, std::size_t n,
                         const ExecContext& ctx = {}) {
    decode(payload, bytes, out, dtype, n, Combine{}, ctx);
  }

  /// out[0..n) = combine(out, decoded payload, c) (kernels/combine.h).
  /// Validates first; throws PayloadError.
  void decode(const std::byte* payload, std::size_t bytes, float* out, std::size_t n, Combine c,
              const ExecContext& ctx = {}) {
    decode(payload, bytes, out, Dtype::Float32, n, c, ctx);
  }
  /// The same into n elements of `dtype`.
  void decode(const std::byte* payload, std::size_t bytes, void* out, Dtype dtype, std::size_t n, Combine c,
              const ExecContext& ctx = {});

  /// out[0..n) = (D(p[0]) + D(p[1]) + ... + D(p[m-1])) * scale: the first
  /// payload overwrites, the others add in order, the last one scales (the
  /// multiply only when scale != 1). Every payload is validated before `out`
  /// is touched. On the CPU the sum runs tile by tile, so `out` is written once
  /// and never read; on CUDA it is one launch per payload. m == 0 leaves out as
  /// it is. Payloads must not overlap `out`.
  void decode_sum(std::span<const PayloadRef> payloads, float* out, std::size_t n, float scale = 1.0f,
                  const ExecContext& ctx = {}) {
    decode_sum(payloads, out, Dtype::Float32, n, scale, ctx);
  }
  /// The same into n elements of `dtype`: the sum is float, rounded once.
  void decode_sum(std::span<const PayloadRef> payloads, void* out, Dtype dtype, std::size_t n, float scale = 1.0f,
                  const ExecContext& ctx = {});

 protected:
  /// The codec's own scratch for an encode of n elements on `device` (the
  /// default: none on the CPU, the status word on CUDA).
  virtual std::size_t codec_workspace_bytes(std::size_t n, Device device) const;

  /// Codec-specific parts. The public calls have already checked pointers,
  /// capacity and EF (encode), or read and checked the header (decode).
  /// An encode's grad is float, or 16-bit with a residual (never without:
  /// the public call widens that case); decodes write float.
  virtual EncodedBody encode_cpu(GradRef grad, float* residual, std::size_t n, std::byte* body,
                                 const ExecContext& ctx) = 0;
  /// Elements [begin, end) of a validated payload into out[0 .. end - begin),
  /// combined as `c` says.
  virtual void decode_cpu(const PayloadView& p, std::size_t begin, std::size_t end, float* out, Combine c) = 0;
  /// Body checks beyond the header (top-k indices), before any decode_cpu of
  /// the call touches `out`. Throws PayloadError.
  virtual void check_body_cpu(const PayloadView& p) const;
  /// CUDA parts: payload, grad, residual and out are device pointers, work is
  /// queued on ctx.stream. The defaults throw (a build without CUDA).
  /// encode_cuda writes header and body, returns the payload bytes.
  virtual std::size_t encode_cuda(GradRef grad, float* residual, std::size_t n, std::byte* payload,
                                  const ExecContext& ctx);
  /// decode_cuda is called after the header check was queued, with
  /// ctx.status set (never null); its kernels must do nothing unless
  /// ctx.status->code is 0 when they run. It is skipped when the payload size
  /// already shows the payload is malformed (for a fixed-size codec, bytes !=
  /// max_payload_bytes(n)), so it may size its launches from bytes and n.
  /// It writes `out` in one pass, a 16-bit one too (DecodeOut's rule).
  virtual void decode_cuda(const std::byte* payload, std::size_t bytes, const DecodeOut& out, std::size_t n,
                           Combine c, const ExecContext& ctx);
  /// CUDA body checks beyond the header (top-k indices) into ctx.status,
  /// queued before any decode_cuda of the call; called only when the size is
  /// plausible (as for decode_cuda).
  virtual void check_body_cuda(const std::byte* payload, std::size_t bytes, std::size_t n, const ExecContext& ctx);

  /// The caller's workspace, checked to hold `bytes` on ctx.device (nullptr
  /// when bytes is 0); throws InvalidArgument when it is missing or too small.
  void* scratch(const ExecContext& ctx, std::size_t bytes) const;

 private:
  // Reads and checks a host payload's header (and body); throws PayloadError.
  PayloadView view_cpu(const std::byte* payload, std::size_t bytes, std::size_t n) const;
  PayloadView header_view(const PayloadRef& p) const;
  // Every payload decoded on the device: with `single`, the one payload in
  // that mode; else a sum (decode_sum's modes).
  void decode_cuda_all(std::span<const PayloadRef> payloads, void* out, Dtype dtype, std::size_t n,
                       const Combine* single, float scale, const ExecContext& ctx);
  // The float buffer of n elements after the codec's scratch (workspace_bytes).
  float* wide_buffer(const ExecContext& ctx, std::size_t n) const;

  CodecConfig config_;
  const CodecDescriptor& descriptor_;
};

/// Builds the codec a spec string names. Throws InvalidArgument.
std::unique_ptr<Codec> make_codec(std::string_view spec);
std::unique_ptr<Codec> make_codec(const CodecConfig& config);

}  // namespace gz
