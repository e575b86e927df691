// Agreement: before data moves, the ranks compare what each was asked to do
// (codec spec, element count, dtype, algorithm, op) through the Store.
//
// Round `index` (the same on every rank) uses its own keys: every rank
// publishes its fields under "agree/<index>/<rank>" and reads every other
// rank's; it compares them with its OWN local fields, never with the Store's
// copy of its key, so a value written over its key cannot make it agree.
// Values go through the communicator's SealedStore, so one that no member
// wrote fails the round with an IoError instead of satisfying it. Once every
// rank has read the round (a counter at "agree/<index>/read"), the last
// reader erases its keys: a job that agrees for a week does not fill the
// Store. A mismatch throws the same InvalidArgument on every rank, naming
// each field that differs and which ranks hold which value, and no rank
// throws it before every rank has read the round: the rank that hosts the
// Store (rank 0, for gradzip's TcpStore and torch's TCPStore) would take the
// Store with it when its process exits, and a rank still reading would see
// a lost connection instead of the mismatch. So on a mismatch the last
// reader marks the round done ("agree/<index>/done", sealed), and every
// other rank waits for that mark (bounded by the timeout) before it throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/store/store.h"

namespace gz {

using Fields = std::vector<std::pair<std::string, std::string>>;

/// What an agreement is called in its errors.
struct AgreeWords {
  /// "the ranks did not all start <round> #<index>"
  std::string_view round = "allreduce call agreement";
  /// The mismatch's message, before the report.
  std::string_view mismatch = "allreduce: the ranks disagree on the call (every rank must pass the same values):";
};

/// Collective over `size` ranks. `index` must be the same on every rank (the
/// number of agreements made so far on this transport).
/// Throws InvalidArgument on a mismatch, IoError when a rank never publishes
/// or a value is not a member's.
void agree(Store& store, std::uint64_t index, int rank, int size, const Fields& fields, Timeout timeout,
           const AgreeWords& words = {});

/// The mismatch report of agree() for every rank's fields (rank order), or ""
/// when all agree: "\n  name: ranks 0,1 'a'; rank 2 'b'" per differing field,
/// names in order of first appearance. (The DDP hook's agreement uses it too.)
std::string describe_disagreement(const std::vector<Fields>& all);

/// Fields as bytes (u32 count, then u32-length-prefixed names and values), and
/// back; decode returns nullopt for anything malformed.
std::string encode_fields(const Fields& fields);
std::optional<Fields> decode_fields(std::string_view bytes);

}  // namespace gz
