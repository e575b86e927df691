// GPU codecs against the CPU reference (the executable specification): for the
// same input, the same payload bits (NaN == NaN), the same residual, the same
// decoded output; over sizes that hit every tail of every kernel, for every
// registered codec's test specs (descriptor.h) plus the paths only some
// codecs have.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <set>
#include <sstream>

#include "compressors/codec.h"
#include "compressors/descriptor.h"
#include "compressors/wire_format.h"
#include "gpu_test_util.h"
#include "kernels/cast.h"
#include "kernels/cpu.h"
#include "kernels/onebit.h"
#include "kernels/topk.h"

namespace gz {
namespace {

using test::DeviceBuffer;

bool half_nan(std::uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu); }
bool bf16_nan(std::uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu); }

template <class T>
std::vector<T> read_array(const std::byte* p, std::size_t count) {
  std::vector<T> v(count);
  if (count) std::memcpy(v.data(), p, count * sizeof(T));
  return v;
}

/// Header bit-exact; body per its layout, floats compared with NaN == NaN
/// where a codec sends the input's NaN bits (CPU and GPU arithmetic make
/// different NaNs); any other codec's body must match byte for byte.
::testing::AssertionResult same_payload(const std::vector<std::byte>& cpu, const std::vector<std::byte>& gpu) {
  if (cpu.size() != gpu.size())
    return ::testing::AssertionFailure() << "payload sizes differ: cpu " << cpu.size() << ", gpu " << gpu.size();
  if (cpu.size() < wire::kHeaderBytes) return ::testing::AssertionFailure() << "payload shorter than a header";
  if (std::memcmp(cpu.data(), gpu.data(), wire::kHeaderBytes) != 0)
    return ::testing::AssertionFailure() << "headers differ";
  const wire::Header h = wire::read_header(cpu.data(), cpu.size());
  const std::byte* a = cpu.data() + wire::kHeaderBytes;
  const std::byte* b = gpu.data() + wire::kHeaderBytes;
  auto floats = [&](std::size_t offset, std::size_t count, const char* what) -> ::testing::AssertionResult {
    const auto x = read_array<float>(a + offset, count), y = read_array<float>(b + offset, count);
    const long long i = test::first_float_mismatch(x.data(), y.data(), count);
    if (i >= 0)
      return ::testing::AssertionFailure() << what << "[" << i << "] differs: cpu vs gpu "
                                           << test::float_pair(x[i], y[i]);
    return ::testing::AssertionSuccess();
  };
  auto words = [&](std::size_t offset, std::size_t count, const char* what) -> ::testing::AssertionResult {
    const auto x = read_array<std::uint32_t>(a + offset, count), y = read_array<std::uint32_t>(b + offset, count);
    for (std::size_t i = 0; i < count; ++i)
      if (x[i] != y[i])
        return ::testing::AssertionFailure() << what << "[" << i << "] differs: cpu " << x[i] << ", gpu " << y[i];
    return ::testing::AssertionSuccess();
  };
  auto halves = [&](bool (*is_nan)(std::uint16_t)) -> ::testing::AssertionResult {
    const auto x = read_array<std::uint16_t>(a, h.count), y = read_array<std::uint16_t>(b, h.count);
    for (std::size_t i = 0; i < h.count; ++i)
      if (x[i] != y[i] && !(is_nan(x[i]) && is_nan(y[i])))
        return ::testing::AssertionFailure() << "element " << i << " differs: cpu 0x" << std::hex << x[i]
                                             << ", gpu 0x" << y[i];
    return ::testing::AssertionSuccess();
  };
  switch (h.codec) {
    case CodecId::None: return floats(0, h.count, "value");
    case CodecId::Fp16: return halves(half_nan);
    case CodecId::Bf16: return halves(bf16_nan);
    case CodecId::Onebit: {
      const std::size_t blocks = kernels::onebit_blocks(h.count, h.param);
      if (auto r = floats(0, 2 * blocks, "scale (pos, neg interleaved)"); !r) return r;
      return words(8 * blocks, kernels::onebit_words(h.count), "sign word");
    }
    case CodecId::TopK: {
      if (auto r = words(0, h.param, "index"); !r) return r;
      return floats(4 * std::size_t{h.param}, h.param, "value");
    }
    default: break;
  }
  for (std::size_t i = 0; i < h.body_bytes; ++i)
    if (a[i] != b[i])
      return ::testing::AssertionFailure() << "body byte " << i << " differs: cpu 0x" << std::hex
                                           << std::to_integer<int>(a[i]) << ", gpu 0x" << std::to_integer<int>(b[i]);
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_floats(const std::vector<float>& cpu, const std::vector<float>& gpu, const char* what) {
  if (cpu.size() != gpu.size()) return ::testing::AssertionFailure() << what << " sizes differ";
  const long long i = test::first_float_mismatch(cpu.data(), gpu.data(), cpu.size());
  if (i >= 0)
    return ::testing::AssertionFailure() << what << "[" << i << "] differs: cpu vs gpu "
                                         << test::float_pair(cpu[i], gpu[i]);
  return ::testing::AssertionSuccess();
}

enum class Input { Gaussian, Special, Ties, Zeros };

const char* input_name(Input in) {
  switch (in) {
    case Input::Gaussian: return "gaussian";
    case Input::Special: return "special";
    case Input::Ties: return "ties";
    case Input::Zeros: return "zeros";
  }
  return "?";
}

// Gradient and residual for one case. Special inputs keep NaNs below k for
// topk: every NaN is then sent on both sides (NaN keys tie; see topk.h).
void make_inputs(Input in, std::size_t n, std::uint64_t seed, std::size_t nan_budget, std::vector<float>& g,
                 std::vector<float>& r) {
  std::mt19937_64 rng(seed);
  switch (in) {
    case Input::Gaussian:
      g = test::gaussian(n, rng);
      r = test::gaussian(n, rng, 0.1f);
      break;
    case Input::Special: {
      g = test::gaussian(n, rng);
      r = test::gaussian(n, rng, 0.1f);
      const std::size_t count = std::min<std::size_t>(n / 8 + 1, 64);
      test::sprinkle(g, count, rng, /*allow_nan=*/false);
      test::sprinkle(r, count / 4, rng, false);
      std::uniform_int_distribution<std::size_t> pos(0, n ? n - 1 : 0);
      for (std::size_t c = 0; c < std::min<std::size_t>(nan_budget / 2, 8) && n; ++c)
        g[pos(rng)] = test::bits_to_float(c % 2 ? 0xFFC00000u : 0x7F800001u);
      break;
    }
    case Input::Ties: {  // magnitudes from a tiny set: ties everywhere, also across signs
      std::uniform_int_distribution<int> d(-3, 3);
      g.resize(n);
      r.assign(n, 0.0f);
      for (auto& x : g) x = static_cast<float>(d(rng));
      break;
    }
    case Input::Zeros:
      g.assign(n, 0.0f);
      r.assign(n, 0.0f);
      if (n) g[n / 2] = -0.0f;
      break;
  }
}

struct Case {
  std::string spec;
  std::size_t n;
  Input input;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.spec << " n=" << c.n << " " << input_name(c.input); }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.spec + "_" + std::to_string(info.param.n) + "_" + input_name(info.param.input);
  for (auto& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s + "_" + std::to_string(info.index);
}

class CudaCodecVsCpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { GZ_REQUIRE_GPU(); }
};

