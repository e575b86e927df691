// HashStore: an in-process Store (a map and a condition variable), for unit
// tests that run each rank as a thread. Thread-safe.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "comm/store/store.h"

namespace gz {

class HashStore final : public Store {
 public:
  using Store::Store;

  /// Keys held (tests check that erased keys are gone).
  std::size_t size() {
    std::lock_guard lock(mu_);
    return data_.size();
  }

 protected:
  void do_set(const std::string& key, std::string_view value) override;
  std::string do_get(const std::string& key) override;
  void do_wait(const std::vector<std::string>& keys, Timeout timeout) override;
  std::int64_t do_add(const std::string& key, std::int64_t delta) override;
  void do_erase(const std::vector<std::string>& keys) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string, std::less<>> data_;
};

}  // namespace gz
