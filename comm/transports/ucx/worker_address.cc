#include "comm/transports/ucx/worker_address.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace gz {
namespace {

constexpr unsigned kV1 = 0, kV2 = 1;  // UCP_OBJECT_VERSION_V1, _V2
constexpr unsigned kFlagDebugInfo = 1, kFlagUuid = 2, kFlagClientId = 4, kKnownFlags = 0xf;
constexpr unsigned kNullResource = 0xff;
constexpr unsigned kMaxResources = 128;  // UCP_MAX_RESOURCES
constexpr unsigned kMaxMds = 64;         // UCP_MAX_MDS

// A bounds-checked cursor: the first failure sticks.
class Walk {
 public:
  explicit Walk(std::string_view s) : s_(s) {}
  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  std::size_t pos() const { return pos_; }
  bool at_end() const { return pos_ == s_.size(); }
  unsigned peek() const { return pos_ < s_.size() ? static_cast<std::uint8_t>(s_[pos_]) : 0u; }
  unsigned byte(const char* what) {
    if (!need(1, what)) return 0;
    return static_cast<std::uint8_t>(s_[pos_++]);
  }
  void skip(std::size_t n, const char* what) {
    if (need(n, what)) pos_ += n;
  }
  // A length or index in the low bits of a byte; in v2, all ones in the mask
  // means the value is the next byte.
  unsigned extended(unsigned value, unsigned mask, unsigned version, const char* what) {
    value &= mask;
    return version != kV1 && value == mask ? byte(what) : value;
  }
  bool floats_finite(std::size_t count) const {
    for (std::size_t i = 0; i < count; ++i) {
      float f;
      std::memcpy(&f, s_.data() + pos_ + 4 * i, 4);
      if (!std::isfinite(f)) return false;
    }
    return true;
  }
  void fail(std::string why) {
    if (ok()) why_ = std::move(why);
  }

 private:
  bool need(std::size_t n, const char* what) {
    if (!ok()) return false;
    if (s_.size() - pos_ < n) {
      fail(std::string("truncated reading ") + what + " at byte " + std::to_string(pos_) + " of " +
           std::to_string(s_.size()));
      return false;
    }
    return true;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  std::string why_;
};

// The header: version and flags; "" or why not.
std::string header(std::string_view a, unsigned* version, unsigned* flags) {
  if (a.empty()) return "it is empty";
  *version = static_cast<std::uint8_t>(a[0]) & 0xfu;
  if (*version != kV1 && *version != kV2)
    return "address version " + std::to_string(*version) + " is neither v1 nor v2";
  if (*version == kV1) {
    *flags = static_cast<std::uint8_t>(a[0]) >> 4;
  } else {
    if (a.size() < 2) return "truncated reading the header";
    *flags = static_cast<std::uint8_t>(a[1]);
  }
  if (*flags & ~kKnownFlags) return "unknown header flags " + std::to_string(*flags);
  return {};
}

// Walks the whole address with `attr_bytes` of attributes per interface.
std::string walk(std::string_view a, std::size_t attr_bytes) {
  unsigned version = 0, flags = 0;
  if (std::string why = header(a, &version, &flags); !why.empty()) return why;
  Walk w(a);
  w.skip(version == kV1 ? 1 : 2, "the header");
  if (version == kV1 || (flags & kFlagUuid)) w.skip(8, "the worker uuid");
  if (flags & kFlagClientId) w.skip(8, "the client id");
  if (flags & kFlagDebugInfo) w.skip(w.byte("the name length"), "the worker name");
  if (w.ok() && w.peek() == kNullResource) {
    w.skip(1, "the device list");
  } else {
    unsigned devices = 0, ifaces = 0;
    bool last_dev = false;
    while (w.ok() && !last_dev) {
      if (++devices > kMaxResources) w.fail("more than 128 devices");
      const unsigned md_byte = w.byte("a memory domain");
      const bool empty = md_byte & 0x80u;
      const unsigned md = w.extended(md_byte, version == kV1 ? 0x1fu : 0x7fu, version, "a memory domain");
      if (w.ok() && md >= kMaxMds) w.fail("memory domain index " + std::to_string(md) + " is over 63");
      const unsigned len_byte = w.byte("a device address length");
      last_dev = len_byte & 0x80u;
      const unsigned dev_len = w.extended(len_byte, 0x1fu, version, "a device address length");
      if (len_byte & 0x40u) w.skip(1, "a path count");
      if (len_byte & 0x20u) w.skip(1, "a system device");
      w.skip(dev_len, "a device address");
      bool last_iface = empty;
      while (w.ok() && !last_iface) {
        if (++ifaces > kMaxResources) w.fail("more than 128 interfaces");
        w.skip(2, "a transport name checksum");
        if (w.ok() && version == kV1 && w.pos() + 12 <= a.size() && !w.floats_finite(3))
          w.fail("an interface's attributes are not finite");
        w.skip(attr_bytes, "an interface's attributes");
        const unsigned b = w.byte("an interface address length");
        last_iface = b & 0x80u;
        if (w.ok() && (b & 0x40u)) w.fail("a worker address carries no endpoint addresses");
        w.skip(w.extended(b, 0x3fu, version, "an interface address length"), "an interface address");
      }
    }
  }
  if (!w.ok()) return w.why();
  if (!w.at_end()) return std::to_string(a.size() - w.pos()) + " trailing bytes";
  return {};
}

}  // namespace

std::string check_worker_address(std::string_view peer, std::string_view own) {
  unsigned pv = 0, pf = 0, ov = 0, of = 0;
  if (std::string why = header(peer, &pv, &pf); !why.empty()) return why;
  if (!header(own, &ov, &of).empty()) return {};  // not a layout this check knows: UCX's own checks only
  if (pv != ov)
    return "address version v" + std::to_string(pv + 1) + " differs from this rank's v" + std::to_string(ov + 1) +
           " (UCX_ADDRESS_VERSION differs between ranks)";
  // The attributes' size: v1 16 bytes, v2 8, each + 1 when resource indices
  // are packed. The first that walks this rank's own address is this UCX's.
  const std::size_t v1_sizes[] = {16, 17}, v2_sizes[] = {8, 9};
  for (std::size_t attr : (pv == kV1 ? v1_sizes : v2_sizes))
    if (walk(own, attr).empty()) return walk(peer, attr);
  return {};  // unified mode (no lengths in the address): the header was checked
}

}  // namespace gz
