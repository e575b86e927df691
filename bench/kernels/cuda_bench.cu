// CUDA benchmarks: copy_cuda/<n>, encode_cuda/<codec>/<n>,
// decode_cuda/<codec>/<n>, encode_bf16_cuda/<codec>/<n> and
// decode_bf16_cuda/<codec>/<n> (a bfloat16 gradient and output; the residual
// stays float), topk_cuda/<n>/<k>. Each iteration is one call on
// one stream, timed with CUDA events around it (manual time), inputs drawn on
// the device. Without a GPU every one reports "no CUDA device".
//
// Bytes moved (for GB/s, compared with copy_cuda in main.cc's summary) count
// each array the call must touch once:
//   copy_cuda    4n read + 4n written (cudaMemcpyAsync device to device)
//   encode_cuda  g read, payload written; with EF also r read and written
//   decode_cuda  payload read, out read and written (topk: only the sent entries)
//   *_bf16_cuda  the same with 2-byte g and out
//   topk_cuda    v read once (4n): selection + compaction, no EF
// For topk the count is the floor, not what the passes really move; its
// targets are relative to torch (bench/topk_torch.py), not to copy.
#include <cuda_runtime.h>

#include <memory>
#include <utility>
#include <string>

#include "bench_util.h"
#include "common/cuda_check.h"
#include "compressors/codec.h"
#include "compressors/wire_format.h"
#include "kernels/cuda.h"
#include "kernels/element.h"
#include "kernels/topk.h"

namespace gz::bench {
namespace {

bool have_gpu() { return kernels::cuda::device_count() > 0; }

// Normal(0, sigma) from a counter-based hash (Box-Muller), so 64M values take
// microseconds instead of seconds of host time.
__device__ __forceinline__ std::uint32_t hash32(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

__global__ void fill_normal_kernel(float* x, std::size_t n, std::uint64_t seed, float sigma) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float u1 = (hash32(seed * 0x9E3779B97F4A7C15ULL + 2 * i) + 1.0f) * 2.3283064e-10f;
    const float u2 = hash32(seed * 0x9E3779B97F4A7C15ULL + 2 * i + 1) * 2.3283064e-10f;
    x[i] = sigma * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  }
}

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  std::size_t count = 0;
  explicit DeviceArray(std::size_t c) : count(c) { GZ_CUDA_CHECK(cudaMalloc(&ptr, (c ? c : 1) * sizeof(T))); }
  ~DeviceArray() { (void)cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

void fill_normal(float* x, std::size_t n, std::uint64_t seed, float sigma) {
  fill_normal_kernel<<<1024, 256>>>(x, n, seed, sigma);
  GZ_CUDA_CHECK(cudaPeekAtLastError());
  GZ_CUDA_CHECK(cudaDeviceSynchronize());
}

// Times one call on `stream` with events.
class EventTimer {
 public:
  explicit EventTimer(cudaStream_t s) : s_(s) {
    GZ_CUDA_CHECK(cudaEventCreate(&a_));
    GZ_CUDA_CHECK(cudaEventCreate(&b_));
  }
  ~EventTimer() {
    (void)cudaEventDestroy(a_);
    (void)cudaEventDestroy(b_);
  }
  template <class F>
  double seconds(F&& f) {
    GZ_CUDA_CHECK(cudaEventRecord(a_, s_));
    f();
    GZ_CUDA_CHECK(cudaEventRecord(b_, s_));
    GZ_CUDA_CHECK(cudaEventSynchronize(b_));
    float ms = 0;
    GZ_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
    return ms * 1e-3;
  }

 private:
  cudaStream_t s_;
  cudaEvent_t a_, b_;
};

struct Stream {
  cudaStream_t s;
  Stream() { GZ_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(s); }
};

void bm_copy_cuda(benchmark::State& state, std::size_t n) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  DeviceArray<float> src(n), dst(n);
  fill_normal(src.ptr, n, 1, 1.0f);
  Stream st;
  EventTimer t(st.s);
  auto copy = [&] { GZ_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, 4 * n, cudaMemcpyDeviceToDevice, st.s)); };
  t.seconds(copy);  // warm-up
  for (auto _ : state) state.SetIterationTime(t.seconds(copy));
  set_rates(state, n, 8 * n);
}

struct CodecBuffers {
  std::unique_ptr<Codec> codec;
  std::size_t n;
  Dtype dtype;
  DeviceArray<float> g, r, out;
  DeviceArray<kernels::BFloat16> g16, out16;  // dtype bfloat16: g rounded, and the output
  DeviceArray<std::byte> payload, ws;
  DeviceArray<PayloadStatus> status;
  Stream st;
  ExecContext ctx;
  std::size_t bytes = 0;

