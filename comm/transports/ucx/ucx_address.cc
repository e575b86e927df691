#include "comm/transports/ucx/ucx_address.h"

#include "comm/security/peer_blob.h"
#include "comm/transports/ucx/ucx_check.h"
#include "comm/transports/ucx/worker_address.h"
#include "common/error.h"

namespace gz {

std::vector<std::string> exchange_worker_addresses(Store& store, ucp_worker_h worker, int rank, int size,
                                                   Timeout timeout) {
  auto key = [](int r) { return "ucx/addr/" + std::to_string(r); };
  ucp_address_t* addr = nullptr;
  std::size_t addr_len = 0;
  GZ_UCX_CHECK(ucp_worker_get_address(worker, &addr, &addr_len));
  const std::string mine(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker, addr);
  store.set(key(rank), frame_peer_blob(kUcxAddressMagic, rank, mine));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r)
    if (r != rank) keys.push_back(key(r));
  store.wait(keys, timeout);
  std::vector<std::string> all(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    std::string framed;
    try {
      framed = store.get(key(r), timeout);
    } catch (const IoError& e) {
      GZ_THROW(IoError, "rank ", rank, ": the UCX worker address of rank ", r, " could not be read: ", e.what());
    }
    all[static_cast<std::size_t>(r)] =
        parse_peer_blob(kUcxAddressMagic, r, kMaxUcxAddressBytes, framed, "UCX worker address", rank);
    // Framed and checksummed is not yet an address UCX can read: UCX asserts
    // on a layout it does not expect (worker_address.h).
    if (const std::string why = check_worker_address(all[static_cast<std::size_t>(r)], mine); !why.empty())
      GZ_THROW(IoError, "rank ", rank, ": the UCX worker address of rank ", r, " is not valid (", why,
               "); a rank of another job, UCX version or configuration, or a stranger, wrote it");
  }
  return all;
}

}  // namespace gz
