// ThreadTransport: an in-process Transport for unit tests that run each rank
// as a thread (gloo's base_test approach): ranks publish their send buffers on
// a shared hub, wait for each other, copy what is theirs, and wait again so no
// sender reuses a buffer that is still being read. Host buffers only.
#pragma once

#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/store/hash_store.h"
#include "comm/transport.h"
#include "common/error.h"

namespace gz::test {

class ThreadHub {
 public:
  explicit ThreadHub(int size) : size_(size), sends_(static_cast<std::size_t>(size)) {}
  int size() const { return size_; }

  // Waits until all ranks arrive; throws IoError after `timeout`.
  void arrive(Timeout timeout) {
    std::unique_lock lock(mu_);
    const std::uint64_t gen = gen_;
    if (++count_ == size_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, timeout, [&] { return gen_ != gen; }))
      GZ_THROW(IoError, "thread transport: barrier timed out after ", timeout.count(), " ms");
  }
  std::vector<std::vector<ConstSlice>>& sends() { return sends_; }

 private:
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
  std::uint64_t gen_ = 0;
  std::vector<std::vector<ConstSlice>> sends_;
};

class ThreadTransport final : public Transport {
 public:
  ThreadTransport(std::shared_ptr<ThreadHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  const char* name() const override { return "thread"; }
  bool exact_sizes() const override { return true; }
  bool device_memory() const override { return false; }

  void allgatherv(ConstSlice send, std::span<const Slice> recv, std::span<std::size_t> received,
                  const CallContext& ctx) override {
    std::vector<ConstSlice> to(static_cast<std::size_t>(size()), send);
    exchange(to, recv, received, ctx);
  }
  void alltoallv(std::span<const ConstSlice> send, std::span<const Slice> recv, std::span<std::size_t> received,
                 const CallContext& ctx) override {
    exchange(std::vector<ConstSlice>(send.begin(), send.end()), recv, received, ctx);
  }
  void barrier(const CallContext& ctx) override { hub_->arrive(ctx.timeout); }

 private:
  void exchange(std::vector<ConstSlice> to, std::span<const Slice> recv, std::span<std::size_t> received,
                const CallContext& ctx) {
    GZ_ENFORCE(ctx.device == Device::Cpu, "thread transport: host buffers only");
    hub_->sends()[static_cast<std::size_t>(rank_)] = std::move(to);
    hub_->arrive(ctx.timeout);
    for (std::size_t i = 0; i < recv.size(); ++i) {
      const ConstSlice s = hub_->sends()[i][static_cast<std::size_t>(rank_)];
      if (s.bytes > recv[i].bytes) GZ_THROW(IoError, "thread transport: message truncated");
      if (s.bytes && recv[i].data != s.data) std::memmove(recv[i].data, s.data, s.bytes);
      received[i] = s.bytes;
    }
    hub_->arrive(ctx.timeout);
  }
  std::shared_ptr<ThreadHub> hub_;
  int rank_;
};

/// Runs fn(rank, transport, store) on `size` threads sharing one hub and one
/// HashStore; returns each rank's exception (null when it returned).
inline std::vector<std::exception_ptr> run_threads(
    int size, const std::function<void(int, Transport&, Store&)>& fn) {
  auto hub = std::make_shared<ThreadHub>(size);
  auto store = std::make_shared<HashStore>(Timeout(20000));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadTransport t(hub, r);
        fn(r, t, *store);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

inline std::string what(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "?";
}

}  // namespace gz::test
