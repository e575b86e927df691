#include "comm/engine/communicator.h"

#include <algorithm>

#include "comm/cost/auto_choice.h"
#include "comm/engine/allreduce_run.h"
#include "comm/security/crypto.h"
#include "comm/store/prefix_store.h"
#include "comm/store/sealed_store.h"
#include "comm/store/tcp_store.h"
#include "common/error.h"

namespace gz {

// The key that tags the values of a communicator over a store gradzip did not
// open (torch's): GRADZIP_JOB_TOKEN when set; else one rank 0 draws and
// shares through that store. The shared key keeps other jobs' values and
// blind writers out, but not a stranger who can read the store (torch's
// TCPStore has no authentication): only a token does that.
std::string shared_job_key(Store& store, const std::string& prefix, int rank, Timeout timeout) {
  // Someone else's store (torch's): the warning about gradzip's own
  // unauthenticated rendezvous does not apply.
  const JobIdentity job = job_identity_from_env(/*warn_without_token=*/false);
  if (job.secret()) return job.mac_key();
  const std::string key = prefix + "/job-key";
  if (rank == 0) store.set(key, crypto::to_hex(crypto::random_bytes(32)));
  return store.get(key, timeout);
}

std::unique_ptr<Communicator> Communicator::from_env(std::string_view transport, const CommunicatorOptions& options) {
  const TransportDescriptor& kind = transport_descriptor(transport);
  const RankInfo info = rank_info_from_env();
  StoreMember me{job_identity_from_env(), info.rank, info.world_size};
  const std::string job_key = me.job.mac_key();
  auto tcp = std::make_shared<TcpStore>(info.master_addr, info.master_port, info.rank == 0, std::move(me),
                                        options.timeout);
  return assemble(kind, std::move(tcp), job_key, info.rank, info.world_size, info.local_rank, options);
}

std::unique_ptr<Communicator> Communicator::create(std::string_view transport, std::shared_ptr<Store> store, int rank,
                                                   int world_size, int local_rank, const CommunicatorOptions& options) {
  const TransportDescriptor& kind = transport_descriptor(transport);
  GZ_ENFORCE(world_size >= 1 && rank >= 0 && rank < world_size, "rank ", rank, " is not in [0, ", world_size, ")");
  std::string job_key = shared_job_key(*store, options.prefix, rank, options.timeout);
  return assemble(kind, std::move(store), job_key, rank, world_size, local_rank, options);
}

std::unique_ptr<Communicator> Communicator::assemble(const TransportDescriptor& kind, std::shared_ptr<Store> store,
                                                     const std::string& job_key, int rank, int world_size,
                                                     int local_rank, const CommunicatorOptions& options) {
  // Sealed below the prefix, so a value's tag covers its full key.
  auto sealed = std::make_shared<SealedStore>(std::move(store), job_key);
  auto prefixed = std::make_shared<PrefixStore>(options.prefix, std::move(sealed));
  std::unique_ptr<Transport> transport =
      kind.make(TransportSetup{*prefixed, rank, world_size, local_rank, options.cuda_device, options.timeout});
  Topology topology;
  try {
    topology = discover_topology(*prefixed, rank, world_size, options.timeout, options.node);
  } catch (const InvalidArgument&) {
    // Every rank fails alike; wait (bounded) until all have read the Store,
    // which rank 0 hosts, before any leaves.
    try {
      transport->barrier(CallContext{Device::Cpu, nullptr, std::min(options.timeout, Timeout(10000))});
    } catch (...) {
    }
    throw;
  }
  return std::make_unique<Communicator>(std::move(prefixed), std::move(transport), options, std::move(topology));
}

std::unique_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, std::unique_ptr<Transport> transport,
                                                   const CommunicatorOptions& options) {
  GZ_ENFORCE(store && transport, "a communicator needs a store and a transport");
  // Sealed as in create() above: the topology read from the store is a member's.
  const std::string job_key = shared_job_key(*store, options.prefix, transport->rank(), options.timeout);
  auto sealed = std::make_shared<SealedStore>(std::move(store), job_key);
  auto prefixed = std::make_shared<PrefixStore>(options.prefix, std::move(sealed));
  Topology topology = discover_topology(*prefixed, transport->rank(), transport->size(), options.timeout, options.node);
  return std::make_unique<Communicator>(std::move(prefixed), std::move(transport), options, std::move(topology));
}

