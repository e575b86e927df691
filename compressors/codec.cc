#include "compressors/codec.h"

#include "common/error.h"
#include "common/workspace.h"
#include "compressors/wire_format.h"

#if GZ_HAVE_CUDA
#include "common/cuda_check.h"
#include "compressors/cuda_codec.h"
#endif

namespace gz {

std::size_t Codec::max_payload_bytes(std::size_t n) const {
  return wire::kHeaderBytes + wire::body_bytes(id(), header_param(n), n);
}

std::size_t Codec::workspace_bytes(std::size_t, Device device) const {
  return device == Device::Cuda ? kCudaStatusBytes : 0;
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

std::size_t Codec::encode(const float* grad, float* residual, std::size_t n, std::byte* payload,
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
  (void)scratch(ctx, workspace_bytes(n, ctx.device));  // the workspace it asked for, or a clear error
  if (ctx.device == Device::Cuda) return encode_cuda(grad, residual, n, payload, ctx);

  const EncodedBody body = encode_cpu(grad, residual, n, payload + wire::kHeaderBytes, ctx);
  wire::Header h;
  h.codec = id();
  h.param = body.param;
  h.count = n;
  h.body_bytes = body.body_bytes;
  wire::write_header(h, payload);
  return wire::kHeaderBytes + body.body_bytes;
}

void Codec::decode_accumulate(const std::byte* payload, std::size_t bytes, float* out, std::size_t n,
                              const ExecContext& ctx) {
  GZ_ENFORCE(n == 0 || out != nullptr, spec(), ": output pointer is null");
  (void)scratch(ctx, workspace_bytes(n, ctx.device));
  if (ctx.device == Device::Cuda) return decode_accumulate_cuda(payload, bytes, out, n, ctx);
  if (reinterpret_cast<std::uintptr_t>(payload) % 4 != 0)
    GZ_THROW(InvalidArgument, spec(), ": payload buffer must be 4-byte aligned");
  const wire::Header h = wire::read_header(payload, bytes);
  const bool fixed = fixed_size();
  const std::uint32_t param = header_param(n);
  wire::expect(h, id(), n, fixed ? &param : nullptr);
  decode_cpu(PayloadView{h.param, h.count, payload + wire::kHeaderBytes, h.body_bytes}, out, ctx);
}

#if GZ_HAVE_CUDA
// Host checks first (what needs no device memory), then the header check on
// the device, then the codec's gated decode kernels, then the verdict.
void Codec::decode_accumulate_cuda(const std::byte* payload, std::size_t bytes, float* out, std::size_t n,
                                   const ExecContext& ctx) {
  if (!payload) GZ_THROW(PayloadError, "payload pointer is null");
  if (reinterpret_cast<std::uintptr_t>(payload) % 4 != 0)
    GZ_THROW(InvalidArgument, spec(), ": payload buffer must be 4-byte aligned");
  if (bytes < wire::kHeaderBytes)
    GZ_THROW(PayloadError, "payload truncated: ", bytes, " bytes, the header alone is ", wire::kHeaderBytes);
  const bool fixed = fixed_size();
  const std::uint32_t param = header_param(n);
  // A fixed-size codec knows the exact size; a mismatch means a malformed
  // payload whose body must not be read (the device check names the reason).
  const bool size_ok = !fixed || bytes == max_payload_bytes(n);

  ExecContext c = ctx;
  const bool synchronous = ctx.status == nullptr;
  if (synchronous) {
    c.status = static_cast<PayloadStatus*>(scratch(ctx, kCudaStatusBytes));
    GZ_CUDA_CHECK(cudaMemsetAsync(c.status, 0, sizeof(PayloadStatus), ctx.stream));
  }
  cuda_codec::validate_header(payload, bytes, id(), n, fixed, param, size_ok, c.status, ctx.stream);
  if (size_ok) decode_cuda(payload, bytes, out, n, c);
  if (synchronous) check_payload_status(c.status, ctx.stream);
}
#else
void Codec::decode_accumulate_cuda(const std::byte*, std::size_t, float*, std::size_t, const ExecContext&) {
  GZ_THROW(InvalidArgument, spec(), ": this build of gradzip has no CUDA support (configure with GRADZIP_CUDA=ON)");
}
#endif

std::size_t Codec::encode_cuda(const float*, float*, std::size_t, std::byte*, const ExecContext&) {
  GZ_THROW(InvalidArgument, spec(), ": this build of gradzip has no CUDA support (configure with GRADZIP_CUDA=ON)");
}

void Codec::decode_cuda(const std::byte*, std::size_t, float*, std::size_t, const ExecContext&) {
  GZ_THROW(InvalidArgument, spec(), ": this build of gradzip has no CUDA support (configure with GRADZIP_CUDA=ON)");
}

}  // namespace gz