// One case: encode on both, compare payload and residual; decode the payload
// on both into the same random output, compare; decode again on the GPU in
// asynchronous mode (status word) and with the codec's own workspace.
TEST_P(CudaCodecVsCpu, SamePayloadResidualAndDecode) {
  const Case& c = GetParam();
  const std::uint64_t seed = test::test_seed() ^ (std::hash<std::string>{}(c.spec) + 0x9E37 * c.n);
  SCOPED_TRACE("spec " + c.spec + ", n " + std::to_string(c.n) + ", input " + input_name(c.input) +
               ", GZ_TEST_SEED=" + std::to_string(test::test_seed()));
  auto cpu = make_codec(c.spec);
  auto gpu = make_codec(c.spec);
  const std::size_t n = c.n;
  // Special inputs keep NaNs below K for a sparse codec (see make_inputs).
  const std::size_t nan_budget = cpu->descriptor().hint.sparse ? cpu->header_param(n) : 16;
  std::vector<float> g, r0;
  make_inputs(c.input, n, seed, nan_budget, g, r0);
  const bool ef = cpu->error_feedback();

  // CPU reference.
  std::vector<float> r_cpu = r0;
  std::vector<std::byte> p_cpu(cpu->max_payload_bytes(n), std::byte{0xCD});
  std::vector<std::byte> host_ws(cpu->workspace_bytes(n, Device::Cpu));
  const ExecContext host{Device::Cpu, nullptr, host_ws.data(), host_ws.size()};
  const std::size_t bytes_cpu =
      cpu->encode(g.data(), ef ? r_cpu.data() : nullptr, n, p_cpu.data(), p_cpu.size(), host);
  p_cpu.resize(bytes_cpu);

  // GPU, with a caller workspace (two-phase).
  cudaStream_t stream;
  GZ_CUDA_CHECK(cudaStreamCreate(&stream));
  const std::size_t ws_bytes = gpu->workspace_bytes(n, Device::Cuda);
  ASSERT_GE(ws_bytes, Codec::kCudaStatusBytes);
  DeviceBuffer<std::byte> ws(ws_bytes), payload(gpu->max_payload_bytes(n));
  payload.fill_bytes(0xAB);  // poison: an unwritten byte shows
  DeviceBuffer<float> dg(g), dr(r0);
  ExecContext ctx{Device::Cuda, stream, ws.get(), ws_bytes};
  const std::size_t bytes_gpu = gpu->encode(dg.get(), ef ? dr.get() : nullptr, n, payload.get(), payload.size(), ctx);
  GZ_CUDA_CHECK(cudaStreamSynchronize(stream));
  ASSERT_EQ(bytes_gpu, bytes_cpu);
  const std::vector<std::byte> p_gpu = payload.download(bytes_gpu);
  ASSERT_TRUE(same_payload(p_cpu, p_gpu));
  if (ef) {
    ASSERT_TRUE(same_floats(r_cpu, dr.download(), "residual"));
  }

  // Decode the same payload on both into the same output.
  std::mt19937_64 rng(seed + 1);
  const std::vector<float> out0 = test::gaussian(n, rng);
  std::vector<float> out_cpu = out0;
  cpu->decode_accumulate(p_cpu.data(), p_cpu.size(), out_cpu.data(), n, host);
  DeviceBuffer<float> dout(out0);
  gpu->decode_accumulate(payload.get(), bytes_gpu, dout.get(), n, ctx);  // synchronous verdict
  ASSERT_TRUE(same_floats(out_cpu, dout.download(), "decoded output (sync)"));

  // Asynchronous verdict through a status word; a second workspace.
  test::CudaWorkspace ws2(*gpu, n);
  DeviceBuffer<PayloadStatus> status(1);
  status.fill_bytes(0);
  dout.upload(out0);
  gpu->decode_accumulate(payload.get(), bytes_gpu, dout.get(), n, ws2.ctx(stream, status.get()));
  EXPECT_NO_THROW(check_payload_status(status.get(), stream));
  ASSERT_TRUE(same_floats(out_cpu, dout.download(), "decoded output (async)"));

  // The other combine modes (overwrite, scale), and a sum of two payloads.
  for (const Combine mode : {Combine{false, 1.0f}, Combine{true, 0.25f}, Combine{false, 1.0f / 3}}) {
    std::vector<float> want = out0;
    cpu->decode(p_cpu.data(), p_cpu.size(), want.data(), n, mode, host);
    dout.upload(out0);
    gpu->decode(payload.get(), bytes_gpu, dout.get(), n, mode, ctx);
    ASSERT_TRUE(same_floats(want, dout.download(), mode.accumulate ? "decoded output (scaled)" : "decoded output (overwrite)"));
  }
  {
    std::vector<float> want = out0;
    const PayloadRef host_refs[2] = {{p_cpu.data(), p_cpu.size()}, {p_cpu.data(), p_cpu.size()}};
    cpu->decode_sum(host_refs, want.data(), n, 1.0f / 3, host);
    dout.upload(out0);
    const PayloadRef dev_refs[2] = {{payload.get(), bytes_gpu}, {payload.get(), bytes_gpu}};
    gpu->decode_sum(dev_refs, dout.get(), n, 1.0f / 3, ctx);
    ASSERT_TRUE(same_floats(want, dout.download(), "decode_sum"));
  }

  // Encoding again through another workspace gives the same payload.
  dr.upload(r0);
  payload.fill_bytes(0x5A);
  const std::size_t again =
      gpu->encode(dg.get(), ef ? dr.get() : nullptr, n, payload.get(), payload.size(), ws2.ctx(stream));
  GZ_CUDA_CHECK(cudaStreamSynchronize(stream));
  ASSERT_EQ(again, bytes_cpu);
  ASSERT_TRUE(same_payload(p_cpu, payload.download(again)));
  GZ_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Every registered codec's test specs.
std::vector<std::string> registry_specs() {
  std::vector<std::string> specs;
  for (const CodecDescriptor* d : all_codecs())
    for (std::string_view s : d->test_specs) specs.emplace_back(s);
  return specs;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const std::vector<std::size_t> tails = {0, 1, 31, 32, 33, 511, 512, 513, 1000, 4095, 4096, 4097, 65535, 65536,
                                          65537, (1u << 20) - 1, (1u << 20) + 1};
  const std::size_t big = 10'000'003;
  std::vector<std::string> specs = registry_specs();
  for (const char* extra : {"onebit:ef=off", "topk:ef=off", "topk:density=0.1,select=sample,ef=off"})
    specs.emplace_back(extra);
  for (const std::string& spec : specs) {
    for (std::size_t n : tails) cases.push_back({spec, n, Input::Gaussian});
    cases.push_back({spec, big, Input::Gaussian});
    for (std::size_t n : {std::size_t{1000}, std::size_t{70001}}) cases.push_back({spec, n, Input::Special});
    for (std::size_t n : {std::size_t{100}, std::size_t{65537}}) cases.push_back({spec, n, Input::Zeros});
  }
  // onebit: block sizes for the register path (<= 512), the reload path
  // (> 512, multiple of 32), and the two-pass path (not a multiple of 32).
  for (const char* spec : {"onebit:block=32", "onebit:block=64", "onebit:block=1024", "onebit:block=4096",
                           "onebit:block=100", "onebit:block=33", "onebit:block=7", "onebit:block=1"}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{33}, std::size_t{99},
                          std::size_t{101}, std::size_t{1023}, std::size_t{1025}, std::size_t{4097},
                          std::size_t{65537}})
      cases.push_back({spec, n, Input::Gaussian});
    cases.push_back({spec, 1000, Input::Special});
  }
  cases.push_back({"onebit:block=100", big, Input::Gaussian});
  cases.push_back({"onebit:block=1024", big, Input::Gaussian});
  // topk: k at the edges, ties (the index digits), all zeros (the whole-array
  // path), and densities that move the sample rank.
  for (const char* spec : {"topk:k=1", "topk:k=2", "topk:k=1000", "topk:density=1", "topk:density=0.5",
                           "topk:density=0.3", "topk:density=0.001", "topk:density=0.2,select=sample"}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{999}, std::size_t{1000}, std::size_t{1001},
                          std::size_t{65535}, std::size_t{65537}, std::size_t{300007}})
      cases.push_back({spec, n, Input::Gaussian});
  }
  for (const char* spec : {"topk", "topk:k=1", "topk:density=0.3", "topk:select=sample", "topk:ef=off",
                           "topk:density=0.5,select=sample"}) {
    for (std::size_t n : {std::size_t{100}, std::size_t{65537}, std::size_t{300007}}) {
      cases.push_back({spec, n, Input::Ties});
      cases.push_back({spec, n, Input::Zeros});
    }
  }
  cases.push_back({"topk", big, Input::Ties});
  cases.push_back({"fp16", big, Input::Special});
  cases.push_back({"onebit", big, Input::Special});
  cases.push_back({"topk", big, Input::Special});
  // GZ_TEST_MAX_N keeps runs under compute-sanitizer short.
  if (const char* m = std::getenv("GZ_TEST_MAX_N")) {
    const std::size_t max_n = std::strtoull(m, nullptr, 0);
    cases.erase(std::remove_if(cases.begin(), cases.end(), [&](const Case& c) { return c.n > max_n; }), cases.end());
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Codecs, CudaCodecVsCpu, ::testing::ValuesIn(all_cases()), case_name);

