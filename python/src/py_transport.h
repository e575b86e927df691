// PyTransport: a gz::Transport whose exchanges a Python object performs, so
// that the C++ algorithms (comm/allreduce*) run over a transport that lives
// in Python: torch.distributed's process group (gloo on CPU, NCCL on GPU;
// gradzip/torch/_torch_transport.py is that object).
//
// The algorithms run with the GIL released; each call here takes the GIL for
// its own duration only (the Python side releases it again inside torch's
// waits), so the training thread keeps running Python while an allreduce is
// in flight on a worker thread.
//
// The Python object ("driver") has:
//   rank, size: int            this rank and the group's size
//   name: str                  for messages ("torch-gloo", ...)
//   device_memory: bool        exchanges take CUDA buffers (NCCL)
//   cuda_device: int           the CUDA device of those buffers (-1: none)
//   start(sends, recvs, stream) -> handle
//       sends, recvs: lists of (peer, torch.Tensor of uint8) in posting
//       order; stream: the CUDA stream (int) to order device buffers after
//       (0 for host buffers). Posts them and returns at once.
//   test(handle) -> bool       complete? (may say False until wait())
//   wait(handle, seconds)      returns once complete; raises at the deadline
//   abort(handles, why)        cancels them (and the group where it can)
//   synchronize(stream, seconds)  device memory: waits for the stream
// Any exception it raises becomes gz::IoError, and breaks the transport.
//
// Sizes: a receive learns only its own size (exact_sizes() is false), as
// torch's P2P calls report none; the algorithms then send exactly what the
// receive posts (the codec's size for the segment's count).
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/transports/transport.h"

namespace gzpy {

class PyTransport final : public gz::Transport {
 public:
  /// Reads the driver's rank, size, name and device attributes (takes the GIL).
  explicit PyTransport(nanobind::object driver);
  ~PyTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return name_.c_str(); }

  Exchange start(std::span<const gz::SendOp> sends, std::span<const gz::RecvOp> recvs,
                 const gz::CallContext& ctx) override;
  bool test(Exchange x) override;
  void wait(Exchange x) override;
  void abort(std::string_view why) override;
  void synchronize(const gz::CallContext& ctx) override;

  bool exact_sizes() const override { return false; }
  bool device_memory() const override { return device_memory_; }

 private:
  using Clock = std::chrono::steady_clock;

  // One started exchange: the driver's handle, where to report sizes, and
  // its deadline (start + the call's timeout).
  struct Pending {
    std::uint64_t id = 0;
    nanobind::object handle;
    std::vector<std::pair<std::size_t*, std::size_t>> received;
    Clock::time_point deadline;
  };

  Pending* find(Exchange x);
  // Reports sizes and forgets the exchange (GIL held).
  void complete(Pending* p);
  // Throws IoError once broken (after an error or abort()).
  void check_usable() const;
  // Forgets every exchange in flight, asking the driver to cancel them (GIL held).
  void drop_all(std::string_view why);
  [[noreturn]] void fail(std::string_view op, std::string_view what);

  nanobind::object driver_;
  int rank_ = 0, size_ = 1;
  std::string name_;
  bool device_memory_ = false;
  int cuda_device_ = -1;
  std::vector<Pending> pending_;  // at most a few in flight: a vector beats a map
  std::uint64_t next_id_ = 1;
  bool broken_ = false;
  std::string why_broken_;
};

}  // namespace gzpy
