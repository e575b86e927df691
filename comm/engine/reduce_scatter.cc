// reduce_scatter(): the allreduce engine's call (agreement, state, workspace,
// pipeline) running scatter_reduce's first half; see reduce_scatter.h.
#include "comm/engine/reduce_scatter.h"

#include "comm/engine/allreduce_run.h"

namespace gz {

void reduce_scatter(const ReduceScatterOptions& r) {
  AllreduceOptions o;
  o.transport = r.transport;
  o.store = r.store;
  o.workspace = r.workspace;
  o.codec = r.codec;
  o.state = r.state;
  o.buffer = r.buffer;
  o.n = r.n;
  o.op = r.op;
  o.algorithm = Algorithm::ReduceScatter;
  o.device = r.device;
  o.stream = r.stream;
  o.timeout = r.timeout;
  o.segment_bytes = r.segment_bytes;
  o.stats = r.stats;
  detail::run_collective(o, "reduce_scatter");
}

}  // namespace gz