class CudaCodec : public ::testing::Test {
 protected:
  void SetUp() override { GZ_REQUIRE_GPU(); }
};

// D(payload) + r_new == g + r_old, to rounding, on the GPU path, for every
// registered test spec with error feedback.
TEST_F(CudaCodec, ErrorFeedbackInvariant) {
  const std::size_t n = 300007;
  for (const std::string& spec : registry_specs()) {
    SCOPED_TRACE(spec);
    auto codec = make_codec(spec);
    if (!codec->error_feedback()) continue;
    std::mt19937_64 rng(test::test_seed() + 7);
    const std::vector<float> g = test::gaussian(n, rng), r0 = test::gaussian(n, rng, 0.1f);
    DeviceBuffer<float> dg(g), dr(r0), dout(std::vector<float>(n, 0.0f));
    DeviceBuffer<std::byte> payload(codec->max_payload_bytes(n));
    const test::CudaWorkspace ws(*codec, n);
    const ExecContext ctx = ws.ctx();
    const std::size_t bytes = codec->encode(dg.get(), dr.get(), n, payload.get(), payload.size(), ctx);
    codec->decode_accumulate(payload.get(), bytes, dout.get(), n, ctx);
    const std::vector<float> d = dout.download(), r = dr.download();
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(g[i]) + r0[i];
      const double err = std::abs(static_cast<double>(d[i]) + r[i] - v) / std::max(1.0, std::abs(v));
      worst = std::max(worst, err);
    }
    EXPECT_LE(worst, 1e-6) << "worst relative error of D(payload) + r_new against g + r_old";
  }
}

