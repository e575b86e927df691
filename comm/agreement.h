// Agreement: before data moves, the ranks compare what each was asked to do
// (codec spec, element count, dtype, algorithm, op) through the Store.
// Every rank publishes its fields under "agree/<index>/<rank>", reads
// everyone's, and compares them all the same way, so a mismatch throws the
// same InvalidArgument on every rank, naming each field that differs and
// which ranks hold which value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/store/store.h"

namespace gz {

using Fields = std::vector<std::pair<std::string, std::string>>;

/// Collective over `size` ranks. `index` must be the same on every rank (the
/// number of agreements made so far on this transport).
/// Throws InvalidArgument on a mismatch, IoError when a rank never publishes.
void agree(Store& store, std::uint64_t index, int rank, int size, const Fields& fields, Timeout timeout);

}  // namespace gz
