// The ucx transport's registry entry (comm/transports/registry.h); built
// always, its factory only with UCX.
#include "comm/transports/registry.h"

#if GZ_HAVE_UCX
#include "comm/transports/ucx/ucx_transport.h"
#endif

namespace gz::transports {

namespace {

#if GZ_HAVE_UCX
std::unique_ptr<Transport> make(const TransportSetup& s) {
  return std::make_unique<UcxTransport>(s.store, s.rank, s.size, s.timeout);
}
#endif

}  // namespace

const TransportDescriptor ucx{
    "ucx", "GRADZIP_UCX", "UCX point-to-point: host memory, CUDA buffers staged through pinned memory", "", false,
#if GZ_HAVE_UCX
    make,
#else
    nullptr,
#endif
};

}  // namespace gz::transports
