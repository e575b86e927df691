// The transport registry: every transport gradzip knows, one line each.
//
//   X(name)
//
//   - name: the transport's name ("ucx"), as Communicator::from_env/create,
//     gradzip-bench --transport, Python's Communicator(transport=...) and
//     gradzip.BUILD spell it; also the name of its descriptor,
//     gz::transports::<name>, defined in comm/transports/<name>/descriptor.cc.
//     That file is built always, so that a build without the transport still
//     knows the name and says which CMake option builds it.
//
// Nothing outside a transport's folder and this line names a transport: the
// Communicator makes one through its descriptor, the benchmark asks the
// Transport interface (describe(), native_allreduce()). Adding a transport:
// docs/ARCHITECTURE.md, "Adding a transport".
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "comm/base/env.h"
#include "comm/transports/transport.h"

#define GZ_TRANSPORT_REGISTRY(X) \
  X(ucx)                         \
  X(nccl)

namespace gz {

class Store;

/// The transport a host program uses unless told otherwise (gradzip-bench
/// --transport, Python's Communicator).
inline constexpr std::string_view kDefaultTransport = "ucx";

/// What a transport is made from: the (sealed, prefixed) rendezvous store
/// of its communicator, the rank, and the communicator's options.
struct TransportSetup {
  Store& store;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int cuda_device = -1;  ///< -1: the transport's choice (a device transport: local_rank modulo the GPUs)
  Timeout timeout = default_timeout();
};

struct TransportDescriptor {
  std::string_view name;          ///< "ucx"
  std::string_view build_option;  ///< the CMake option that builds it ("GRADZIP_UCX")
  std::string_view summary;       ///< one line for --help and docs
  /// The torch.distributed backend whose groups it serves by default
  /// (Python's Communicator.from_torch, the torch backend's CUDA path):
  /// "nccl" for NCCL; empty for none.
  std::string_view torch_backend;
  /// It takes device (CUDA) buffers as they are (Python passes it the
  /// current device); false: host memory, device buffers staged.
  bool device_memory = false;
  /// Makes the transport (collective over setup.size ranks); null when this
  /// build does not have it.
  std::unique_ptr<Transport> (*make)(const TransportSetup& setup) = nullptr;
};

namespace transports {
#define GZ_TRANSPORT_DESCRIPTOR(name) extern const TransportDescriptor name;
GZ_TRANSPORT_REGISTRY(GZ_TRANSPORT_DESCRIPTOR)
#undef GZ_TRANSPORT_DESCRIPTOR
}  // namespace transports

/// Every registered transport, in registry order (built or not).
std::span<const TransportDescriptor* const> all_transports();
/// The descriptor named `name`, or nullptr.
const TransportDescriptor* find_transport(std::string_view name);
/// The descriptor of a transport this build has. Throws InvalidArgument for
/// an unknown name (naming the valid ones) or one this build lacks (naming
/// the CMake option that builds it).
const TransportDescriptor& transport_descriptor(std::string_view name);
/// Whether this build has the transport named `name` (false for unknown names).
bool transport_available(std::string_view name);
/// The registered names, "ucx, nccl" (for messages and --help).
std::string transport_names();
/// The transport for a group of torch backend `backend` ("nccl", "gloo"):
/// the one whose torch_backend it is, else kDefaultTransport.
std::string_view transport_for_torch_backend(std::string_view backend);

}  // namespace gz
