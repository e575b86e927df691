#include "comm/engine/collective.h"

#include "common/error.h"

namespace gz {

const char* to_string(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "avg"; }

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Auto: return "auto";
    case Algorithm::Allgather: return "allgather";
    case Algorithm::ScatterReduce: return "scatter_reduce";
    case Algorithm::Hierarchical: return "hierarchical";
    case Algorithm::ReduceScatter: return "reduce_scatter";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "avg" || s == "average" || s == "mean") return ReduceOp::Average;
  GZ_THROW(InvalidArgument, "unknown reduce op '", s, "'; valid: sum, avg");
}

Algorithm parse_algorithm(std::string_view s) {
  if (s == "auto") return Algorithm::Auto;
  if (s == "allgather") return Algorithm::Allgather;
  if (s == "scatter_reduce" || s == "scatter-reduce") return Algorithm::ScatterReduce;
  if (s == "hierarchical") return Algorithm::Hierarchical;
  GZ_THROW(InvalidArgument, "unknown allreduce algorithm '", s,
           "'; valid: auto, allgather, scatter_reduce, hierarchical");
}

}  // namespace gz
