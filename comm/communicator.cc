#include "comm/communicator.h"

#include <algorithm>

#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "common/error.h"
#if GZ_HAVE_UCX
#include "comm/ucx/ucx_transport.h"
#endif
#if GZ_HAVE_NCCL
#include "comm/nccl/nccl_transport.h"
#endif

namespace gz {

TransportKind parse_transport_kind(std::string_view s) {
  if (s == "ucx") return TransportKind::Ucx;
  if (s == "nccl") return TransportKind::Nccl;
  GZ_THROW(InvalidArgument, "unknown transport '", s, "'; valid: ucx, nccl");
}

const char* to_string(TransportKind k) { return k == TransportKind::Ucx ? "ucx" : "nccl"; }

bool transport_available(TransportKind k) {
#if GZ_HAVE_UCX
  if (k == TransportKind::Ucx) return true;
#endif
#if GZ_HAVE_NCCL
  if (k == TransportKind::Nccl) return true;
#endif
  (void)k;
  return false;
}

std::unique_ptr<Communicator> Communicator::from_env(TransportKind kind, const CommunicatorOptions& options) {
  const RankInfo info = rank_info_from_env();
  if (!transport_available(kind))
    GZ_THROW(InvalidArgument, "this build of gradzip has no ", to_string(kind),
             " transport (configure with GRADZIP_", kind == TransportKind::Ucx ? "UCX" : "NCCL", "=ON)");
  auto tcp = std::make_shared<TcpStore>(info.master_addr, info.master_port, info.rank == 0, options.timeout);
  return create(kind, std::move(tcp), info.rank, info.world_size, info.local_rank, options);
}

std::unique_ptr<Communicator> Communicator::create(TransportKind kind, std::shared_ptr<Store> store, int rank,
                                                   int world_size, int local_rank, const CommunicatorOptions& options) {
  if (!transport_available(kind))
    GZ_THROW(InvalidArgument, "this build of gradzip has no ", to_string(kind),
             " transport (configure with GRADZIP_", kind == TransportKind::Ucx ? "UCX" : "NCCL", "=ON)");
  GZ_ENFORCE(world_size >= 1 && rank >= 0 && rank < world_size, "rank ", rank, " is not in [0, ", world_size, ")");
  auto prefixed = std::make_shared<PrefixStore>(options.prefix, std::move(store));
  std::unique_ptr<Transport> transport;
#if GZ_HAVE_UCX
  if (kind == TransportKind::Ucx)
    transport = std::make_unique<UcxTransport>(*prefixed, rank, world_size, options.timeout);
#endif
#if GZ_HAVE_NCCL
  if (kind == TransportKind::Nccl) {
    int device = options.cuda_device;
    if (device < 0) device = local_rank % std::max(1, NcclTransport::device_count());
    transport = std::make_unique<NcclTransport>(*prefixed, rank, world_size, device, options.timeout);
  }
#endif
  (void)local_rank;
  Topology topology = discover_topology(*prefixed, rank, world_size, options.timeout);
  return std::make_unique<Communicator>(std::move(prefixed), std::move(transport), options, std::move(topology));
}

std::unique_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, std::unique_ptr<Transport> transport,
                                                   const CommunicatorOptions& options) {
  GZ_ENFORCE(store && transport, "a communicator needs a store and a transport");
  auto prefixed = std::make_shared<PrefixStore>(options.prefix, std::move(store));
  Topology topology = discover_topology(*prefixed, transport->rank(), transport->size(), options.timeout);
  return std::make_unique<Communicator>(std::move(prefixed), std::move(transport), options, std::move(topology));
}

Communicator::Communicator(std::shared_ptr<Store> store, std::unique_ptr<Transport> transport,
                           CommunicatorOptions options, std::optional<Topology> topology)
    : store_(std::move(store)), transport_(std::move(transport)), options_(std::move(options)) {
  GZ_ENFORCE(store_ && transport_, "a communicator needs a store and a transport");
  topology_ = topology ? std::move(*topology) : Topology::flat(transport_->size());
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

void Communicator::allreduce(float* buffer, std::size_t n, Codec& codec, AllreduceState& state,
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
  o.op = call.op;
  o.algorithm = call.algorithm;
  o.device = call.device;
  o.stream = call.stream;
  o.timeout = call.timeout.value_or(options_.timeout);
  o.segment_bytes = call.segment_bytes;
  o.server_codec = call.server_codec;
  o.topology = &topology_;
  o.stats = call.stats;
  try {
    gz::allreduce(o);
  } catch (const IoError&) {
    broken_ = true;
    throw;
  }
}

void Communicator::barrier() {
  if (broken_) GZ_THROW(IoError, "communicator is broken by an earlier failure; build a new one");
  try {
    transport_->barrier(CallContext{Device::Cpu, nullptr, options_.timeout});
  } catch (const IoError&) {
    broken_ = true;
    throw;
  }
}

}  // namespace gz