Communicator::Communicator(std::shared_ptr<Store> store, std::unique_ptr<Transport> transport,
                           CommunicatorOptions options, std::optional<Topology> topology)
    : store_(std::move(store)), transport_(std::move(transport)), options_(std::move(options)) {
  GZ_ENFORCE(store_ && transport_, "a communicator needs a store and a transport");
  topology_ = topology ? std::move(*topology) : Topology::flat(transport_->size());
  auto_ = std::make_unique<AutoChoice>(options_.link);
  GZ_ENFORCE(topology_.ranks() == transport_->size(), "the topology describes ", topology_.ranks(),
             " ranks, the transport has ", transport_->size());
}

Communicator::~Communicator() {
  if (broken_ || size() == 1 || !options_.closing_barrier) return;
  try {
    // Bounded: a peer that already failed costs at most this much.
    transport_->barrier(CallContext{Device::Cpu, nullptr, std::min(options_.timeout, Timeout(10000))});
  } catch (...) {
    // Closing anyway; the peer's own error says what went wrong.
  }
}

AllreduceOptions Communicator::options_for(void* buffer, Dtype dtype, std::size_t n, Codec& codec, ErrorFeedback& state,
                                           const AllreduceCall& call) {
  if (broken_) GZ_THROW(IoError, "communicator is broken by an earlier failure; build a new one");
  AllreduceOptions o;
  o.transport = transport_.get();
  o.store = store_.get();
  o.workspace = &workspace_;
  o.codec = &codec;
  o.state = &state;
  o.buffer = buffer;
  o.n = n;
  o.dtype = dtype;
  o.op = call.op;
  o.algorithm = call.algorithm;
  o.device = call.device;
  o.stream = call.stream;
  o.timeout = call.timeout.value_or(options_.timeout);
  o.segment_bytes = call.segment_bytes;
  o.server_codec = call.server_codec;
  o.topology = &topology_;
  o.stats = call.stats;
  return o;
}

template <class F>
void Communicator::guarded(F&& f) {
  try {
    f();
  } catch (const IoError&) {
    broken_ = true;
    throw;
  }
}

void Communicator::allreduce(void* buffer, Dtype dtype, std::size_t n, Codec& codec, ErrorFeedback& state,
                             const AllreduceCall& call) {
  AllreduceOptions o = options_for(buffer, dtype, n, codec, state, call);
  guarded([&] {
    o.algorithm = auto_->resolve(o, *store_, transport_.get(), rank(), size());
    gz::allreduce(o);
  });
}

void Communicator::reduce_scatter(float* buffer, std::size_t n, Codec& codec, ErrorFeedback& state,
                                  const AllreduceCall& call) {
  GZ_ENFORCE(call.algorithm == Algorithm::Auto, "reduce_scatter has one algorithm; call.algorithm must be auto");
  AllreduceOptions o = options_for(buffer, Dtype::Float32, n, codec, state, call);
  o.algorithm = Algorithm::ReduceScatter;  // what reduce_scatter() runs, with this communicator's topology (stats)
  guarded([&] { detail::run_collective(o, "reduce_scatter"); });
}

Algorithm Communicator::resolve_algorithm(const Codec& codec, std::size_t n, const AllreduceCall& call) {
  ErrorFeedback unused;  // options_for's; nothing runs
  AllreduceOptions o = options_for(nullptr, Dtype::Float32, n, const_cast<Codec&>(codec), unused, call);
  Algorithm a = Algorithm::Auto;
  guarded([&] { a = gz::resolve_algorithm(auto_->resolve(o, *store_, transport_.get(), rank(), size()), codec.config(), topology_); });
  return a;
}

std::optional<CostInputs> Communicator::cost_inputs(const Codec& codec, std::size_t n, const AllreduceCall& call) {
  ErrorFeedback unused;
  AllreduceOptions o = options_for(nullptr, Dtype::Float32, n, const_cast<Codec&>(codec), unused, call);
  std::optional<CostInputs> in;
  guarded([&] { in = auto_->inputs(o, *store_, transport_.get(), rank(), size()); });
  return in;
}

void Communicator::barrier() {
  if (broken_) GZ_THROW(IoError, "communicator is broken by an earlier failure; build a new one");
  guarded([&] { transport_->barrier(CallContext{Device::Cpu, nullptr, options_.timeout}); });
}

}  // namespace gz
