// The nccl transport's registry entry (comm/transports/registry.h); built
// always, its factory only with NCCL.
#include "comm/transports/registry.h"

#if GZ_HAVE_NCCL
#include <algorithm>

#include "comm/transports/nccl/nccl_transport.h"
#endif

namespace gz::transports {

namespace {

#if GZ_HAVE_NCCL
std::unique_ptr<Transport> make(const TransportSetup& s) {
  const int device = s.cuda_device >= 0 ? s.cuda_device : s.local_rank % std::max(1, NcclTransport::device_count());
  return std::make_unique<NcclTransport>(s.store, s.rank, s.size, device, s.timeout);
}
#endif

}  // namespace

const TransportDescriptor nccl{
    "nccl", "GRADZIP_NCCL", "NCCL point-to-point on CUDA buffers, one GPU per rank", "nccl", true,
#if GZ_HAVE_NCCL
    make,
#else
    nullptr,
#endif
};

}  // namespace gz::transports
