#include "comm/base/phase_timer.h"

#include "common/error.h"
#if GZ_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#endif

namespace gz::detail {

#if GZ_HAVE_CUDA
namespace {

void* new_event() {
  cudaEvent_t e = nullptr;
  GZ_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

}  // namespace
#endif

PhaseTimer::~PhaseTimer() {
#if GZ_HAVE_CUDA
  for (const Region& r : regions_) {
    cudaEventDestroy(static_cast<cudaEvent_t>(r.start));
    cudaEventDestroy(static_cast<cudaEvent_t>(r.stop));
  }
  if (open_) cudaEventDestroy(static_cast<cudaEvent_t>(open_));
#endif
}

void PhaseTimer::reset(bool on, Device device, Stream stream) {
  on_ = on;
  device_ = device;
  stream_ = stream;
}

void PhaseTimer::begin() {
  if (!on_) return;
  if (device_ == Device::Cpu) {
    t0_ = std::chrono::steady_clock::now();
    return;
  }
#if GZ_HAVE_CUDA
  if (!open_) open_ = new_event();
  GZ_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(open_), reinterpret_cast<cudaStream_t>(stream_)));
#endif
}

void PhaseTimer::end(double* acc) {
  if (!on_) return;
  if (device_ == Device::Cpu) {
    *acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    return;
  }
#if GZ_HAVE_CUDA
  void* stop = new_event();
  GZ_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop), reinterpret_cast<cudaStream_t>(stream_)));
  regions_.push_back({open_, stop, acc});
  open_ = nullptr;
#endif
}

void PhaseTimer::collect() {
#if GZ_HAVE_CUDA
  for (const Region& r : regions_) {
    float ms = 0;
    GZ_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(r.stop)));
    GZ_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(r.start), static_cast<cudaEvent_t>(r.stop)));
    *r.acc += ms * 1e-3;
    cudaEventDestroy(static_cast<cudaEvent_t>(r.start));
    cudaEventDestroy(static_cast<cudaEvent_t>(r.stop));
  }
  regions_.clear();
#endif
}

}  // namespace gz::detail
