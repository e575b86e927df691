// The few cryptographic primitives the rendezvous needs, and nothing more:
// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104; tested against their
// published vectors), a constant-time comparison for proofs and tags, and
// random bytes from the kernel (getrandom(2)).
//
// Written here rather than linked from OpenSSL so that the library, its
// Python wheel and its installed CMake package keep the dependencies they
// have. They authenticate a handful of small messages per job (handshakes,
// rendezvous values), so speed does not matter; large buffers use
// common/checksum.h instead.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gz::crypto {

using Digest = std::array<std::uint8_t, 32>;

/// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  /// The digest; the object is spent afterwards.
  Digest finish();

 private:
  void block(const std::uint8_t* p);
  std::uint32_t h_[8];
  std::uint8_t buf_[64];
  std::size_t buffered_ = 0;
  std::uint64_t total_ = 0;
};

Digest sha256(std::string_view bytes);

/// HMAC-SHA256(key, message), any key length.
Digest hmac_sha256(std::string_view key, std::string_view message);

/// The digest as bytes (for framing) and as lowercase hex (for messages).
inline std::string_view as_bytes(const Digest& d) { return {reinterpret_cast<const char*>(d.data()), d.size()}; }
std::string to_hex(std::string_view bytes);

/// a == b, in time that depends only on the lengths (proofs and tags).
bool equal_constant_time(std::string_view a, std::string_view b);

/// n bytes from the kernel's random source. Throws IoError when it fails.
std::string random_bytes(std::size_t n);

}  // namespace gz::crypto
