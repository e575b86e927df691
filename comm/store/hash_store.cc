#include "comm/store/hash_store.h"

#include <charconv>

#include "common/error.h"

namespace gz {

void HashStore::do_set(const std::string& key, std::string_view value) {
  {
    std::lock_guard lock(mu_);
    data_[key] = std::string(value);
  }
  cv_.notify_all();
}

std::string HashStore::do_get(const std::string& key) {
  std::lock_guard lock(mu_);
  const auto it = data_.find(key);
  if (it == data_.end()) GZ_THROW(IoError, "store: key '", key, "' vanished");
  return it->second;
}

void HashStore::do_wait(const std::vector<std::string>& keys, Timeout timeout) {
  std::unique_lock lock(mu_);
  auto missing = [&] {
    std::vector<std::string> m;
    for (const auto& k : keys)
      if (!data_.count(k)) m.push_back(k);
    return m;
  };
  if (!cv_.wait_for(lock, timeout, [&] { return missing().empty(); }))
    GZ_THROW(IoError, "store: timed out after ", timeout.count(), " ms waiting for keys: ", join_keys(missing()));
}

std::int64_t HashStore::do_add(const std::string& key, std::int64_t delta) {
  std::int64_t v = 0;
  {
    std::lock_guard lock(mu_);
    auto& s = data_[key];
    if (!s.empty()) {
      const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc() || p != s.data() + s.size())
        GZ_THROW(InvalidArgument, "store: add on key '", key, "' whose value is not a counter");
    }
    v += delta;
    s = std::to_string(v);
  }
  cv_.notify_all();
  return v;
}

void HashStore::do_erase(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  for (const auto& k : keys) data_.erase(k);
}

}  // namespace gz
