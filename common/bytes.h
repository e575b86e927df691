// Little-endian byte strings that cross a process boundary: Store frames,
// saved error-feedback states. One writer and one reader, so every format
// gradzip reads from outside is parsed with the same bounds checks.
//
//   std::string s;
//   bytes::Writer w(s);
//   w.put<std::uint32_t>(7); w.str("key");           // u32 length + bytes
//
//   bytes::Reader r(s);
//   auto v = r.get<std::uint32_t>("count");          // 0 once a read failed
//   auto k = r.str(1024, "key");                     // over the limit: fails
//   if (!r.ok()) reject(r.failure());                // "truncated reading count at byte 0 of 2"
//
// A read past the end, or a string over its limit, clears ok() and returns
// zero/empty from then on: a parser reads all of its fields and checks once.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace gz::bytes {

static_assert(std::endian::native == std::endian::little,
              "gradzip's byte formats are little-endian, and only little-endian hosts are supported");

/// Appends little-endian fields to a string.
class Writer {
 public:
  explicit Writer(std::string& out) : s_(out) {}
  template <class T>
  void put(T v) {
    static_assert(std::is_arithmetic_v<T>, "put() takes numbers");
    s_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  /// u32 length, then the bytes.
  void str(std::string_view v) {
    put(static_cast<std::uint32_t>(v.size()));
    s_.append(v);
  }
  void raw(std::string_view v) { s_.append(v); }

 private:
  std::string& s_;
};

/// Reads little-endian fields from bytes it does not trust.
class Reader {
 public:
  explicit Reader(std::string_view in) : s_(in) {}

  bool ok() const { return what_ == nullptr; }
  bool at_end() const { return pos_ == s_.size(); }
  std::size_t pos() const { return pos_; }
  std::size_t left() const { return s_.size() - pos_; }
  /// Why the first failed read failed ("" while ok()).
  std::string failure() const {
    if (ok()) return {};
    return std::string(over_limit_ ? "over its limit: " : "truncated reading ") + what_ + " at byte " +
           std::to_string(fail_pos_) + " of " + std::to_string(s_.size());
  }

  template <class T>
  T get(const char* what = "a number") {
    static_assert(std::is_arithmetic_v<T>, "get() reads numbers");
    T v{};
    if (need(sizeof v, what)) {
      std::memcpy(&v, s_.data() + pos_, sizeof v);
      pos_ += sizeof v;
    }
    return v;
  }
  /// A u32 length (at most `max`), then that many bytes.
  std::string_view str(std::size_t max, const char* what = "a string") {
    const auto n = get<std::uint32_t>(what);
    if (ok() && n > max) {
      fail(what, true);
      return {};
    }
    return raw(n, what);
  }
  /// The next n bytes.
  std::string_view raw(std::size_t n, const char* what = "bytes") {
    if (!need(n, what)) return {};
    const std::string_view v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }

 private:
  bool need(std::size_t n, const char* what) {
    if (!ok()) return false;
    if (n > s_.size() - pos_) {
      fail(what, false);
      return false;
    }
    return true;
  }
  void fail(const char* what, bool over_limit) {
    what_ = what;
    fail_pos_ = pos_;
    over_limit_ = over_limit;
  }
  std::string_view s_;
  std::size_t pos_ = 0;
  const char* what_ = nullptr;
  std::size_t fail_pos_ = 0;
  bool over_limit_ = false;
};

}  // namespace gz::bytes
