// Communicator: a Store, a Transport and the allreduce workspace, bundled for
// users (and for the Python bindings, which bind exactly this class).
//
//   auto comm = gz::Communicator::from_env("ucx");   // comm/transports/registry.h
//   auto codec = gz::make_codec("onebit");
//   gz::ErrorFeedback state;                     // error feedback: one per gradient buffer
//   gz::AllreduceCall call;
//   call.op = gz::ReduceOp::Average;
//   comm->allreduce(grad, n, *codec, state, call);
//
// Thread-compatible: one call at a time (the workspace and the transport are
// shared by every call); calls from several threads need a lock around them.
// Every rank must make the same calls in the same order.
// After an IoError the communicator is broken: build a new one.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "comm/cost/cost_model.h"
#include "comm/engine/allreduce.h"
#include "comm/engine/error_feedback.h"
#include "comm/engine/reduce_scatter.h"
#include "comm/store/store.h"
#include "comm/transports/registry.h"
#include "comm/transports/transport.h"

namespace gz {

class AutoChoice;  // comm/cost/auto_choice.h

struct CommunicatorOptions {
  Timeout timeout = default_timeout();  ///< default for every call (and the rendezvous)
  std::string prefix = "gradzip";       ///< Store namespace of this communicator
  int cuda_device = -1;                 ///< a device transport's GPU (-1: LOCAL_RANK modulo the GPU count)
  /// Closing waits (briefly) for every rank, so that rank 0's store and the
  /// endpoints outlive every rank's last call. Off for a transport over
  /// endpoints and a store someone else owns (torch's process group).
  bool closing_barrier = true;
  /// The link between nodes, "1gbit" or "10gbit,50us" (empty: GRADZIP_LINK,
  /// which gradzip-run --link sets). Known, auto runs the algorithm the cost
  /// model predicts fastest (comm/cost/auto_choice.h); unknown, the one that
  /// sends the fewest bytes. Rank 0's is used by every rank.
  std::string link;
  /// This rank's node, as discovery names it (empty: from the launcher's
  /// variables, node_name_from_env). A group whose members are not the
  /// launcher's ranks names them itself: torchft's replicas, each a node.
  std::string node;
};

/// Per-call settings of Communicator::allreduce and reduce_scatter.
struct AllreduceCall {
  ReduceOp op = ReduceOp::Sum;
  Algorithm algorithm = Algorithm::Auto;
  Device device = Device::Cpu;
  Stream stream = nullptr;
  std::optional<Timeout> timeout;    ///< default: the communicator's
  std::size_t segment_bytes = 0;     ///< payload bytes per pipeline segment (0: the default)
  std::optional<CodecConfig> server_codec;  ///< scatter_reduce's chunk sums (unset: server_codec_config)
  AllreduceStats* stats = nullptr;   ///< [out] optional
};

/// The key that tags the values gradzip puts in a store it did not open
/// (torch's): GRADZIP_JOB_TOKEN's when set, else one rank 0 draws and
/// shares at `prefix`/job-key (which keeps other jobs and blind writers out,
/// not a stranger who can read that store). Collective.
std::string shared_job_key(Store& store, const std::string& prefix, int rank, Timeout timeout);

class Communicator {
 public:
  /// Rendezvous from the torchrun variables (rank_info_from_env) and
  /// GRADZIP_JOB_TOKEN: rank 0 hosts the TcpStore, which admits this job's
  /// ranks only; then the transport connects every pair, and the ranks learn
  /// each other's nodes (discover_topology). Collective.
  /// `transport`: a registered transport's name (comm/transports/registry.h).
  static std::unique_ptr<Communicator> from_env(std::string_view transport, const CommunicatorOptions& options = {});

  /// Over a store the caller already shares with the other ranks (e.g.
  /// torch.distributed's): the transport rendezvous under options.prefix.
  /// Values are tagged with GRADZIP_JOB_TOKEN when set, else with a key rank 0
  /// shares through the store (comm/store/sealed_store.h; docs/comm.md says
  /// what each guarantees).
  /// `local_rank` picks the GPU of a device transport when options.cuda_device < 0. Collective.
  static std::unique_ptr<Communicator> create(std::string_view transport, std::shared_ptr<Store> store, int rank,
                                              int world_size, int local_rank, const CommunicatorOptions& options = {});

