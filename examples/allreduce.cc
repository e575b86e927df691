// Average a gradient over every rank, sending onebit payloads.
// Run with: build/bin/gradzip-run -n 4 -- build/bin/gradzip-example-allreduce
#include <cstdio>
#include <vector>

#include "comm/engine/communicator.h"

int main() {
  auto comm = gz::Communicator::from_env("ucx");  // MASTER_ADDR, RANK, ...
  auto codec = gz::make_codec("onebit");
  gz::ErrorFeedback state;  // error feedback of this buffer; keep it across steps

  std::vector<float> grad(1 << 20, static_cast<float>(comm->rank() + 1));
  gz::AllreduceCall call;
  call.op = gz::ReduceOp::Average;
  comm->allreduce(grad.data(), grad.size(), *codec, state, call);
  std::printf("rank %d: grad[0] = %g\n", comm->rank(), grad[0]);  // the same on every rank
}
