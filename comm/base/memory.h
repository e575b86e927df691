// Buffers in host, CUDA device or pinned host memory, grown on demand and
// reused (the allreduce allocates on its first call, never on later ones),
// and the few memory operations the allreduce needs on either device.
#pragma once

#include <cstddef>

#include "common/stream.h"

namespace gz {

enum class MemoryKind : unsigned char { Host, Device, Pinned };

/// Memory of one kind; reserve() grows it (contents are not kept).
class Buffer {
 public:
  explicit Buffer(MemoryKind kind = MemoryKind::Host) : kind_(kind) {}
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept : kind_(o.kind_), data_(o.data_), capacity_(o.capacity_) {
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  /// Ensures capacity() >= bytes. Returns true when it allocated.
  bool reserve(std::size_t bytes);
  /// Frees the memory and, when `kind` differs, changes the kind.
  void reset(MemoryKind kind);
  void release();

  void* data() const { return data_; }
  std::size_t capacity() const { return capacity_; }
  MemoryKind kind() const { return kind_; }

 private:
  MemoryKind kind_;
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

/// The memory kind a buffer on `device` lives in.
inline MemoryKind memory_of(Device d) { return d == Device::Cuda ? MemoryKind::Device : MemoryKind::Host; }

namespace mem {

/// p[0..n) = 0 (queued on `stream` for CUDA).
void zero(void* p, std::size_t bytes, Device device, Stream stream);
/// dst[0..bytes) = src[0..bytes), both on `device` (queued on `stream` for CUDA).
void copy(void* dst, const void* src, std::size_t bytes, Device device, Stream stream);
/// Synchronous copies between host memory and memory on `device`.
void to_host(void* dst, const void* src, std::size_t bytes, Device device, Stream stream);
void from_host(void* dst, const void* src, std::size_t bytes, Device device, Stream stream);
/// Waits for `stream` (no-op on the CPU).
void synchronize(Device device, Stream stream);
/// True when this process sees at least one CUDA device.
bool cuda_available();

}  // namespace mem
}  // namespace gz
