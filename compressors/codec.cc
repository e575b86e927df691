#include "compressors/codec.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/error.h"
#include "common/workspace.h"
#include "compressors/wire_format.h"
#include "kernels/cpu.h"
#include "kernels/element.h"

#if GZ_HAVE_CUDA
#include "common/cuda_check.h"
#include "compressors/cuda_codec.h"
#include "kernels/cuda.h"
#endif

namespace gz {

std::size_t Codec::max_payload_bytes(std::size_t n) const {
  return wire::kHeaderBytes + wire::body_bytes(id(), header_param(n), n);
}

std::size_t Codec::write_header(std::size_t n, std::byte* dst) const {
  if (!fixed_size())
    GZ_THROW(InvalidArgument, "codec '", spec(), "' has payloads of varying size: only its encoder knows their header");
  wire::Header h;
  h.codec = id();
  h.param = header_param(n);
  h.count = n;
  h.body_bytes = wire::body_bytes(h.codec, h.param, n);
  wire::write_header(h, dst);
  return wire::kHeaderBytes;
}

std::size_t Codec::codec_workspace_bytes(std::size_t, Device device) const {
  return device == Device::Cuda ? kCudaStatusBytes : 0;
}

namespace {

std::size_t align_up(std::size_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

}  // namespace

std::size_t Codec::workspace_bytes(std::size_t n, Device device, Dtype dtype) const {
  const std::size_t own = codec_workspace_bytes(n, device);
  // A 16-bit call widens into a float buffer after the codec's scratch: every
  // CUDA decode, and encodes without error feedback (the codecs read a 16-bit
  // gradient only through an EF input).
  const bool wide = dtype != Dtype::Float32 && (device == Device::Cuda || !error_feedback());
  return wide ? align_up(own) + n * sizeof(float) : own;
}

float* Codec::wide_buffer(const ExecContext& ctx, std::size_t n) const {
  auto* base = static_cast<std::byte*>(ctx.workspace);
  (void)n;
  return reinterpret_cast<float*>(base + align_up(codec_workspace_bytes(n, ctx.device)));
}

void* Codec::scratch(const ExecContext& ctx, std::size_t bytes) const {
  if (bytes == 0) return nullptr;
  if (!ctx.workspace)
    GZ_THROW(InvalidArgument, spec(), ": this call needs a workspace of ", bytes, " bytes in ", to_string(ctx.device),
             " memory (ExecContext::workspace; size it with workspace_bytes(n, device))");
  if (ctx.workspace_bytes < bytes)
    GZ_THROW(InvalidArgument, spec(), ": workspace of ", ctx.workspace_bytes, " bytes is too small, need ", bytes);
  if (ctx.device == Device::Cuda && reinterpret_cast<std::uintptr_t>(ctx.workspace) % kWorkspaceAlign != 0)
    GZ_THROW(InvalidArgument, spec(), ": a CUDA workspace must be ", kWorkspaceAlign, "-byte aligned");
  return ctx.workspace;
}

std::size_t Codec::encode(const void* grad, Dtype dtype, float* residual, std::size_t n, std::byte* payload,
                          std::size_t capacity, const ExecContext& ctx) {
  const std::size_t need = max_payload_bytes(n);
  GZ_ENFORCE(n <= wire::kMaxCount, spec(), ": ", n, " elements is over the format's limit");
  GZ_ENFORCE(payload != nullptr, spec(), ": payload buffer is null");
  GZ_ENFORCE(reinterpret_cast<std::uintptr_t>(payload) % 4 == 0, spec(), ": payload buffer must be 4-byte aligned");
  GZ_ENFORCE(capacity >= need, spec(), ": payload buffer of ", capacity, " bytes is too small for ", n,
             " elements (need ", need, ")");
  GZ_ENFORCE(n == 0 || grad != nullptr, spec(), ": gradient pointer is null");
  if (error_feedback())
    GZ_ENFORCE(n == 0 || residual != nullptr, spec(), ": error feedback is on, so a residual buffer is required");
  else
    residual = nullptr;
  (void)scratch(ctx, workspace_bytes(n, ctx.device, dtype));  // the workspace it asked for, or a clear error
  GradRef g{grad, dtype};
  if (dtype != Dtype::Float32 && !residual) {  // no EF input to widen through: widen first
    float* wide = n ? wide_buffer(ctx, n) : nullptr;
    if (n)
      kernels::with_elements(dtype, grad, [&](auto* typed) {
#if GZ_HAVE_CUDA
        if (ctx.device == Device::Cuda) return kernels::cuda::widen(typed, n, wide, ctx.stream);
#endif
        kernels::cpu::widen(typed, n, wide);
      });
    g = GradRef{wide, Dtype::Float32};
  }
  if (ctx.device == Device::Cuda) return encode_cuda(g, residual, n, payload, ctx);

  const EncodedBody body = encode_cpu(g, residual, n, payload + wire::kHeaderBytes, ctx);
  wire::Header h;
  h.codec = id();
  h.param = body.param;
  h.count = n;
  h.body_bytes = body.body_bytes;
  wire::write_header(h, payload);
  return wire::kHeaderBytes + body.body_bytes;
}

namespace {

// CPU sums decode this many elements of every payload before moving on, so
// the tile stays in cache (L1 + L2) while the payloads add into it.
constexpr std::size_t kSumTile = 4096;

// The mode of payload j of m in a sum: the first overwrites, the last scales.
Combine sum_mode(std::size_t j, std::size_t m, float scale) {
  return Combine{j != 0, j + 1 == m ? scale : 1.0f};
}

}  // namespace

void Codec::check_body_cpu(const PayloadView&) const {}

// A payload view_cpu has already accepted: its header again, no body checks.
PayloadView Codec::header_view(const PayloadRef& p) const {
  const wire::Header h = wire::read_header(p.data, p.bytes);
  return PayloadView{h.param, h.count, p.data + wire::kHeaderBytes, h.body_bytes};
}

PayloadView Codec::view_cpu(const std::byte* payload, std::size_t bytes, std::size_t n) const {
  if (reinterpret_cast<std::uintptr_t>(payload) % 4 != 0)
    GZ_THROW(InvalidArgument, spec(), ": payload buffer must be 4-byte aligned");
  const wire::Header h = wire::read_header(payload, bytes);
  const bool fixed = fixed_size();
  const std::uint32_t param = header_param(n);
  wire::expect(h, id(), n, fixed ? &param : nullptr);
  const PayloadView v{h.param, h.count, payload + wire::kHeaderBytes, h.body_bytes};
  check_body_cpu(v);
  return v;
}

void Codec::decode(const std::byte* payload, std::size_t bytes, void* out, Dtype dtype, std::size_t n, Combine c,
                   const ExecContext& ctx) {
  GZ_ENFORCE(n == 0 || out != nullptr, spec(), ": output pointer is null");
  const PayloadRef one{payload, bytes};
  if (ctx.device == Device::Cuda) return decode_cuda_all(std::span(&one, 1), out, dtype, n, &c, 1.0f, ctx);
  const PayloadView v = view_cpu(payload, bytes, n);
  kernels::with_elements(dtype, out, [&](auto* o) {
    using T = std::remove_pointer_t<decltype(o)>;
    if constexpr (std::is_same_v<T, float>) {
      decode_cpu(v, 0, n, o, c);
    } else {  // combined in float tile by tile, rounded once
      alignas(64) float tile[kSumTile];
      for (std::size_t b = 0; b < n; b += kSumTile) {
        const std::size_t e = std::min(n, b + kSumTile);
        if (c.accumulate) kernels::cpu::widen(o + b, e - b, tile);
        decode_cpu(v, b, e, tile, c);
        kernels::cpu::narrow(tile, e - b, o + b);
      }
    }
  });
}

void Codec::decode_sum(std::span<const PayloadRef> payloads, void* out, Dtype dtype, std::size_t n, float scale,
                       const ExecContext& ctx) {
  GZ_ENFORCE(n == 0 || out != nullptr, spec(), ": output pointer is null");
  if (payloads.empty()) return;
  if (ctx.device == Device::Cuda) return decode_cuda_all(payloads, out, dtype, n, nullptr, scale, ctx);
  const std::size_t m = payloads.size();
  for (const PayloadRef& p : payloads) (void)view_cpu(p.data, p.bytes, n);  // all checked, before out
  // Each tile of the sum is built in a buffer that stays in cache, then
  // streamed to out: out is written once and never read. The tile lives on
  // the stack and the views are read again per tile (the header only, O(1)),
  // so a Codec keeps no state between calls.
  kernels::with_elements(dtype, out, [&](auto* o) {
    alignas(64) float tile[kSumTile];
    for (std::size_t b = 0; b < n; b += kSumTile) {
      const std::size_t e = std::min(n, b + kSumTile);
      for (std::size_t j = 0; j < m; ++j) decode_cpu(header_view(payloads[j]), b, e, tile, sum_mode(j, m, scale));
      if constexpr (std::is_same_v<decltype(o), float*>)
        kernels::cpu::stream_store(tile, e - b, o + b);
      else
        kernels::cpu::narrow(tile, e - b, o + b);  // the float sum, rounded once
    }
  });
}

#if GZ_HAVE_CUDA
// Host checks first (what needs no device memory), then the header and body
// checks of every payload on the device, then the codec's gated decode
// kernels, then (without a caller's status word) the verdict.
void Codec::decode_cuda_all(std::span<const PayloadRef> payloads, void* out, Dtype dtype, std::size_t n,
                            const Combine* single, float scale, const ExecContext& ctx) {
  const bool fixed = fixed_size();
  const std::uint32_t param = header_param(n);
  for (const PayloadRef& p : payloads) {
    if (!p.data) GZ_THROW(PayloadError, "payload pointer is null");
    if (reinterpret_cast<std::uintptr_t>(p.data) % 4 != 0)
      GZ_THROW(InvalidArgument, spec(), ": payload buffer must be 4-byte aligned");
    if (p.bytes < wire::kHeaderBytes)
      GZ_THROW(PayloadError, "payload truncated: ", p.bytes, " bytes, the header alone is ", wire::kHeaderBytes);
  }
  (void)scratch(ctx, workspace_bytes(n, ctx.device, dtype));  // the workspace it asked for, or a clear error
  ExecContext c = ctx;
  const bool synchronous = ctx.status == nullptr;
  if (synchronous) {
    c.status = static_cast<PayloadStatus*>(scratch(ctx, kCudaStatusBytes));
    GZ_CUDA_CHECK(cudaMemsetAsync(c.status, 0, sizeof(PayloadStatus), ctx.stream));
  }
  // A fixed-size codec knows the exact size; a mismatch means a malformed
  // payload whose body must not be read (the device check names the reason).
  auto size_ok = [&](const PayloadRef& p) { return !fixed || p.bytes == max_payload_bytes(n); };
  for (const PayloadRef& p : payloads)
    cuda_codec::validate_header(p.data, p.bytes, id(), n, fixed, param, size_ok(p), c.status, ctx.stream);
  for (const PayloadRef& p : payloads)
    if (size_ok(p)) check_body_cuda(p.data, p.bytes, n, c);
  // A 16-bit output is written once, by the last decode, rounded once: a sum's
  // earlier payloads add up in a float buffer that the last one adds to (the
  // CPU's float tile); a single decode reads and writes out itself. Every
  // decode is gated: a malformed payload leaves out unchanged.
  const bool wide = dtype != Dtype::Float32;
  float* partial = wide ? wide_buffer(ctx, n) : nullptr;
  const std::size_t m = payloads.size();
  for (std::size_t j = 0; j < m; ++j) {
    if (!size_ok(payloads[j])) continue;
    const bool last = j + 1 == m;
    DecodeOut target{out, dtype};
    if (wide && !last) target = DecodeOut{partial, Dtype::Float32};
    if (wide && last) target = single ? DecodeOut{out, dtype, nullptr, partial} : DecodeOut{out, dtype, partial};
    decode_cuda(payloads[j].data, payloads[j].bytes, target, n, single ? *single : sum_mode(j, m, scale), c);
  }
  if (synchronous) check_payload_status(c.status, ctx.stream);
}
#else
void Codec::decode_cuda_all(std::span<const PayloadRef>, void*, Dtype, std::size_t, const Combine*, float,
                            const ExecContext&) {
  GZ_THROW(InvalidArgument, spec(), ": this build of gradzip has no CUDA support (configure with GRADZIP_CUDA=ON)");
}
#endif

std::size_t Codec::encode_cuda(GradRef, float*, std::size_t, std::byte*, const ExecContext&) {
  GZ_THROW(InvalidArgument, spec(), ": this build of gradzip has no CUDA support (configure with GRADZIP_CUDA=ON)");
}

void Codec::decode_cuda(const std::byte*, std::size_t, const DecodeOut&, std::size_t, Combine, const ExecContext&) {
  GZ_THROW(InvalidArgument, spec(), ": this build of gradzip has no CUDA support (configure with GRADZIP_CUDA=ON)");
}

void Codec::check_body_cuda(const std::byte*, std::size_t, std::size_t, const ExecContext&) {}

}  // namespace gz
