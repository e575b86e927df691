#include <cstdio>
#include <vector>

#include "compressors/codec.h"

int main() {
  auto codec = gz::make_codec("onebit");
  std::vector<float> g(1000, -1.0f), r(1000, 0.0f), out(1000, 0.0f);
  std::vector<std::byte> p(codec->max_payload_bytes(g.size()));
  std::vector<std::byte> ws(codec->workspace_bytes(g.size(), gz::Device::Cpu));
  const gz::ExecContext ctx{gz::Device::Cpu, nullptr, ws.data(), ws.size()};
  const std::size_t bytes = codec->encode(g.data(), r.data(), g.size(), p.data(), p.size(), ctx);
  codec->decode_accumulate(p.data(), bytes, out.data(), out.size(), ctx);
  std::printf("consumer: %s sent %zu bytes, out[0] = %g\n", codec->spec().c_str(), bytes, out[0]);
  return out[0] == -1.0f ? 0 : 1;
}
