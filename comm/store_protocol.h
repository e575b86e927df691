// The TcpStore wire protocol (client <-> server), little-endian on both ends
// (every supported host is):
//
//   frame     = u32 magic "GZS1" | u32 body_bytes (<= kMaxFrameBody) | body
//   request   = u8 op | fields
//     Set     = u32 key_bytes | key | u32 value_bytes | value
//     Get     = u32 key_bytes | key
//     Wait    = u32 timeout_ms | u32 key_count | key_count x (u32 key_bytes | key)
//     Add     = u32 key_bytes | key | i64 delta
//   reply     = u8 status | fields
//     Ok      Set: -   Get: value   Wait: -   Add: i64 value
//     Timeout (Wait) the keys still missing, as in Wait
//     Error   a message
//
// Limits (kMax*) bound every length a peer sends before anything is
// allocated; a frame that breaks them, a bad magic or an unknown op closes
// the connection. The server serves each connection's requests in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace gz::store_proto {

inline constexpr std::uint32_t kMagic = 0x31535A47u;  // "GZS1"
inline constexpr std::size_t kFrameHeader = 8;
inline constexpr std::size_t kMaxKey = 1024;
inline constexpr std::size_t kMaxValue = 1u << 20;
inline constexpr std::size_t kMaxWaitKeys = 4096;
inline constexpr std::size_t kMaxFrameBody = 4 << 20;

enum class Op : std::uint8_t { Set = 1, Get = 2, Wait = 3, Add = 4 };
enum class Status : std::uint8_t { Ok = 0, Timeout = 1, Error = 2 };

// ---- encoding helpers ------------------------------------------------------
inline void put_u8(std::string& s, std::uint8_t v) { s.push_back(static_cast<char>(v)); }
inline void put_u32(std::string& s, std::uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
inline void put_i64(std::string& s, std::int64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
inline void put_str(std::string& s, std::string_view v) {
  put_u32(s, static_cast<std::uint32_t>(v.size()));
  s.append(v);
}

/// Reads fields from a received body; any read past the end, or a string over
/// its limit, clears ok() and returns zero/empty (the caller then rejects).
class Reader {
 public:
  explicit Reader(std::string_view body) : s_(body) {}
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == s_.size(); }
  std::uint8_t u8() {
    std::uint8_t v = 0;
    take(&v, 1);
    return v;
  }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    take(&v, 4);
    return v;
  }
  std::int64_t i64() {
    std::int64_t v = 0;
    take(&v, 8);
    return v;
  }
  std::string_view str(std::size_t max) {
    const std::uint32_t n = u32();
    if (!ok_ || n > max || n > s_.size() - pos_) {
      ok_ = false;
      return {};
    }
    const std::string_view v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }

 private:
  void take(void* dst, std::size_t n) {
    if (!ok_ || n > s_.size() - pos_) {
      ok_ = false;
      return;
    }
    std::memcpy(dst, s_.data() + pos_, n);
    pos_ += n;
  }
  std::string_view s_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

/// A frame: header then body.
inline std::string frame(const std::string& body) {
  std::string f;
  f.reserve(kFrameHeader + body.size());
  put_u32(f, kMagic);
  put_u32(f, static_cast<std::uint32_t>(body.size()));
  f += body;
  return f;
}

}  // namespace gz::store_proto