// 16-bit gradients (float16, bfloat16): the GPU encodes the same payload and
// float residual as the CPU, and decodes into a 16-bit output (every combine
// mode, and a sum, rounded once) the same bits, for every test spec.
TEST_F(CudaCodec, SixteenBitGradientsMatchTheCpu) {
  for (const std::string& spec : registry_specs()) {
    for (const Dtype dtype : {Dtype::Float16, Dtype::BFloat16}) {
      for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{100003}}) {
        SCOPED_TRACE(spec + " " + to_string(dtype) + " n=" + std::to_string(n));
        auto cpu = make_codec(spec), gpu = make_codec(spec);
        const bool ef = cpu->error_feedback();
        std::mt19937_64 rng(test::test_seed() + n);
        auto round16 = [&](const std::vector<float>& f) {
          std::vector<std::uint16_t> b(f.size());
          for (std::size_t i = 0; i < f.size(); ++i)
            b[i] = dtype == Dtype::Float16 ? kernels::half_from_float_rne(f[i]) : kernels::bf16_from_float_rne(f[i]);
          return b;
        };
        std::vector<float> gf = test::gaussian(n, rng);
        const auto special = test::special_values();
        for (std::size_t i = 0; i < n && i / 97 < special.size(); i += 97) gf[i] = special[i / 97];
        const std::vector<std::uint16_t> g = round16(gf), out0 = round16(test::gaussian(n, rng));
        const std::vector<float> r0 = test::gaussian(n, rng, 0.1f);

        std::vector<float> r_cpu = r0;
        std::vector<std::byte> p_cpu(cpu->max_payload_bytes(n));
        std::vector<std::byte> host_ws(cpu->workspace_bytes(n, Device::Cpu, dtype));
        const ExecContext host{Device::Cpu, nullptr, host_ws.data(), host_ws.size()};
        p_cpu.resize(cpu->encode(g.data(), dtype, ef ? r_cpu.data() : nullptr, n, p_cpu.data(), p_cpu.size(), host));

        cudaStream_t stream;
        GZ_CUDA_CHECK(cudaStreamCreate(&stream));
        DeviceBuffer<std::byte> ws(gpu->workspace_bytes(n, Device::Cuda, dtype)), payload(gpu->max_payload_bytes(n));
        DeviceBuffer<std::uint16_t> dg(g), dout(out0);
        DeviceBuffer<float> dr(r0);
        const ExecContext ctx{Device::Cuda, stream, ws.get(), ws.size()};
        const std::size_t bytes = gpu->encode(dg.get(), dtype, ef ? dr.get() : nullptr, n, payload.get(), payload.size(), ctx);
        GZ_CUDA_CHECK(cudaStreamSynchronize(stream));
        ASSERT_EQ(bytes, p_cpu.size());
        ASSERT_TRUE(same_payload(p_cpu, payload.download(bytes)));
        if (ef) {
          ASSERT_TRUE(same_floats(r_cpu, dr.download(), "residual"));
        }

        auto same16 = [&](const std::vector<std::uint16_t>& want, const std::vector<std::uint16_t>& got, const char* what) {
          for (std::size_t i = 0; i < n; ++i) {
            const bool nan_a = dtype == Dtype::Float16 ? half_nan(want[i]) : bf16_nan(want[i]);
            const bool nan_b = dtype == Dtype::Float16 ? half_nan(got[i]) : bf16_nan(got[i]);
            if (nan_a && nan_b) continue;
            ASSERT_EQ(want[i], got[i]) << what << " i=" << i;
          }
        };
        for (const Combine mode :
             {Combine{true, 1.0f}, Combine{false, 1.0f}, Combine{true, 0.25f}, Combine{false, 0.5f}}) {
          std::vector<std::uint16_t> want = out0;
          cpu->decode(p_cpu.data(), p_cpu.size(), want.data(), dtype, n, mode, host);
          dout.upload(out0);
          gpu->decode(payload.get(), bytes, dout.get(), dtype, n, mode, ctx);
          same16(want, dout.download(), "decode");
        }
        // An output 2 bytes off 16-byte alignment takes the scalar path, same bits.
        {
          std::vector<std::uint16_t> shifted(n + 1, 0);
          std::copy(out0.begin(), out0.end(), shifted.begin() + 1);
          DeviceBuffer<std::uint16_t> dshifted(shifted);
          std::vector<std::uint16_t> want = out0;
          cpu->decode(p_cpu.data(), p_cpu.size(), want.data(), dtype, n, Combine{true, 0.25f}, host);
          gpu->decode(payload.get(), bytes, dshifted.get() + 1, dtype, n, Combine{true, 0.25f}, ctx);
          const std::vector<std::uint16_t> got = dshifted.download();
          same16(want, std::vector<std::uint16_t>(got.begin() + 1, got.end()), "decode, unaligned out");
        }
        // Sums of 1, 2 and 3 payloads: the last one adds the float partial sum
        // of the others and rounds once.
        for (const std::size_t m : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
          std::vector<std::uint16_t> want = out0;
          const std::vector<PayloadRef> host_refs(m, PayloadRef{p_cpu.data(), p_cpu.size()});
          cpu->decode_sum(host_refs, want.data(), dtype, n, 0.5f, host);
          dout.upload(out0);
          const std::vector<PayloadRef> dev_refs(m, PayloadRef{payload.get(), bytes});
          gpu->decode_sum(dev_refs, dout.get(), dtype, n, 0.5f, ctx);
          same16(want, dout.download(), ("decode_sum of " + std::to_string(m)).c_str());
        }
        GZ_CUDA_CHECK(cudaStreamDestroy(stream));
      }
    }
  }
}

