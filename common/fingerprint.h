// A 64-bit FNV-1a hash of a float buffer's bits: ranks compare results bit
// for bit by exchanging 8 bytes instead of the buffer (bench and tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gz {

inline std::uint64_t fingerprint(const float* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, &p[i], 4);
    h = (h ^ u) * 1099511628211ull;
  }
  return h;
}

}  // namespace gz
