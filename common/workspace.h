// Splitting one caller-provided scratch buffer into aligned parts (CUB's
// two-phase pattern: ask for the size, allocate once, reuse on every call).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/error.h"

namespace gz {

/// Alignment of every part carved from a workspace (matches cudaMalloc's).
inline constexpr std::size_t kWorkspaceAlign = 256;

constexpr std::size_t align_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

/// Lays out parts in a workspace. Use the same sequence of add() calls to
/// size the workspace (ptr == nullptr) and to carve it.
class WorkspaceCarver {
 public:
  WorkspaceCarver(void* base, std::size_t capacity) : base_(static_cast<std::byte*>(base)), capacity_(capacity) {}

  /// Reserves `count` objects of T; returns nullptr while only sizing.
  template <class T>
  T* add(std::size_t count) {
    const std::size_t offset = used_;
    used_ = align_up(used_ + count * sizeof(T), kWorkspaceAlign);
    return base_ ? reinterpret_cast<T*>(base_ + offset) : nullptr;
  }

  std::size_t bytes() const { return used_; }
  /// True while only sizing (no base).
  bool sizing() const { return base_ == nullptr; }

  /// Throws when the carved parts did not fit in the workspace given.
  void check() const {
    if (base_ && used_ > capacity_)
      GZ_THROW(InvalidArgument, "workspace too small: need ", used_, " bytes, got ", capacity_);
  }

 private:
  std::byte* base_;
  std::size_t capacity_;
  std::size_t used_ = 0;
};

}  // namespace gz