// Exact top-k on the GPU is the K largest magnitudes, ties to the lower index,
// checked against a sort (independent of the CPU loop), on data full of ties.
TEST_F(CudaCodec, TopkIsTheKLargestBySort) {
  const std::size_t n = 250001;
  for (std::size_t k : {std::size_t{1}, std::size_t{2500}, std::size_t{70000}, n - 1}) {
    SCOPED_TRACE(k);
    auto codec = make_codec("topk:k=" + std::to_string(k) + ",ef=off");
    std::mt19937_64 rng(test::test_seed() + k);
    std::uniform_int_distribution<int> d(-50, 50);
    std::vector<float> g(n);
    for (auto& x : g) x = static_cast<float>(d(rng)) * 0.25f;
    DeviceBuffer<float> dg(g);
    DeviceBuffer<std::byte> payload(codec->max_payload_bytes(n));
    const test::CudaWorkspace ws(*codec, n);
    const std::size_t bytes = codec->encode(dg.get(), nullptr, n, payload.get(), payload.size(), ws.ctx());
    ASSERT_EQ(bytes, wire::kHeaderBytes + 8 * k);
    const auto p = payload.download(bytes);
    const auto idx = read_array<std::uint32_t>(p.data() + wire::kHeaderBytes, k);
    const auto val = read_array<float>(p.data() + wire::kHeaderBytes + 4 * k, k);
    std::vector<std::uint32_t> order(n);
    for (std::uint32_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return std::abs(g[a]) > std::abs(g[b]); });
    std::vector<std::uint32_t> want(order.begin(), order.begin() + k);
    std::sort(want.begin(), want.end());
    ASSERT_EQ(idx, want);
    for (std::size_t j = 0; j < k; ++j) ASSERT_EQ(test::float_to_bits(val[j]), test::float_to_bits(g[idx[j]]));
  }
}

