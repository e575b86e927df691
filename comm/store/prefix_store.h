// PrefixStore: a namespace inside another store ("prefix/key"), so that each
// communicator, test or benchmark phase has keys of its own.
#pragma once

#include <memory>

#include "comm/store/store.h"

namespace gz {

class PrefixStore final : public Store {
 public:
  /// @param[in] prefix  prepended as "prefix/"
  /// @param[in] store   the store holding the keys (shared)
  PrefixStore(std::string prefix, std::shared_ptr<Store> store)
      : Store(store->timeout()), prefix_(std::move(prefix) + "/"), store_(std::move(store)) {}

 protected:
  void do_set(const std::string& key, std::string_view value) override { store_->set(prefix_ + key, value); }
  std::string do_get(const std::string& key) override { return store_->get(prefix_ + key, Timeout(0)); }
  void do_wait(const std::vector<std::string>& keys, Timeout timeout) override { store_->wait(prefixed(keys), timeout); }
  std::int64_t do_add(const std::string& key, std::int64_t delta) override { return store_->add(prefix_ + key, delta); }
  void do_erase(const std::vector<std::string>& keys) override { store_->erase(prefixed(keys)); }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    return full;
  }
  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace gz
