// Store: the key-value rendezvous ranks use to find each other (worker
// addresses, NCCL's unique id) and to agree on a call before data moves.
// Small values, few keys: it is not a data path.
//
//   set(key, value)        publish (overwrites)
//   get(key[, timeout])    wait for key, return its value
//   wait(keys[, timeout])  wait until every key exists
//   add(key, delta)        atomic counter (a missing key counts as 0)
//   erase(keys)            delete keys (missing ones are ignored)
//
// Every wait has a timeout (timeout(), default default_timeout()); when it
// passes, IoError lists the keys still missing. Implementations:
// HashStore (in-process, tests), TcpStore (rank 0 hosts a server, every rank
// connects), PrefixStore (a namespace inside another store).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/base/env.h"

namespace gz {

class Store {
 public:
  explicit Store(Timeout timeout = default_timeout()) : timeout_(timeout) {}
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Sets key to value (bytes; may contain NULs).
  void set(const std::string& key, std::string_view value) { do_set(key, value); }
  /// Waits until key exists, returns its value. Throws IoError on timeout.
  std::string get(const std::string& key) { return get(key, timeout_); }
  std::string get(const std::string& key, Timeout timeout) {
    do_wait({key}, timeout);
    return do_get(key);
  }
  /// Waits until every key exists. Throws IoError listing the missing keys.
  void wait(const std::vector<std::string>& keys) { do_wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, Timeout timeout) { do_wait(keys, timeout); }
  /// Adds delta to the counter at key (created as 0), returns the new value.
  std::int64_t add(const std::string& key, std::int64_t delta) { return do_add(key, delta); }
  /// Deletes the keys that exist; the others are ignored.
  void erase(const std::vector<std::string>& keys) {
    if (!keys.empty()) do_erase(keys);
  }

  Timeout timeout() const { return timeout_; }
  void set_timeout(Timeout t) { timeout_ = t; }

 protected:
  virtual void do_set(const std::string& key, std::string_view value) = 0;
  /// The key exists (do_wait returned); returns its value.
  virtual std::string do_get(const std::string& key) = 0;
  virtual void do_wait(const std::vector<std::string>& keys, Timeout timeout) = 0;
  virtual std::int64_t do_add(const std::string& key, std::int64_t delta) = 0;
  virtual void do_erase(const std::vector<std::string>& keys) = 0;

 private:
  Timeout timeout_;
};

/// "a, b, c" (at most 8 keys, then a count), for timeout messages.
std::string join_keys(const std::vector<std::string>& keys);

}  // namespace gz
