// ErrorFeedback: the error-feedback state of one gradient buffer, which the
// user keeps across steps and hands to every collective call on that buffer
// (allreduce(), reduce_scatter(), Communicator). Python's
// gradzip.ErrorFeedback wraps it for the collectives, and holds a codec's
// residual itself for Codec.encode: one name for the state in both languages.
//
//   gz::ErrorFeedback ef;                        // one per gradient buffer
//   comm->allreduce(grad, n, *codec, ef, call);  // step 1 binds it; every step updates it
//   const std::string saved = ef.save();         // checkpoint
//   gz::ErrorFeedback resumed;
//   resumed.restore(saved);                      // continues bit-identically
//
// What it holds: the worker residual (n floats; hierarchical: this rank's
// shard) and, for scatter_reduce, the server residual of this rank's chunk
// (what the server codec has not yet sent of the chunk sums, in the sums'
// units: any server codec can carry it on, so it is not part of the layout).
// reduce_scatter() keeps the worker residual only. (The per-element rule
// the codecs apply to a residual is kernels/error_feedback.h.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/engine/collective.h"
#include "comm/base/memory.h"
#include "comm/engine/topology.h"
#include "common/dtype.h"
#include "common/stream.h"
#include "compressors/spec.h"

namespace gz {

namespace detail {
struct Run;
}

/// Created as zeros on first use, in the buffer's memory (host or CUDA);
/// persistent across calls; bound from then on to one layout (codec spec, n,
/// rank, world size, algorithm): a state serves one buffer and one collective
/// (a state bound to an allreduce is refused by reduce_scatter, and the
/// reverse). save()/restore() carry it across a checkpoint, and a restored
/// state continues bit-identically. Move-only.
class ErrorFeedback {
 public:
  ErrorFeedback() = default;
  ErrorFeedback(const ErrorFeedback&) = delete;
  ErrorFeedback& operator=(const ErrorFeedback&) = delete;
  ErrorFeedback(ErrorFeedback&&) = default;
  ErrorFeedback& operator=(ErrorFeedback&&) = default;

  /// Serialises the layout and residuals (a copy from the device if needed).
  /// Throws InvalidArgument on a state that was never used or restored.
  std::string save() const;
  /// Loads what save() wrote. Throws InvalidArgument for malformed bytes, or
  /// when this state is already bound to a different layout.
  void restore(std::string_view bytes);
  /// Forgets layout and residuals: the next call starts from zeros.
  void reset();
  /// The group changed (a torchft quorum): the next call may bind the state
  /// at another rank, world size or algorithm, for the same codec and n.
  /// The worker residual (what this rank has not yet sent of its own
  /// buffer) carries over when that call's layout has one of the same size
  /// (every flat algorithm: the whole buffer's); the server residual (the
  /// sums of a chunk this rank owned in the old group) starts from zeros,
  /// as does a worker residual that cannot carry (hierarchical: a shard by
  /// the nodes). Nothing for an unbound state. Until that call the state
  /// keeps its old layout (save() writes it, the server residual zeroed).
  void regroup();
  /// Sets the residuals to zeros, keeping the layout and the ranks' last
  /// agreement: the next call sends what a fresh state would, and the other
  /// ranks' states need not change (a fresh state would agree again, alone).
  /// torchft's healed replica. Nothing for an unbound state.
  void zero();
  /// Rebinds a bound state to codec `spec`, keeping its residuals, when the
  /// layout's residual sizes are the same for it (top-k at another density:
  /// DGC's sparsity warm-up). The next call agrees on the new codec. Throws
  /// InvalidArgument for an unbound or hierarchical state, other residual
  /// sizes, or residuals that are not finite (the training diverged).
  void respec(std::string_view spec);
  /// The worker and server residuals (layout's worker_count and server_count
  /// floats), copied to the host. Throws InvalidArgument on an unbound state.
  std::pair<std::vector<float>, std::vector<float>> residuals() const;

  bool bound() const { return layout_.has_value(); }
  /// Bytes of residual memory held.
  std::size_t bytes() const { return worker_.capacity() + server_.capacity(); }

  /// What a state is bound to.
  struct Layout {
    std::string codec;  ///< canonical spec
    std::uint64_t n = 0;
    std::uint32_t rank = 0, world = 0;
    Algorithm algorithm = Algorithm::Allgather;
    std::uint64_t worker_count = 0, server_count = 0;  ///< residual floats
    bool operator==(const Layout&) const = default;
  };
  /// The residual floats a call needs: worker and server. `topology` is
  /// needed for Hierarchical only.
  static std::pair<std::uint64_t, std::uint64_t> residual_counts(const CodecConfig& codec, std::uint64_t n,
                                                                 int rank, int world, Algorithm algorithm,
                                                                 const Topology* topology);
  const std::optional<Layout>& layout() const { return layout_; }

 private:
  friend struct detail::Run;
  std::optional<Layout> layout_;
  Device device_ = Device::Cpu;
  Buffer worker_, server_;
  std::vector<float> pending_worker_, pending_server_;  // restored, not yet on the device
  bool pending_ = false;
  bool regrouped_ = false;  // regroup(): the next call may bind another rank, world size or algorithm
  // The last call signature the ranks agreed on, so later calls skip the Store.
  struct Agreed {
    CodecConfig codec;
    std::uint64_t n = 0;
    Algorithm algorithm = Algorithm::Auto;
    ReduceOp op = ReduceOp::Sum;
    Dtype dtype = Dtype::Float32;
    std::size_t segment = 0;
    std::string topology;
    CodecConfig server;
  };
  std::optional<Agreed> agreed_;
  std::uint64_t agreed_context_ = 0;  // which workspace/transport agreed
};

/// The former name, for source compatibility; to be removed in the next release.
using AllreduceState [[deprecated("use gz::ErrorFeedback")]] = ErrorFeedback;

}  // namespace gz