  CodecBuffers(const std::string& spec, std::size_t count, Dtype dt = Dtype::Float32)
      : codec(make_codec(spec)),
        n(count),
        dtype(dt),
        g(count),
        r(count),
        out(count),
        g16(dt == Dtype::Float32 ? 0 : count),
        out16(dt == Dtype::Float32 ? 0 : count),
        payload(codec->max_payload_bytes(count)),
        ws(codec->workspace_bytes(count, Device::Cuda, dt)),
        status(1) {
    fill_normal(g.ptr, n, 2, 1.0f);
    fill_normal(r.ptr, n, 3, 0.01f);
    GZ_CUDA_CHECK(cudaMemset(out.ptr, 0, 4 * n));
    if (dtype != Dtype::Float32) {
      kernels::cuda::narrow(g.ptr, n, g16.ptr, nullptr, nullptr);
      GZ_CUDA_CHECK(cudaMemset(out16.ptr, 0, 2 * n));
      GZ_CUDA_CHECK(cudaDeviceSynchronize());
    }
    GZ_CUDA_CHECK(cudaMemset(status.ptr, 0, sizeof(PayloadStatus)));
    ctx = ExecContext{Device::Cuda, st.s, ws.ptr, ws.count};
  }
  bool wide() const { return dtype == Dtype::Float32; }
  std::size_t encode() {
    const void* grad = wide() ? static_cast<const void*>(g.ptr) : g16.ptr;
    return bytes = codec->encode(grad, dtype, codec->error_feedback() ? r.ptr : nullptr, n, payload.ptr,
                                 payload.count, ctx);
  }
  // The hot-path form: the verdict goes to a device status word, no sync.
  void decode() {
    ExecContext c = ctx;
    c.status = status.ptr;
    codec->decode_accumulate(payload.ptr, bytes, wide() ? static_cast<void*>(out.ptr) : out16.ptr, dtype, n, c);
  }
  std::size_t elem_bytes() const { return wide() ? 4 : 2; }
};

void bm_encode_cuda(benchmark::State& state, const std::string& spec, std::size_t n, Dtype dtype) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  CodecBuffers b(spec, n, dtype);
  EventTimer t(b.st.s);
  t.seconds([&] { b.encode(); });
  for (auto _ : state) state.SetIterationTime(t.seconds([&] { b.encode(); }));
  set_rates(state, n, b.elem_bytes() * n + (b.codec->error_feedback() ? 8 * n : 0) + b.bytes);
  state.counters["payload_B"] = static_cast<double>(b.bytes);
}

void bm_decode_cuda(benchmark::State& state, const std::string& spec, std::size_t n, Dtype dtype) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  CodecBuffers b(spec, n, dtype);
  b.encode();
  EventTimer t(b.st.s);
  t.seconds([&] { b.decode(); });
  for (auto _ : state) state.SetIterationTime(t.seconds([&] { b.decode(); }));
  check_payload_status(b.status.ptr, b.st.s);  // every decode above was valid
  // A sparse codec touches only the sent entries of out (read + write: 8
  // bytes each, 4 in bfloat16; an entry is 8 payload bytes).
  const bool sparse = b.codec->descriptor().hint.sparse;
  const std::size_t out_bytes = sparse ? (b.bytes - wire::kHeaderBytes) * b.elem_bytes() / 4 : 2 * b.elem_bytes() * n;
  set_rates(state, n, out_bytes + b.bytes);
}

// Selection + ordered compaction of the k largest |v| (no EF), the part
// torch.topk does (bench/topk_torch.py times that on the same sizes).
void bm_topk_cuda(benchmark::State& state, std::size_t n, std::size_t k) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  DeviceArray<float> v(n);
  DeviceArray<std::uint32_t> body(2 * k);
  fill_normal(v.ptr, n, 4, 1.0f);
  std::size_t ws_bytes = 0;
  kernels::cuda::topk_encode<float>(nullptr, ws_bytes, nullptr, nullptr, n, k, false, nullptr, {}, nullptr, nullptr);
  DeviceArray<std::byte> ws(ws_bytes);
  Stream st;
  EventTimer t(st.s);
  auto run = [&] {
    kernels::cuda::topk_encode(ws.ptr, ws_bytes, v.ptr, nullptr, n, k, false, body.ptr, {}, nullptr, st.s);
  };
  t.seconds(run);
  for (auto _ : state) state.SetIterationTime(t.seconds(run));
  set_rates(state, n, 4 * n);
}

[[maybe_unused]] const bool registered = [] {
  const std::vector<BenchCodec>& codecs = bench_codecs();
  for (std::size_t n : sizes()) {
    const std::string sn = size_name(n);
    benchmark::RegisterBenchmark(("copy_cuda/" + sn).c_str(), bm_copy_cuda, n)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    for (const auto& [family, dtype] : {std::pair{std::string("_cuda/"), Dtype::Float32},
                                        std::pair{std::string("_bf16_cuda/"), Dtype::BFloat16}}) {
      for (const BenchCodec& c : codecs) {
        benchmark::RegisterBenchmark(("encode" + family + c.name + "/" + sn).c_str(), bm_encode_cuda, c.spec, n,
                                     dtype)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("decode" + family + c.name + "/" + sn).c_str(), bm_decode_cuda, c.spec, n,
                                     dtype)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
    const std::size_t k = kernels::topk_k_for_density(n, 0.01);
    benchmark::RegisterBenchmark(("topk_cuda/" + sn + "/" + std::to_string(k)).c_str(), bm_topk_cuda, n, k)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
}  // namespace gz::bench
