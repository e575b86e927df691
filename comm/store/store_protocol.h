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
// Fields are written and read with common/bytes.h. Limits (kMax*) bound every length a peer sends before anything is
// allocated; a frame that breaks them, a bad magic or an unknown op closes
// the connection. The server serves each connection's requests in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/bytes.h"

namespace gz::store_proto {

inline constexpr std::uint32_t kMagic = 0x31535A47u;  // "GZS1"
inline constexpr std::size_t kFrameHeader = 8;
inline constexpr std::size_t kMaxKey = 1024;
inline constexpr std::size_t kMaxValue = 1u << 20;
inline constexpr std::size_t kMaxWaitKeys = 4096;
inline constexpr std::size_t kMaxFrameBody = 4 << 20;

enum class Op : std::uint8_t { Set = 1, Get = 2, Wait = 3, Add = 4 };
enum class Status : std::uint8_t { Ok = 0, Timeout = 1, Error = 2 };

/// A frame: header then body.
inline std::string frame(const std::string& body) {
  std::string f;
  f.reserve(kFrameHeader + body.size());
  bytes::Writer w(f);
  w.put(kMagic);
  w.put(static_cast<std::uint32_t>(body.size()));
  w.raw(body);
  return f;
}

}  // namespace gz::store_proto
