// A UCX worker address read from a peer, checked before ucp_ep_create sees
// it: UCX parses the bytes it is given without bounds and asserts (killing
// the process) on what it does not expect, e.g. an address version other
// than v1 or v2 (address.c: `*addr_version == UCP_OBJECT_VERSION_V2`).
//
// The layout (UCX 1.13, src/ucp/wireup/address.c; v1 is UCX's default,
// UCX_ADDRESS_VERSION=v2 the other):
//
//   header      v1: 1 byte (version in the low 4 bits, flags in the high 4)
//               v2: 2 bytes (version, flags)
//   [u64 worker uuid]   v1 always; v2 when the flags say
//   [u64 client id]     when the flags say
//   [u8 n, n bytes]     the worker's name, when the flags say (debug info)
//   0xff                no devices, or for each device:
//     md byte      bit 7: no interfaces; md index (v1: 5 bits; v2: 7 bits,
//                  all ones: the index is the next byte)
//     length byte  bit 7: last device; bit 6: a path count byte follows;
//                  bit 5: a system device byte follows; 5 bits of device
//                  address length (v2: all ones: the next byte)
//     [paths] [sys device] device address
//     for each interface:
//       u16 transport name checksum, the interface's attributes (a fixed
//       size per version and configuration), length byte (bit 7: last
//       interface; bit 6: endpoint addresses follow; 6 bits of length, v2:
//       all ones: the next byte), interface address
//
// Every rank of a job runs the same UCX with the same configuration, so the
// attribute size is learnt by walking this rank's own address; a peer's must
// have the same version and walk to exactly its end. What is not checked:
// the values inside the device and interface addresses and attributes
// (UCX checks resource indices and bandwidths itself and fails the
// connection with an error). Under UCX_UNIFIED_MODE=y, whose addresses omit
// the lengths, only the header is checked.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gz {

/// The peer_blob magic of a UCX worker address in the store ("GZUA").
inline constexpr std::uint32_t kUcxAddressMagic = 0x41555A47u;

/// Why `peer` is not a worker address this rank's UCX can take, given this
/// rank's own worker address `own`; "" when it is.
std::string check_worker_address(std::string_view peer, std::string_view own);

}  // namespace gz
