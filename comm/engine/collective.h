// The names every collective call shares: how values combine (ReduceOp) and
// which schedule runs (Algorithm). Their own header so that the error-feedback
// state (comm/engine/error_feedback.h), which is bound to an algorithm, and the
// collectives (allreduce.h, reduce_scatter.h) can both name them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/algorithms/registry.h"

namespace gz {

enum class ReduceOp : std::uint8_t { Sum = 0, Average = 1 };

/// Auto (0), resolved by resolve_algorithm(), then one enumerator per line of
/// comm/algorithms/registry.h, numbered 1.. in its order (the number is the
/// algorithm's byte in a saved error-feedback state): Allgather = 1,
/// ScatterReduce = 2, Hierarchical = 3, ReduceScatter = 4 (not an allreduce
/// algorithm: it names the reduce_scatter() collective in stats and in what a
/// state is bound to). What each does: its descriptor's summary.
#define GZ_ALGORITHM_ENUMERATOR(E, name) E,
enum class Algorithm : std::uint8_t { Auto = 0, GZ_ALGORITHM_REGISTRY(GZ_ALGORITHM_ENUMERATOR) };
#undef GZ_ALGORITHM_ENUMERATOR
static_assert(static_cast<int>(Algorithm::Allgather) == 1 && static_cast<int>(Algorithm::ScatterReduce) == 2 &&
                  static_cast<int>(Algorithm::Hierarchical) == 3 && static_cast<int>(Algorithm::ReduceScatter) == 4,
              "saved states hold these numbers: append registry lines, never reorder them");

const char* to_string(ReduceOp op);
const char* to_string(Algorithm a);
/// "sum" | "avg"/"average"; throws InvalidArgument listing the choices.
ReduceOp parse_reduce_op(std::string_view s);
/// "auto" or an allreduce algorithm's name (comm/algorithms/registry.h);
/// throws InvalidArgument listing them.
Algorithm parse_algorithm(std::string_view s);
/// What parse_algorithm takes: "auto", then each allreduce algorithm's name
/// in registry order (Python's and the sweep's list).
std::vector<std::string> allreduce_algorithm_names();

}  // namespace gz
