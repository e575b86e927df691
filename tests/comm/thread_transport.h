// ThreadTransport: an in-process Transport for unit tests that run each rank
// as a thread (gloo's base_test approach). A shared hub keeps, for every
// (sender, receiver) pair, the sends and receives posted and not yet matched,
// in posting order; whenever both queues of a pair have a head, the two match
// (transport.h's rule) and the bytes are copied. Exchanges complete when all
// their messages have matched. Host buffers only.
//
// Sizes::Slot makes a rank's transport report sizes as NCCL and torch's
// process group do (exact_sizes() false: a receive learns only its own
// capacity), and refuse a send whose size differs from the receive's, as
// those backends need them equal.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/store/hash_store.h"
#include "comm/transports/transport.h"
#include "common/error.h"

namespace gz::test {

class ThreadHub {
 public:
  /// One posted message (a send or a receive).
  struct Message {
    int src = 0, dst = 0;
    ConstSlice send;                  // sends
    Slice recv;                       // receives
    std::size_t* received = nullptr;  // receives
    bool same_size = false;           // receives of a Sizes::Slot transport
    bool done = false;
    bool truncated = false;
  };
  using Ptr = std::shared_ptr<Message>;

  explicit ThreadHub(int size) : size_(size) {}
  int size() const { return size_; }
  std::mutex& mutex() { return mu_; }
  std::condition_variable& cv() { return cv_; }

  /// Queues a message (lock held by the caller) and matches what it can.
  void post(const Ptr& m, bool is_send) {
    auto& q = queues_[{m->src, m->dst}];
    (is_send ? q.sends : q.recvs).push_back(m);
    while (!q.sends.empty() && !q.recvs.empty()) {
      const Ptr s = q.sends.front(), r = q.recvs.front();
      q.sends.pop_front();
      q.recvs.pop_front();
      if (s->send.bytes > r->recv.bytes || (r->same_size && s->send.bytes != r->recv.bytes)) {
        s->truncated = r->truncated = true;
      } else {
        if (s->send.bytes) std::memcpy(r->recv.data, s->send.data, s->send.bytes);
        *r->received = r->same_size ? r->recv.bytes : s->send.bytes;
      }
      s->done = r->done = true;
    }
    cv_.notify_all();
  }
  /// Drops the unmatched messages of one rank (lock held): an abort.
  void withdraw(const std::vector<Ptr>& ms) {
    for (auto& [pair, q] : queues_)
      for (auto* d : {&q.sends, &q.recvs})
        for (auto it = d->begin(); it != d->end();)
          it = std::find(ms.begin(), ms.end(), *it) != ms.end() ? d->erase(it) : it + 1;
  }

 private:
  struct Queues {
    std::deque<Ptr> sends, recvs;
  };
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, Queues> queues_;
};

/// How a ThreadTransport reports received sizes (see the top of this file).
enum class Sizes { Exact, Slot };

class ThreadTransport final : public Transport {
 public:
  ThreadTransport(std::shared_ptr<ThreadHub> hub, int rank, Sizes sizes = Sizes::Exact)
      : hub_(std::move(hub)), rank_(rank), sizes_(sizes) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  const char* name() const override { return "thread"; }
  bool exact_sizes() const override { return sizes_ == Sizes::Exact; }
  bool device_memory() const override { return false; }

  Exchange start(std::span<const SendOp> sends, std::span<const RecvOp> recvs, const CallContext& ctx) override {
    GZ_ENFORCE(ctx.device == Device::Cpu, "thread transport: host buffers only");
    check_usable();
    Pending p;
    p.deadline = std::chrono::steady_clock::now() + ctx.timeout;
    p.timeout = ctx.timeout;
    std::lock_guard lock(hub_->mutex());
    for (const RecvOp& r : recvs) {
      auto m = std::make_shared<ThreadHub::Message>();
      m->src = r.peer, m->dst = rank_, m->recv = r.data, m->received = r.received;
      m->same_size = sizes_ == Sizes::Slot;
      p.messages.push_back(m);
      hub_->post(m, false);
    }
    for (const SendOp& s : sends) {
      auto m = std::make_shared<ThreadHub::Message>();
      m->src = rank_, m->dst = s.peer, m->send = s.data;
      p.messages.push_back(m);
      hub_->post(m, true);
    }
    const std::uint64_t id = ++next_id_;
    pending_[id] = std::move(p);
    return Exchange{id};
  }

  bool test(Exchange x) override {
    Pending& p = find(x);
    std::unique_lock lock(hub_->mutex());
    if (!finished(p, lock)) return false;
    pending_.erase(x.id);
    return true;
  }

  void wait(Exchange x) override {
    Pending& p = find(x);
    std::unique_lock lock(hub_->mutex());
    while (!finished(p, lock)) hub_->cv().wait_until(lock, p.deadline);
    pending_.erase(x.id);
  }

  void abort(std::string_view) override {
    std::lock_guard lock(hub_->mutex());
    for (auto& [id, p] : pending_) hub_->withdraw(p.messages);
    pending_.clear();
    broken_ = true;
  }

 private:
  struct Pending {
    std::vector<ThreadHub::Ptr> messages;
    std::chrono::steady_clock::time_point deadline;
    Timeout timeout{0};
  };

  void check_usable() const {
    if (broken_) GZ_THROW(IoError, "thread transport rank ", rank_, ": broken by an earlier failure");
  }
  Pending& find(Exchange x) {
    check_usable();
    const auto it = pending_.find(x.id);
    GZ_ENFORCE(it != pending_.end(), "thread transport: exchange ", x.id, " is not in flight");
    return it->second;
  }
  // True when every message matched; throws (breaking the transport) on a
  // truncated message or at the deadline. Lock held.
  bool finished(Pending& p, std::unique_lock<std::mutex>& lock) {
    bool all = true;
    for (const auto& m : p.messages) {
      if (m->truncated) fail(p, lock, "message truncated, or (Sizes::Slot) a send and its receive of different sizes");
      all = all && m->done;
    }
    if (!all && std::chrono::steady_clock::now() >= p.deadline) {
      std::string peers;
      for (const auto& m : p.messages)
        if (!m->done) peers += " " + std::to_string(m->src == rank_ ? m->dst : m->src);
      fail(p, lock, "exchange timed out after " + std::to_string(p.timeout.count()) + " ms waiting for rank(s)" + peers);
    }
    return all;
  }
  [[noreturn]] void fail(Pending&, std::unique_lock<std::mutex>& lock, const std::string& what) {
    for (auto& [id, q] : pending_) hub_->withdraw(q.messages);
    pending_.clear();
    broken_ = true;
    lock.unlock();
    GZ_THROW(IoError, "thread transport rank ", rank_, ": ", what);
  }

  std::shared_ptr<ThreadHub> hub_;
  int rank_;
  Sizes sizes_;
  std::map<std::uint64_t, Pending> pending_;
  std::uint64_t next_id_ = 0;
  bool broken_ = false;
};

/// Runs fn(rank, transport, store) on `size` threads sharing one hub and one
/// HashStore; returns each rank's exception (null when it returned).
inline std::vector<std::exception_ptr> run_threads(
    int size, const std::function<void(int, Transport&, Store&)>& fn, Sizes sizes = Sizes::Exact) {
  auto hub = std::make_shared<ThreadHub>(size);
  auto store = std::make_shared<HashStore>(Timeout(20000));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadTransport t(hub, r, sizes);
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
