// Compress a gradient with error feedback, then decode it into a sum.
#include <cstdio>
#include <vector>

#include "compressors/codec.h"

int main() {
  const std::size_t n = 1 << 20;
  std::vector<float> grad(n, 0.25f), residual(n, 0.0f), sum(n, 0.0f);

  auto codec = gz::make_codec("topk:density=0.01");  // any spec from the codec table
  // Two phases, as in CUB: sizes first, then calls that allocate nothing.
  std::vector<std::byte> payload(codec->max_payload_bytes(n));
  std::vector<std::byte> workspace(codec->workspace_bytes(n, gz::Device::Cpu));
  const gz::ExecContext ctx{gz::Device::Cpu, nullptr, workspace.data(), workspace.size()};

  for (int step = 0; step < 3; ++step) {
    std::size_t bytes = codec->encode(grad.data(), residual.data(), n, payload.data(), payload.size(), ctx);
    codec->decode_accumulate(payload.data(), bytes, sum.data(), n, ctx);  // sum += decoded
    std::printf("step %d: sent %zu bytes instead of %zu\n", step, bytes, n * sizeof(float));
  }
}
