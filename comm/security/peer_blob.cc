#include "comm/security/peer_blob.h"

#include "common/bytes.h"
#include "common/checksum.h"
#include "common/error.h"

namespace gz {

std::string frame_peer_blob(std::uint32_t magic, int rank, std::string_view blob) {
  std::string s;
  bytes::Writer w(s);
  w.put(magic);
  w.put(static_cast<std::uint32_t>(rank));
  w.str(blob);
  w.put(checksum64(s));
  return s;
}

std::string parse_peer_blob(std::uint32_t magic, int rank, std::size_t max_bytes, std::string_view framed,
                            const char* what, int me) {
  bytes::Reader r(framed);
  const auto got_magic = r.get<std::uint32_t>("magic");
  const auto writer = r.get<std::uint32_t>("rank");
  const std::string_view blob = r.str(max_bytes, what);
  const std::size_t covered = r.pos();
  const auto sum = r.get<std::uint64_t>("checksum");
  std::string why;
  if (!r.ok())
    why = r.failure();
  else if (!r.at_end())
    why = std::to_string(r.left()) + " trailing bytes";
  else if (got_magic != magic)
    why = "bad magic";
  else if (writer != static_cast<std::uint32_t>(rank))
    why = "it was written as rank " + std::to_string(writer) + "'s";
  else if (sum != checksum64(framed.substr(0, covered)))
    why = "checksum mismatch";
  if (!why.empty())
    GZ_THROW(IoError, "rank ", me, ": the ", what, " of rank ", rank, " in the store is not valid (", why,
             "); a rank of another job or version, or a stranger, wrote it");
  return std::string(blob);
}

}  // namespace gz
