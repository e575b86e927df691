// CUDA launches of the fp8 codec over kernels/fp8.h (the functions
// kernels/fp8_cpu.cc runs, so both give the same bits).
//
// Encode: a warp per block (grid-stride over blocks). The block's values stay
// in registers (up to kMaxChunks x 32 elements; larger blocks re-read them,
// from L1/L2); the largest finite |v| is a warp max (exact in any order), so
// every lane holds the scale; lane l writes the code byte of element
// 32c + l of chunk c (32 consecutive bytes per chunk) and its residual.
// Decode: 4 consecutive elements per thread, their 4 codes as one 32-bit load.
#include "kernels/cuda_common.cuh"
#include "kernels/error_feedback.h"
#include "kernels/fp8.h"

namespace gz::kernels::cuda {
namespace {

using namespace detail;

constexpr int kMaxChunks = 16;  // registers hold blocks of up to 512 elements

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(kFullMask, x, off);
    x = select(o > x, o, x);
  }
  return x;
}

template <class Fmt, bool kEf>
__device__ __forceinline__ void convert(float v, float* __restrict__ r, std::size_t i, Fp8Scale s,
                                        std::uint8_t* __restrict__ codes) {
  const std::uint32_t c = fp8_code<Fmt>(v, s.inv);
  codes[i] = static_cast<std::uint8_t>(c);
  if constexpr (kEf) r[i] = ef_residual(v, fp8_value<Fmt>(c, s.scale));
}

template <class Fmt, bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    encode_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, std::uint32_t block,
                  float* __restrict__ scales, std::uint8_t* __restrict__ codes, Blob32 head) {
  store_blob(head);
  if (global_thread() == 0)  // zero padding after the last code
    for (std::size_t i = n; i % 4 != 0; ++i) codes[i] = 0;
  const unsigned lane = threadIdx.x & 31;
  const std::size_t blocks = Fp8Layout::blocks(fp8_param(Fmt::exp_bits, block), n);
  for (std::size_t b = global_thread() / 32; b < blocks; b += grid_threads() / 32) {
    const std::size_t begin = b * block;
    const std::uint32_t len = static_cast<std::uint32_t>(n - begin < block ? n - begin : block);
    const std::uint32_t chunks = (len + 31) / 32;
    if (chunks <= kMaxChunks) {
      float v[kMaxChunks];
      float amax = 0.0f;
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c)
        if (c * 32 + lane < len) amax = fp8_amax(amax, v[c] = ef_input<kEf>(g, r, begin + c * 32 + lane));
      const Fp8Scale s = fp8_scale<Fmt>(warp_max(amax));
      if (lane == 0) scales[b] = s.scale;
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c)
        if (c * 32 + lane < len) convert<Fmt, kEf>(v[c], r, begin + c * 32 + lane, s, codes);
    } else {
      float amax = 0.0f;
      for (std::uint32_t j = lane; j < len; j += 32) amax = fp8_amax(amax, ef_input<kEf>(g, r, begin + j));
      const Fp8Scale s = fp8_scale<Fmt>(warp_max(amax));
      if (lane == 0) scales[b] = s.scale;
      for (std::uint32_t j = lane; j < len; j += 32) convert<Fmt, kEf>(ef_input<kEf>(g, r, begin + j), r, begin + j, s, codes);
    }
  }
}

template <class Fmt, class T>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const float* __restrict__ scales, const std::uint8_t* __restrict__ codes, std::size_t n,
                  std::uint32_t block, Out<T> out, Combine c, const std::uint32_t* gate, bool vec) {
  decode_elements<4>(  // the codes start 4-byte aligned (after the scales), so 4 codes are one word
      n, out, c, gate, vec,
      [&](std::size_t u, float* d) {
        const std::size_t i = 4 * u;
        const std::uint32_t word = reinterpret_cast<const std::uint32_t*>(codes)[u];
        const std::size_t b0 = i / block;
        if ((i + 3) / block == b0) {
          const float s = scales[b0];
#pragma unroll
          for (int e = 0; e < 4; ++e) d[e] = fp8_value<Fmt>((word >> (8 * e)) & 0xFFu, s);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) d[e] = fp8_value<Fmt>((word >> (8 * e)) & 0xFFu, scales[(i + e) / block]);
        }
      },
      [&](std::size_t i) { return fp8_value<Fmt>(codes[i], scales[i / block]); });
}

template <class Fmt, class G>
void encode_launch(const G* g, float* r, std::size_t n, std::uint32_t block, float* scales, std::uint8_t* codes,
                   const Blob32& head, Stream stream) {
  const unsigned grid = grid_for(Fp8Layout::blocks(fp8_param(Fmt::exp_bits, block), n) * 32);
  if (r)
    encode_kernel<Fmt, true><<<grid, kThreads, 0, stream>>>(g, r, n, block, scales, codes, head);
  else
    encode_kernel<Fmt, false><<<grid, kThreads, 0, stream>>>(g, r, n, block, scales, codes, head);
  GZ_LAUNCH_CHECK(encode_kernel);
}

template <class Fmt>
void decode_launch(const float* scales, const std::uint8_t* codes, std::size_t n, std::uint32_t block,
                   const DecodeOut& out, Combine c, const std::uint32_t* gate, Stream stream) {
  const bool vec = aligned16(out) && (reinterpret_cast<std::uintptr_t>(codes) & 3u) == 0;
  with_out(out, [&](auto o) {
    decode_kernel<Fmt><<<decode_grid<4>(n, vec), kThreads, 0, stream>>>(scales, codes, n, block, o, c, gate, vec);
    GZ_LAUNCH_CHECK(decode_kernel);
  });
}

}  // namespace

template <class G>
void fp8_encode(const G* g, float* r, std::size_t n, std::uint32_t exp_bits, std::uint32_t block, float* scales,
                std::uint8_t* codes, const Blob32& head, Stream stream) {
  GZ_ENFORCE((exp_bits == 4 || exp_bits == 5) && block >= 1, "fp8: exponent bits ", exp_bits, ", block ", block);
  if (n == 0) {
    write_blob(head, stream);
    return;
  }
  if (exp_bits == 4)
    encode_launch<Fp8E4M3>(g, r, n, block, scales, codes, head, stream);
  else
    encode_launch<Fp8E5M2>(g, r, n, block, scales, codes, head, stream);
}

void fp8_decode(const float* scales, const std::uint8_t* codes, std::size_t n, std::uint32_t exp_bits,
                std::uint32_t block, const DecodeOut& out, Combine c, const std::uint32_t* gate, Stream stream) {
  GZ_ENFORCE((exp_bits == 4 || exp_bits == 5) && block >= 1, "fp8: exponent bits ", exp_bits, ", block ", block);
  if (n == 0) return;
  if (exp_bits == 4)
    decode_launch<Fp8E4M3>(scales, codes, n, block, out, c, gate, stream);
  else
    decode_launch<Fp8E5M2>(scales, codes, n, block, out, c, gate, stream);
}

#define GZ_INSTANTIATE(G)                       \
  template void fp8_encode(const G*, float*, std::size_t, std::uint32_t, \
                std::uint32_t, float*, std::uint8_t*, const Blob32&, Stream);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE

}  // namespace gz::kernels::cuda
