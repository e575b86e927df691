// CPU benchmarks: encode/<codec>/<n>, decode/<codec>/<n>, copy/<n>,
// topk_select/<n>/<k>, nth_element/<n>/<k>. One thread each.
//
// Bytes moved (for GB/s) count each array read or written once:
//   copy        4n read + 4n written
//   encode      g and r read, r written, payload written (EF on)
//   decode      payload read, out read and written
//   encode_bf16/<codec>/<n>, decode_bf16/...: the same on a bfloat16 gradient
//   and output (2 bytes an element; residual float), for onebit and top-k.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "bench_util.h"
#include "compressors/codec.h"
#include "kernels/cpu.h"

namespace gz::bench {
namespace {

void bm_copy(benchmark::State& state, std::size_t n) {
  const auto src = random_normal(n, 1);
  std::vector<float> dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::ClobberMemory();
  }
  set_rates(state, n, 8 * n);
}

struct Buffers {
  std::unique_ptr<Codec> codec;
  Dtype dtype;
  std::vector<float> g, r, out;
  std::vector<std::uint16_t> g16, out16;  // dtype bfloat16: g and out rounded
  std::vector<std::uint64_t> payload;
  std::vector<std::byte> ws;
  std::size_t bytes = 0;
  ExecContext ctx;

  Buffers(const std::string& spec, std::size_t n, Dtype t = Dtype::Float32) : codec(make_codec(spec)), dtype(t) {
    g = random_normal(n, 2);
    r = random_normal(n, 3, 0.01f);
    out.assign(n, 0.0f);
    if (dtype == Dtype::BFloat16) {
      g16.resize(n);
      out16.assign(n, 0);
      kernels::cpu::narrow(g.data(), n, reinterpret_cast<kernels::BFloat16*>(g16.data()));
    }
    payload.assign(codec->max_payload_bytes(n) / 8 + 1, 0);
    ws.resize(codec->workspace_bytes(n, Device::Cpu, dtype));
    ctx.workspace = ws.data();
    ctx.workspace_bytes = ws.size();
  }
  std::byte* p() { return reinterpret_cast<std::byte*>(payload.data()); }
  const void* grad() const { return dtype == Dtype::Float32 ? static_cast<const void*>(g.data()) : g16.data(); }
  void* output() { return dtype == Dtype::Float32 ? static_cast<void*>(out.data()) : out16.data(); }
  std::size_t encode() {
    return bytes = codec->encode(grad(), dtype, r.data(), g.size(), p(), payload.size() * 8, ctx);
  }
};

void bm_encode(benchmark::State& state, const std::string& spec, std::size_t n, Dtype dtype) {
  Buffers b(spec, n, dtype);
  for (auto _ : state) {
    benchmark::DoNotOptimize(b.encode());
    benchmark::ClobberMemory();
  }
  set_rates(state, n, (dtype_bytes(dtype) + 8) * n + b.bytes);
}

void bm_decode(benchmark::State& state, const std::string& spec, std::size_t n, Dtype dtype) {
  Buffers b(spec, n, dtype);
  b.encode();
  for (auto _ : state) {
    b.codec->decode_accumulate(b.p(), b.bytes, b.output(), dtype, n, b.ctx);
    benchmark::ClobberMemory();
  }
  set_rates(state, n, 2 * dtype_bytes(dtype) * n + b.bytes);
}

// Selection + compaction of the k largest |v| (no error feedback).
void bm_topk_select(benchmark::State& state, std::size_t n, std::size_t k) {
  const auto v = random_normal(n, 4);
  std::vector<std::uint32_t> idx(k);
  std::vector<float> val(k);
  std::size_t ws_bytes = 0;
  kernels::cpu::topk_encode<float>(nullptr, ws_bytes, nullptr, nullptr, n, k, nullptr, nullptr);
  std::vector<std::byte> ws(ws_bytes);
  for (auto _ : state) {
    benchmark::DoNotOptimize(kernels::cpu::topk_encode(ws.data(), ws_bytes, v.data(), nullptr, n, k, idx.data(), val.data()));
    benchmark::ClobberMemory();
  }
  set_rates(state, n, 4 * n);
}

// The naive baseline: copy, then std::nth_element by magnitude (no indices).
void bm_nth_element(benchmark::State& state, std::size_t n, std::size_t k) {
  const auto v = random_normal(n, 4);
  std::vector<float> scratch(n);
  for (auto _ : state) {
    std::memcpy(scratch.data(), v.data(), n * sizeof(float));
    std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1), scratch.end(),
                     [](float a, float b) { return std::fabs(a) > std::fabs(b); });
    benchmark::DoNotOptimize(scratch[k - 1]);
  }
  set_rates(state, n, 4 * n);
}

[[maybe_unused]] const bool registered = [] {
  for (std::size_t n : sizes()) {
    const std::string sn = size_name(n);
    benchmark::RegisterBenchmark(("copy/" + sn).c_str(), bm_copy, n)->Unit(benchmark::kMillisecond);
    for (const BenchCodec& c : bench_codecs()) {
      benchmark::RegisterBenchmark(("encode/" + c.name + "/" + sn).c_str(), bm_encode, c.spec, n, Dtype::Float32)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("decode/" + c.name + "/" + sn).c_str(), bm_decode, c.spec, n, Dtype::Float32)
          ->Unit(benchmark::kMillisecond);
      if (c.name != "onebit" && c.name != "topk") continue;
      benchmark::RegisterBenchmark(("encode_bf16/" + c.name + "/" + sn).c_str(), bm_encode, c.spec, n,
                                   Dtype::BFloat16)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("decode_bf16/" + c.name + "/" + sn).c_str(), bm_decode, c.spec, n,
                                   Dtype::BFloat16)
          ->Unit(benchmark::kMillisecond);
    }
    const std::size_t k = kernels::topk_k_for_density(n, 0.01);
    const std::string sk = std::to_string(k);
    benchmark::RegisterBenchmark(("topk_select/" + sn + "/" + sk).c_str(), bm_topk_select, n, k)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("nth_element/" + sn + "/" + sk).c_str(), bm_nth_element, n, k)
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
}  // namespace gz::bench
