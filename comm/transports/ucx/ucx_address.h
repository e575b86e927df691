// The worker-address exchange of UcxTransport's setup: each rank publishes
// its UCP worker address under "ucx/addr/<rank>", framed (comm/security/peer_blob.h),
// and reads every other rank's, checked before ucp_ep_create sees it.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <vector>

#include "comm/store/store.h"

namespace gz {

/// UCX addresses list a worker's devices; this is far above any real one.
inline constexpr std::size_t kMaxUcxAddressBytes = 64 * 1024;

/// Publishes `worker`'s address as `rank`'s; returns every rank's address
/// (this rank's slot empty). Throws IoError naming the rank whose address is
/// missing at the timeout or not valid.
std::vector<std::string> exchange_worker_addresses(Store& store, ucp_worker_h worker, int rank, int size,
                                                   Timeout timeout);

}  // namespace gz