// select=sample sends between topk_sampled_min(k) and topk_sampled_max(k)
// entries (or exactly k), every one at least as large as anything left out.
TEST_F(CudaCodec, SampledTopkRespectsTheBound) {
  for (std::size_t n : {std::size_t{70000}, std::size_t{1u << 20}, std::size_t{3000017}}) {
    for (const char* spec : {"topk:select=sample", "topk:density=0.05,select=sample", "topk:k=3,select=sample"}) {
      SCOPED_TRACE(std::string(spec) + " n=" + std::to_string(n));
      auto codec = make_codec(spec);
      const std::size_t k = codec->header_param(n);
      std::mt19937_64 rng(test::test_seed() + n);
      const std::vector<float> g = test::gaussian(n, rng), r0 = test::gaussian(n, rng, 0.1f);
      DeviceBuffer<float> dg(g), dr(r0);
      DeviceBuffer<std::byte> payload(codec->max_payload_bytes(n));
      const test::CudaWorkspace ws(*codec, n);
      const std::size_t bytes = codec->encode(dg.get(), dr.get(), n, payload.get(), payload.size(), ws.ctx());
      const std::size_t count = (bytes - wire::kHeaderBytes) / 8;
      EXPECT_TRUE(count == k ||
                  (count >= kernels::cpu::topk_sampled_min(k) && count <= kernels::cpu::topk_sampled_max(k)))
          << count << " entries for k = " << k;
      const auto p = payload.download(bytes);
      EXPECT_NO_THROW(wire::read_header(p.data(), p.size()));
      const auto idx = read_array<std::uint32_t>(p.data() + wire::kHeaderBytes, count);
      EXPECT_NO_THROW(wire::check_topk_indices(idx.data(), count, n));
      const std::vector<float> r = dr.download();
      std::vector<bool> sent(n, false);
      float min_sent = std::numeric_limits<float>::infinity();
      for (auto i : idx) sent[i] = true, min_sent = std::min(min_sent, std::abs(g[i] + r0[i]));
      float max_kept = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float v = g[i] + r0[i];
        if (sent[i]) {
          ASSERT_EQ(r[i], 0.0f) << i;
        } else {
          ASSERT_EQ(test::float_to_bits(r[i]), test::float_to_bits(v)) << i;
          max_kept = std::max(max_kept, std::abs(v));
        }
      }
      EXPECT_GE(min_sent, max_kept);
    }
  }
}

