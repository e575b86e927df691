#include "comm/engine/collective.h"

#include "comm/algorithms/algorithm.h"
#include "common/error.h"

namespace gz {

const char* to_string(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "avg"; }

const char* to_string(Algorithm a) {
  if (a == Algorithm::Auto) return "auto";
  const AlgorithmDescriptor* d = find_algorithm(a);
  return d ? d->name.data() : "?";  // a descriptor's name is a literal: NUL-terminated
}

ReduceOp parse_reduce_op(std::string_view s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "avg" || s == "average" || s == "mean") return ReduceOp::Average;
  GZ_THROW(InvalidArgument, "unknown reduce op '", s, "'; valid: sum, avg");
}

Algorithm parse_algorithm(std::string_view s) {
  if (s == "auto") return Algorithm::Auto;
  if (s == "scatter-reduce") s = "scatter_reduce";
  for (const AlgorithmDescriptor* d : all_algorithms())
    if (d->allreduce && d->name == s) return d->id;
  std::string valid;
  for (const std::string& name : allreduce_algorithm_names()) valid += (valid.empty() ? "" : ", ") + name;
  GZ_THROW(InvalidArgument, "unknown allreduce algorithm '", s, "'; valid: ", valid);
}

std::vector<std::string> allreduce_algorithm_names() {
  std::vector<std::string> names{"auto"};
  for (const AlgorithmDescriptor* d : all_algorithms())
    if (d->allreduce) names.emplace_back(d->name);
  return names;
}

}  // namespace gz
