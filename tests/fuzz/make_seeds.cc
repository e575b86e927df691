// Writes one valid payload per codec and size into a directory: the seed
// corpus of decode_fuzzer (byte 0 selects the decoder, as there), and for a
// fixed-size codec the same payload's bare body (byte 0 with its top bit,
// then the element count: the exchanges' framing).
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "fuzz_specs.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const auto& specs = gz::fuzz::specs();
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  int files = 0;
  for (unsigned c = 0; c < specs.size(); ++c) {
    auto codec = gz::make_codec(specs[c]);
    for (std::size_t n : {0u, 1u, 7u, 33u, 100u, 600u}) {
      std::vector<float> g(n), r(n, 0.0f);
      for (auto& x : g) x = d(rng);
      std::vector<std::uint64_t> p(codec->max_payload_bytes(n) / 8 + 1);
      std::vector<std::byte> ws(codec->workspace_bytes(n, gz::Device::Cpu));
      const std::size_t bytes = codec->encode(g.data(), r.data(), n, reinterpret_cast<std::byte*>(p.data()),
                                              p.size() * 8, {gz::Device::Cpu, nullptr, ws.data(), ws.size()});
      const std::string path = std::string(argv[1]) + "/seed_" + std::to_string(c) + "_" + std::to_string(n);
      std::FILE* f = std::fopen(path.c_str(), "wb");
      if (!f) return 1;
      const unsigned char sel = static_cast<unsigned char>(c);
      std::fwrite(&sel, 1, 1, f);
      std::fwrite(p.data(), 1, bytes, f);
      std::fclose(f);
      ++files;
      if (!codec->fixed_size()) continue;
      const std::string bare = std::string(argv[1]) + "/bare_" + std::to_string(c) + "_" + std::to_string(n);
      std::FILE* b = std::fopen(bare.c_str(), "wb");
      if (!b) return 1;
      const unsigned char bare_sel = static_cast<unsigned char>(0x80u | c);
      const auto count = static_cast<std::uint32_t>(n);
      std::fwrite(&bare_sel, 1, 1, b);
      std::fwrite(&count, sizeof count, 1, b);
      std::fwrite(reinterpret_cast<const std::byte*>(p.data()) + gz::wire::kHeaderBytes, 1, bytes - gz::wire::kHeaderBytes, b);
      std::fclose(b);
      ++files;
    }
  }
  std::printf("wrote %d seeds to %s\n", files, argv[1]);
  return 0;
}
