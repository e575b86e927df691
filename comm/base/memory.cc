#include "comm/base/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "common/error.h"
#include "common/workspace.h"
#include "kernels/cpu.h"
#if GZ_HAVE_CUDA
#include "common/cuda_check.h"
#include "kernels/cuda.h"
#endif

namespace gz {

namespace {

[[noreturn, maybe_unused]] void no_cuda() {
  GZ_THROW(InvalidArgument, "CUDA buffers need a build of gradzip with CUDA (GRADZIP_CUDA=ON)");
}

}  // namespace

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    kind_ = o.kind_;
    data_ = o.data_;
    capacity_ = o.capacity_;
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  return *this;
}

bool Buffer::reserve(std::size_t bytes) {
  if (bytes <= capacity_) return false;
  release();
  const std::size_t size = align_up(bytes, kWorkspaceAlign);
  switch (kind_) {
    case MemoryKind::Host:
      data_ = std::aligned_alloc(kWorkspaceAlign, size);
      if (!data_) throw std::bad_alloc();
      break;
    case MemoryKind::Device:
#if GZ_HAVE_CUDA
      GZ_CUDA_CHECK(cudaMalloc(&data_, size));
#else
      no_cuda();
#endif
      break;
    case MemoryKind::Pinned:
#if GZ_HAVE_CUDA
      GZ_CUDA_CHECK(cudaHostAlloc(&data_, size, cudaHostAllocDefault));
#else
      no_cuda();
#endif
      break;
  }
  capacity_ = size;
  return true;
}

void Buffer::reset(MemoryKind kind) {
  release();
  kind_ = kind;
}

void Buffer::release() {
  if (!data_) return;
  switch (kind_) {
    case MemoryKind::Host: std::free(data_); break;
#if GZ_HAVE_CUDA
    case MemoryKind::Device: cudaFree(data_); break;
    case MemoryKind::Pinned: cudaFreeHost(data_); break;
#else
    default: break;
#endif
  }
  data_ = nullptr;
  capacity_ = 0;
}

namespace mem {

void zero(void* p, std::size_t bytes, Device device, Stream stream) {
  if (!bytes) return;
  if (device == Device::Cpu) {
    std::memset(p, 0, bytes);
    return;
  }
#if GZ_HAVE_CUDA
  GZ_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, reinterpret_cast<cudaStream_t>(stream)));
#else
  (void)stream;
  no_cuda();
#endif
}

void copy(void* dst, const void* src, std::size_t bytes, Device device, Stream stream) {
  if (!bytes) return;
  if (device == Device::Cpu) {
    std::memmove(dst, src, bytes);
    return;
  }
#if GZ_HAVE_CUDA
  GZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, reinterpret_cast<cudaStream_t>(stream)));
#else
  (void)stream;
  no_cuda();
#endif
}

namespace {

// Copies between host and `device` memory and waits for the copy.
void copy_and_wait(void* dst, const void* src, std::size_t bytes, Device device, Stream stream, bool to_host) {
  if (!bytes) return;
  if (device == Device::Cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if GZ_HAVE_CUDA
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  GZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s));
  GZ_CUDA_CHECK(cudaStreamSynchronize(s));
#else
  (void)stream;
  (void)to_host;
  no_cuda();
#endif
}

}  // namespace

void to_host(void* dst, const void* src, std::size_t bytes, Device device, Stream stream) {
  copy_and_wait(dst, src, bytes, device, stream, true);
}

void from_host(void* dst, const void* src, std::size_t bytes, Device device, Stream stream) {
  copy_and_wait(dst, src, bytes, device, stream, false);
}

void synchronize(Device device, Stream stream) {
  if (device == Device::Cpu) return;
#if GZ_HAVE_CUDA
  GZ_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
#else
  (void)stream;
  no_cuda();
#endif
}

bool cuda_available() {
#if GZ_HAVE_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

}  // namespace mem
}  // namespace gz
