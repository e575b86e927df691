// The TcpStore wire protocol (client <-> server), little-endian on both ends
// (every supported host is):
//
//   frame     = u32 magic "GZS1" | u32 body_bytes (<= kMaxFrameBody) | body
//
// A connection starts with the handshake (store_handshake.h): the server's
// challenge, the client's hello, the server's welcome or refusal. Only then
// does the client send requests, and the server serves each connection's
// requests in order:
//
//   request   = u8 op | fields
//     Set     = u32 key_bytes | key | u32 value_bytes | value
//     Get     = u32 key_bytes | key
//     Wait    = u32 timeout_ms | u32 key_count | key_count x (u32 key_bytes | key)
//     Add     = u32 key_bytes | key | i64 delta
//     Erase   = u32 key_count | key_count x (u32 key_bytes | key)
//   reply     = u8 status | fields
//     Ok      Set: -   Get: value   Wait: -   Add: i64 value   Erase: -
//     Timeout (Wait) the keys still missing, as in Wait
//     Error   a message
//
// Fields are written and read with common/bytes.h; parse_request() is the one
// parser of requests (the server's, and the fuzzer's: tests/fuzz/). Limits
// (kMax*) bound every length a peer sends before anything is allocated; a
// frame that breaks them, a bad magic or an unknown op closes the connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/bytes.h"

namespace gz::store_proto {

inline constexpr std::uint32_t kMagic = 0x31535A47u;  // "GZS1"
inline constexpr std::size_t kFrameHeader = 8;
inline constexpr std::size_t kMaxKey = 1024;
inline constexpr std::size_t kMaxValue = 1u << 20;
inline constexpr std::size_t kMaxWaitKeys = 4096;
inline constexpr std::size_t kMaxFrameBody = 4 << 20;

enum class Op : std::uint8_t { Set = 1, Get = 2, Wait = 3, Add = 4, Erase = 5 };
enum class Status : std::uint8_t { Ok = 0, Timeout = 1, Error = 2 };

/// A frame: header then body.
inline std::string frame(std::string_view body) {
  std::string f;
  f.reserve(kFrameHeader + body.size());
  bytes::Writer w(f);
  w.put(kMagic);
  w.put(static_cast<std::uint32_t>(body.size()));
  w.raw(body);
  return f;
}

/// The body length a frame header announces, or nullopt for a bad magic or
/// a length of 0 or over `max_body`.
std::optional<std::uint32_t> frame_length(std::string_view header, std::size_t max_body);

/// A parsed request; views point into the body it was parsed from.
struct Request {
  Op op = Op::Get;
  std::vector<std::string_view> keys;  ///< one for Set/Get/Add; 1..kMaxWaitKeys for Wait/Erase
  std::string_view value;              ///< Set
  std::int64_t delta = 0;              ///< Add
  std::uint32_t timeout_ms = 0;        ///< Wait
};

/// Parses one request body. nullopt when it is malformed: truncated, trailing
/// bytes, an empty or oversized key or value, a bad key count, an unknown op.
std::optional<Request> parse_request(std::string_view body);

}  // namespace gz::store_proto
