// Device queries and the stand-alone blob write shared by the CUDA launches.
#include <atomic>

#include "kernels/cuda_common.cuh"

namespace gz::kernels::cuda {
namespace detail {

int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};
  int dev = 0;
  GZ_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < kMaxDevices) {
    if (const int c = cache[dev].load(std::memory_order_relaxed)) return c;
  }
  int count = 0;
  GZ_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
  if (dev >= 0 && dev < kMaxDevices) cache[dev].store(count, std::memory_order_relaxed);
  return count;
}

namespace {

__global__ void write_blob_kernel(Blob32 blob) { store_blob(blob); }

}  // namespace
}  // namespace detail

void write_blob(const Blob32& blob, Stream stream) {
  if (!blob.dst) return;
  detail::write_blob_kernel<<<1, 32, 0, stream>>>(blob);
  GZ_LAUNCH_CHECK(write_blob_kernel);
}

std::uint32_t fetch_word(const std::uint32_t* device_word, Stream stream) {
  std::uint32_t word = 0;
  GZ_CUDA_CHECK(cudaMemcpyAsync(&word, device_word, sizeof word, cudaMemcpyDeviceToHost, stream));
  GZ_CUDA_CHECK(cudaStreamSynchronize(stream));
  return word;
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear "no device" / "no driver" so later checks do not see it
    return 0;
  }
  return count;
}

}  // namespace gz::kernels::cuda
