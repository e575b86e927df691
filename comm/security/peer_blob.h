// A blob one rank publishes in the Store for the others to hand to a library:
// a UCX worker address, NCCL's unique id. The libraries trust these bytes
// (UCX asserts, killing the process, on a malformed address), so they travel
// framed and are checked before use:
//
//   u32 magic | u32 writer's rank | u32 blob_bytes | blob | u64 checksum64 of everything before
//
// A frame that is truncated, of another kind or rank, over the size limit or
// whose checksum fails is an IoError naming the rank, never an abort.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gz {

// Each kind of blob has its own magic, defined beside its transport
// (comm/transports/<name>/), so that one kind never parses as another.

std::string frame_peer_blob(std::uint32_t magic, int rank, std::string_view blob);

/// The blob `rank` framed. Throws IoError: "rank <me>: <what> of rank <rank> is not valid: <why>".
std::string parse_peer_blob(std::uint32_t magic, int rank, std::size_t max_bytes, std::string_view framed,
                            const char* what, int me);

}  // namespace gz
