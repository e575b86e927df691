// Device-side payload validation (the checks of compressors/wire_format.cc,
// through wire::check_header) and the header blob.
#include <cuda_runtime.h>

#include <cstring>

#include "common/cuda_check.h"
#include "compressors/cuda_codec.h"
#include "compressors/wire_format.h"

namespace gz {
namespace cuda_codec {
namespace {

constexpr std::uint64_t kNoEntry = ~std::uint64_t{0};

__device__ __forceinline__ bool status_clean(const PayloadStatus* s) { return s->code == 0 && s->first_bad_entry == 0; }

__device__ void record(PayloadStatus* s, PayloadCheck code, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  s->detail[0] = a;
  s->detail[1] = b;
  s->detail[2] = c;
  s->code = static_cast<std::uint32_t>(code);
}

__global__ void header_kernel(const std::uint32_t* words, std::uint64_t bytes, std::uint32_t codec, std::uint64_t n,
                              bool fixed_param, std::uint32_t param, bool host_size_ok, PayloadStatus* status) {
  if (!status_clean(status)) return;  // keep the first error
  HeaderVerdict v = check_header(words, bytes, codec, n, fixed_param, param);
  if (v.code == PayloadCheck::Ok && !host_size_ok) {
    // Unreachable when check_header is complete (a valid header implies the
    // size the host expects); kept so that a gap can never decode.
    v.code = PayloadCheck::SizeMismatch;
    v.detail[0] = bytes;
    v.detail[1] = 0;
  }
  if (v.code != PayloadCheck::Ok) record(status, v.code, v.detail[0], v.detail[1], v.detail[2]);
}

__global__ void topk_index_kernel(const std::uint32_t* idx, std::size_t k, std::uint64_t n, PayloadStatus* status) {
  if (!status_clean(status)) return;  // bad header: the entries may not even exist
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t i = idx[j];
    if (i >= n || (j > 0 && i <= idx[j - 1]))
      atomicMax(reinterpret_cast<unsigned long long*>(&status->first_bad_entry),
                static_cast<unsigned long long>(kNoEntry - j));  // max of (2^64-1 - j) = lowest j
  }
}

__global__ void topk_index_name_kernel(const std::uint32_t* idx, std::uint64_t n, PayloadStatus* status) {
  if (status->code != 0 || status->first_bad_entry == 0) return;
  const std::uint64_t j = kNoEntry - status->first_bad_entry;
  const std::uint32_t i = idx[j];
  if (i >= n)
    record(status, PayloadCheck::TopkIndexRange, j, i, n);
  else
    record(status, PayloadCheck::TopkIndexOrder, j, idx[j - 1], i);
}

}  // namespace

kernels::cuda::Blob32 header_blob(CodecId codec, std::uint32_t param, std::uint64_t count, std::uint64_t body_bytes,
                                  std::byte* payload) {
  wire::Header h;
  h.codec = codec;
  h.param = param;
  h.count = count;
  h.body_bytes = body_bytes;
  kernels::cuda::Blob32 b;
  wire::write_header(h, reinterpret_cast<std::byte*>(b.words));
  b.dst = payload;
  return b;
}

void validate_header(const std::byte* payload, std::uint64_t bytes, CodecId codec, std::uint64_t n, bool fixed_param,
                     std::uint32_t param, bool host_size_ok, PayloadStatus* status, Stream stream) {
  header_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<const std::uint32_t*>(payload), bytes,
                                     static_cast<std::uint32_t>(codec), n, fixed_param, param, host_size_ok, status);
  GZ_CUDA_CHECK(cudaPeekAtLastError());
}

void validate_topk_indices(const std::uint32_t* idx, std::size_t k, std::uint64_t n, PayloadStatus* status,
                           Stream stream) {
  if (k == 0) return;
  int dev = 0, sms = 0;
  GZ_CUDA_CHECK(cudaGetDevice(&dev));
  GZ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const std::size_t want = (k + 255) / 256, cap = static_cast<std::size_t>(sms) * 8;
  topk_index_kernel<<<static_cast<unsigned>(want < cap ? want : cap), 256, 0, stream>>>(idx, k, n, status);
  GZ_CUDA_CHECK(cudaPeekAtLastError());
  topk_index_name_kernel<<<1, 1, 0, stream>>>(idx, n, status);
  GZ_CUDA_CHECK(cudaPeekAtLastError());
}

}  // namespace cuda_codec

void check_payload_status(const PayloadStatus* device_status, Stream stream) {
  GZ_ENFORCE(device_status != nullptr, "check_payload_status: status pointer is null");
  PayloadStatus host{};
  GZ_CUDA_CHECK(cudaMemcpyAsync(&host, device_status, sizeof host, cudaMemcpyDeviceToHost, stream));
  GZ_CUDA_CHECK(cudaStreamSynchronize(stream));
  throw_if_failed(host);
}

}  // namespace gz
