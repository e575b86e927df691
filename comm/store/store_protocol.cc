#include "comm/store/store_protocol.h"

namespace gz::store_proto {

std::optional<std::uint32_t> frame_length(std::string_view header, std::size_t max_body) {
  bytes::Reader r(header.substr(0, kFrameHeader));
  const std::uint32_t magic = r.get<std::uint32_t>(), len = r.get<std::uint32_t>();
  if (!r.ok() || magic != kMagic || len == 0 || len > max_body) return std::nullopt;
  return len;
}

std::optional<Request> parse_request(std::string_view body) {
  bytes::Reader r(body);
  Request q;
  bool keys_ok = true;
  const auto op = r.get<std::uint8_t>("op");
  auto key = [&] {
    const std::string_view k = r.str(kMaxKey, "key");
    keys_ok = keys_ok && !k.empty();
    q.keys.push_back(k);
  };
  auto key_list = [&] {
    const auto count = r.get<std::uint32_t>("key count");
    if (!r.ok() || count == 0 || count > kMaxWaitKeys) return false;
    q.keys.reserve(count);
    for (std::uint32_t i = 0; i < count && r.ok(); ++i) key();
    return true;
  };
  switch (static_cast<Op>(op)) {
    case Op::Set:
      key();
      q.value = r.str(kMaxValue, "value");
      break;
    case Op::Get:
      key();
      break;
    case Op::Wait:
      q.timeout_ms = r.get<std::uint32_t>("timeout");
      if (!key_list()) return std::nullopt;
      break;
    case Op::Add:
      key();
      q.delta = r.get<std::int64_t>("delta");
      break;
    case Op::Erase:
      if (!key_list()) return std::nullopt;
      break;
    default:
      return std::nullopt;
  }
  if (!r.ok() || !r.at_end() || !keys_ok) return std::nullopt;
  q.op = static_cast<Op>(op);
  return q;
}

}  // namespace gz::store_proto
