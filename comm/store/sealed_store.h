// SealedStore: every value tagged with the job's key, so that a value no
// member wrote is never taken for one.
//
//   sealed value = u32 magic "GZV1" | u32 value_bytes | value | 16-byte tag
//   tag          = HMAC-SHA256(job key, "gradzip value\n" | u32 key_bytes | key | value), first 16 bytes
//
// The tag binds the value to its full key (a value copied to another key, or
// from another job, does not verify) and catches corruption. With a secret
// job key (GRADZIP_JOB_TOKEN) a stranger who can write to the underlying
// store, e.g. torch's TCPStore, which has no authentication, can delete or
// overwrite values (the job then fails with an IoError naming the key), but
// cannot make a rank accept a value of its choosing. Counters (add) are not
// sealed: the server does their arithmetic. Waits see only that a key exists;
// get() is where a value is checked.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "comm/store/store.h"

namespace gz {

/// The sealed form of `value` at `key`.
std::string seal_value(std::string_view job_key, std::string_view key, std::string_view value);
/// The value inside `sealed`; throws IoError naming the key when it is
/// malformed or its tag does not verify.
std::string unseal_value(std::string_view job_key, std::string_view key, std::string_view sealed);

class SealedStore final : public Store {
 public:
  /// @param[in] store    the store holding the sealed values (shared)
  /// @param[in] job_key  the key of the tags (JobIdentity::mac_key, or one the ranks share)
  SealedStore(std::shared_ptr<Store> store, std::string job_key)
      : Store(store->timeout()), store_(std::move(store)), job_key_(std::move(job_key)) {}

 protected:
  void do_set(const std::string& key, std::string_view value) override {
    store_->set(key, seal_value(job_key_, key, value));
  }
  std::string do_get(const std::string& key) override {
    return unseal_value(job_key_, key, store_->get(key, Timeout(0)));
  }
  void do_wait(const std::vector<std::string>& keys, Timeout timeout) override { store_->wait(keys, timeout); }
  std::int64_t do_add(const std::string& key, std::int64_t delta) override { return store_->add(key, delta); }
  void do_erase(const std::vector<std::string>& keys) override { store_->erase(keys); }

 private:
  std::shared_ptr<Store> store_;
  std::string job_key_;
};

}  // namespace gz
