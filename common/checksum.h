// A fast 64-bit checksum for bytes that cross a process boundary and must
// arrive intact: saved error-feedback states (hundreds of MB) and the blobs
// ranks publish for each other. It catches corruption (truncation, flipped
// bits, a value written over), not forgery: what must be authenticated is
// MACed with the job's token (comm/security/crypto.h).
//
// Four independent multiply-rotate lanes over 32-byte stripes, so it runs at
// memory speed; the tail and the length are folded in, then mixed so that
// every input bit reaches every output bit.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace gz {

namespace checksum_detail {
inline constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t kP3 = 0x165667B19E3779F9ull;
inline std::uint64_t load64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline std::uint64_t round(std::uint64_t acc, std::uint64_t w) { return std::rotl(acc + w * kP2, 31) * kP1; }
inline std::uint64_t mix(std::uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}
}  // namespace checksum_detail

inline std::uint64_t checksum64(std::string_view bytes, std::uint64_t seed = 0) {
  using namespace checksum_detail;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t n = bytes.size();
  std::uint64_t lane[4] = {seed + kP1 + kP2, seed + kP2, seed, seed - kP1};
  for (; n >= 32; p += 32, n -= 32)
    for (int i = 0; i < 4; ++i) lane[i] = round(lane[i], load64(p + 8 * i));
  std::uint64_t h = std::rotl(lane[0], 1) + std::rotl(lane[1], 7) + std::rotl(lane[2], 12) + std::rotl(lane[3], 18);
  h += static_cast<std::uint64_t>(bytes.size());
  for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ round(0, load64(p)), 27) * kP1 + kP3;
  for (; n > 0; ++p, --n) h = std::rotl(h ^ (*p * kP3), 11) * kP1;
  return mix(h);
}

}  // namespace gz
