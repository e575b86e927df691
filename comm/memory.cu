// The one kernel comm/ needs of its own: scaling the result of an average.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/cuda_check.h"

namespace gz::cuda_ops {
namespace {

__global__ void scale_kernel(float* p, std::size_t n, float alpha) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) p[i] *= alpha;
}

}  // namespace

void scale(float* p, std::size_t n, float alpha, cudaStream_t stream) {
  const unsigned threads = 256;
  const std::size_t want = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 4096 ? want : 4096);
  scale_kernel<<<blocks, threads, 0, stream>>>(p, n, alpha);
  GZ_CUDA_CHECK_LAUNCH(scale_kernel);
}

}  // namespace gz::cuda_ops