// The same input gives the same payload bits, run after run (the ordered
// compaction does not depend on block scheduling).
TEST_F(CudaCodec, TopkIsDeterministic) {
  const std::size_t n = 10'000'003;
  auto codec = make_codec("topk:density=0.01");
  std::mt19937_64 rng(test::test_seed() + 3);
  const std::vector<float> g = test::gaussian(n, rng), r0 = test::gaussian(n, rng, 0.1f);
  DeviceBuffer<float> dg(g), dr(r0);
  DeviceBuffer<std::byte> payload(codec->max_payload_bytes(n));
  const test::CudaWorkspace ws(*codec, n);
  std::vector<std::byte> first;
  for (int run = 0; run < 3; ++run) {
    dr.upload(r0);
    const std::size_t bytes = codec->encode(dg.get(), dr.get(), n, payload.get(), payload.size(), ws.ctx());
    const auto p = payload.download(bytes);
    if (run == 0)
      first = p;
    else
      ASSERT_TRUE(first == p) << "run " << run;
  }
}

// Unaligned buffers take the scalar paths and still match the CPU.
TEST_F(CudaCodec, UnalignedBuffersMatchTheCpu) {
  const std::size_t n = 100003;
  for (const std::string& spec : registry_specs()) {
    SCOPED_TRACE(spec);
    auto cpu = make_codec(spec), gpu = make_codec(spec);
    std::mt19937_64 rng(test::test_seed() + 11);
    const std::vector<float> g = test::gaussian(n, rng), r0 = test::gaussian(n, rng, 0.1f);
    const bool ef = cpu->error_feedback();
    std::vector<float> r_cpu = r0;
    std::vector<std::byte> p_cpu(cpu->max_payload_bytes(n));
    std::vector<std::byte> host_ws(cpu->workspace_bytes(n, Device::Cpu));
    const ExecContext host{Device::Cpu, nullptr, host_ws.data(), host_ws.size()};
    p_cpu.resize(cpu->encode(g.data(), ef ? r_cpu.data() : nullptr, n, p_cpu.data(), p_cpu.size(), host));
    const test::CudaWorkspace ws(*gpu, n);
    // Offsets of 1 float (g, r) and 4 bytes (payload): 4-byte aligned, not 16.
    DeviceBuffer<float> dg(n + 1), dr(n + 1), dout(n + 1);
    DeviceBuffer<std::byte> payload(gpu->max_payload_bytes(n) + 4);
    GZ_CUDA_CHECK(cudaMemcpy(dg.get() + 1, g.data(), 4 * n, cudaMemcpyHostToDevice));
    GZ_CUDA_CHECK(cudaMemcpy(dr.get() + 1, r0.data(), 4 * n, cudaMemcpyHostToDevice));
    const std::size_t bytes = gpu->encode(dg.get() + 1, ef ? dr.get() + 1 : nullptr, n, payload.get() + 4,
                                          payload.size() - 4, ws.ctx());
    std::vector<std::byte> p_gpu(bytes);
    GZ_CUDA_CHECK(cudaMemcpy(p_gpu.data(), payload.get() + 4, bytes, cudaMemcpyDeviceToHost));
    ASSERT_TRUE(same_payload(p_cpu, p_gpu));
    std::vector<float> r_gpu(n), out_cpu(n, 1.5f), out_gpu(n);
    GZ_CUDA_CHECK(cudaMemcpy(r_gpu.data(), dr.get() + 1, 4 * n, cudaMemcpyDeviceToHost));
    if (ef) {
      ASSERT_TRUE(same_floats(r_cpu, r_gpu, "residual"));
    }
    cpu->decode_accumulate(p_cpu.data(), p_cpu.size(), out_cpu.data(), n, host);
    GZ_CUDA_CHECK(cudaMemcpy(dout.get() + 1, std::vector<float>(n, 1.5f).data(), 4 * n, cudaMemcpyHostToDevice));
    gpu->decode_accumulate(payload.get() + 4, bytes, dout.get() + 1, n, ws.ctx());
    GZ_CUDA_CHECK(cudaMemcpy(out_gpu.data(), dout.get() + 1, 4 * n, cudaMemcpyDeviceToHost));
    ASSERT_TRUE(same_floats(out_cpu, out_gpu, "decoded output"));
  }
}

