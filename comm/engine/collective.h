// The names every collective call shares: how values combine (ReduceOp) and
// which schedule runs (Algorithm). Their own header so that the error-feedback
// state (comm/engine/error_feedback.h), which is bound to an algorithm, and the
// collectives (allreduce.h, reduce_scatter.h) can both name them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gz {

enum class ReduceOp : std::uint8_t { Sum = 0, Average = 1 };

/// Allgather: every rank's whole payload to every rank. ScatterReduce:
/// compressed reduce-scatter, then an allgather of the chunk sums re-encoded
/// with the server codec (server_codec_config()).
/// Hierarchical: fp32 reduce-scatter inside each node, a compressed allreduce
/// of each shard across the nodes, fp32 allgather inside each node.
/// Auto: see resolve_algorithm().
/// ReduceScatter is not an allreduce algorithm (allreduce() refuses it): it
/// names the reduce_scatter() collective (comm/engine/reduce_scatter.h), the first
/// half of ScatterReduce, in stats and in what a state is bound to.
enum class Algorithm : std::uint8_t { Auto = 0, Allgather = 1, ScatterReduce = 2, Hierarchical = 3, ReduceScatter = 4 };

const char* to_string(ReduceOp op);
const char* to_string(Algorithm a);
/// "sum" | "avg"/"average"; throws InvalidArgument listing the choices.
ReduceOp parse_reduce_op(std::string_view s);
/// "auto" or an allreduce algorithm's name (comm/algorithms/registry.h:
/// allgather, scatter_reduce, hierarchical); throws InvalidArgument listing them.
Algorithm parse_algorithm(std::string_view s);
/// What parse_algorithm takes: "auto", then each allreduce algorithm's name
/// in registry order (Python's and the sweep's list).
std::vector<std::string> allreduce_algorithm_names();

}  // namespace gz