  /// Over a transport the caller made (e.g. one a Python object drives): the
  /// ranks learn each other's nodes through `store` under options.prefix,
  /// its values sealed as create() above seals them. Collective.
  static std::unique_ptr<Communicator> create(std::shared_ptr<Store> store, std::unique_ptr<Transport> transport,
                                              const CommunicatorOptions& options = {});

  /// From parts (tests use a HashStore and threads). The topology defaults to
  /// every rank a node of its own.
  Communicator(std::shared_ptr<Store> store, std::unique_ptr<Transport> transport, CommunicatorOptions options = {},
               std::optional<Topology> topology = std::nullopt);
  /// When nothing failed (and options.closing_barrier), waits (briefly) for
  /// every rank to arrive, so that rank 0's store and every endpoint outlive
  /// the last call of every rank.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }

  /// buffer[0..n) = sum (or average) over ranks; see allreduce.h.
  /// @param[in,out] buffer  n floats on call.device
  /// @param[in]     codec   the same spec on every rank
  /// @param[in,out] state   error feedback of this buffer
  void allreduce(float* buffer, std::size_t n, Codec& codec, ErrorFeedback& state, const AllreduceCall& call = {}) {
    allreduce(buffer, Dtype::Float32, n, codec, state, call);
  }
  /// The same on n elements of `dtype` (float16 and bfloat16 too; allreduce.h).
  void allreduce(void* buffer, Dtype dtype, std::size_t n, Codec& codec, ErrorFeedback& state,
                 const AllreduceCall& call = {});

  /// buffer's chunk rank() (chunk_range(n, size(), rank())) = that chunk's
  /// sum (or average) over ranks; the other chunks are read only. See
  /// reduce_scatter.h. call.algorithm must be Auto.
  /// @param[in,out] state   error feedback of this buffer (not shared with allreduce)
  void reduce_scatter(float* buffer, std::size_t n, Codec& codec, ErrorFeedback& state,
                      const AllreduceCall& call = {});

  void barrier();

  /// What allreduce() runs for `call.algorithm` on n elements of `codec`
  /// (Auto: by the cost model when the link is known, else by bytes).
  /// Collective when Auto (see comm/cost/auto_choice.h).
  Algorithm resolve_algorithm(const Codec& codec, std::size_t n, const AllreduceCall& call);
  /// The cost model's inputs for allreduce() on n elements of `codec`
  /// (gz::predict(algorithm, inputs) predicts a call), nullopt when the model
  /// is off (no link, CUDA, one rank). Collective.
  std::optional<CostInputs> cost_inputs(const Codec& codec, std::size_t n, const AllreduceCall& call);

  Transport& transport() { return *transport_; }
  /// Which node each rank runs on (the hierarchical allreduce uses it).
  const Topology& topology() const { return topology_; }
  Store& store() { return *store_; }
  const AllreduceWorkspace& workspace() const { return workspace_; }
  /// Scratch held beyond the user's buffers and EF states: payload slots,
  /// chunk sum, codec scratch, and the transport's pinned staging.
  std::size_t workspace_bytes() const { return workspace_.bytes() + transport_->staging_bytes(); }
  Timeout timeout() const { return options_.timeout; }
  bool broken() const { return broken_; }

 private:
  // The store sealed with job_key under options.prefix, and the transport over it.
  // The call's options, from the communicator's parts; throws IoError when broken.
  AllreduceOptions options_for(void* buffer, Dtype dtype, std::size_t n, Codec& codec, ErrorFeedback& state,
                               const AllreduceCall& call);
  // Runs f; an IoError marks the communicator broken.
  template <class F>
  void guarded(F&& f);

  static std::unique_ptr<Communicator> assemble(const TransportDescriptor& transport, std::shared_ptr<Store> store,
                                                const std::string& job_key, int rank, int world_size, int local_rank,
                                                const CommunicatorOptions& options);

  std::shared_ptr<Store> store_;
  std::unique_ptr<Transport> transport_;
  CommunicatorOptions options_;
  Topology topology_;
  AllreduceWorkspace workspace_;
  std::unique_ptr<AutoChoice> auto_;
  bool broken_ = false;
};

}  // namespace gz