TEST_F(CudaCodec, WorkspaceContract) {
  auto codec = make_codec("topk");
  const std::size_t n = 100000;
  const std::size_t need = codec->workspace_bytes(n, Device::Cuda);
  DeviceBuffer<std::byte> ws(need + 256), payload(codec->max_payload_bytes(n));
  DeviceBuffer<float> g(n), r(n);
  g.fill_bytes(0);
  r.fill_bytes(0);
  ExecContext small{Device::Cuda, nullptr, ws.get(), need - 1};
  EXPECT_THROW(codec->encode(g.get(), r.get(), n, payload.get(), payload.size(), small), InvalidArgument);
  ExecContext misaligned{Device::Cuda, nullptr, ws.get() + 16, need};
  EXPECT_THROW(codec->encode(g.get(), r.get(), n, payload.get(), payload.size(), misaligned), InvalidArgument);
  ExecContext exact{Device::Cuda, nullptr, ws.get(), need};
  EXPECT_NO_THROW(codec->encode(g.get(), r.get(), n, payload.get(), payload.size(), exact));
  // Strictly two-phase: no workspace, no call (every CUDA call needs at least the status slot).
  for (const std::string& spec : registry_specs()) {
    auto c = make_codec(spec);
    EXPECT_GE(c->workspace_bytes(n, Device::Cuda), Codec::kCudaStatusBytes) << spec;
    EXPECT_THROW(c->encode(g.get(), c->error_feedback() ? r.get() : nullptr, n, payload.get(), payload.size(),
                           {Device::Cuda}),
                 InvalidArgument)
        << spec;
  }
  for (const char* spec : {"none", "fp16", "bf16", "onebit"})
    EXPECT_EQ(make_codec(spec)->workspace_bytes(n, Device::Cuda), Codec::kCudaStatusBytes) << spec;
}

}  // namespace
}  // namespace gz
