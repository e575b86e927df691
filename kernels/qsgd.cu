// CUDA launches of the qsgd codec over kernels/qsgd.h (the functions
// kernels/qsgd_cpu.cc loops over, so both give the same bits).
//
// bucket % 32 == 0 (the default 512 included): one fused pass, a warp per
// bucket. The bucket's values stay in registers (up to kMaxChunks x 32
// elements; larger buckets re-read them, from L1/L2); min, max and "any
// inf/NaN" are warp reductions (exact in any order), every lane then holds the
// scale; each 32-element chunk fills B code words, each the OR over the lanes
// of their codes shifted into place.
// Other bucket sizes let 32-element groups straddle buckets: a first launch
// computes the scales (same warp reductions), a second quantizes each group,
// every element looking up its bucket's scale.
#include "kernels/cuda_common.cuh"
#include "kernels/error_feedback.h"
#include "kernels/qsgd.h"

namespace gz::kernels::cuda {
namespace {

using namespace detail;

constexpr int kMaxChunks = 16;  // registers hold buckets of up to 512 elements

__device__ __forceinline__ std::uint32_t warp_or(std::uint32_t x) {
#if __CUDA_ARCH__ >= 800
  return __reduce_or_sync(kFullMask, x);
#else
  for (int off = 16; off > 0; off /= 2) x |= __shfl_xor_sync(kFullMask, x, off);
  return x;
#endif
}

// Min and max of the clamped values, and whether any value is inf or NaN,
// accumulated per lane, then over the warp; every lane ends with the scale.
struct Range {
  float lo = kQsgdClamp, hi = -kQsgdClamp;
  bool bad = false;
  __device__ __forceinline__ void add(float v) {
    bad |= is_nonfinite(v);
    const float c = qsgd_clamp(v);
    lo = select(c < lo, c, lo);
    hi = select(c > hi, c, hi);
  }
  __device__ __forceinline__ QsgdScale warp_scale(std::uint32_t bits) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      const float l = __shfl_xor_sync(kFullMask, lo, off), h = __shfl_xor_sync(kFullMask, hi, off);
      lo = select(l < lo, l, lo);
      hi = select(h > hi, h, hi);
    }
    return qsgd_scale(lo, hi, __any_sync(kFullMask, bad), bits);
  }
};

// The B words of the 32-element group `group`: lane l holds the level q of
// element 32 * group + l (0 for lanes past the end). Lane k < B stores word k,
// when it lies inside the stream.
__device__ __forceinline__ void store_group_words(std::uint32_t q, std::uint32_t bits, std::uint64_t group,
                                                  std::uint64_t total_words, std::uint32_t* __restrict__ words,
                                                  unsigned lane) {
  const unsigned p = lane * bits, w = p / 32, shift = p % 32;
  const std::uint32_t low = q << shift, high = shift + bits > 32 ? q >> (32 - shift) : 0u;
  std::uint32_t mine = 0;
  for (unsigned k = 0; k < bits; ++k) {
    const std::uint32_t word = warp_or((w == k ? low : 0u) | (w + 1 == k ? high : 0u));
    if (lane == k) mine = word;
  }
  const std::uint64_t at = group * bits + lane;
  if (lane < bits && at < total_words) words[at] = mine;
}

template <bool kEf>
__device__ __forceinline__ std::uint32_t quantize(float v, float* __restrict__ r, std::size_t i, QsgdScale s,
                                                  float inv, std::uint32_t levels, const QsgdRounding& rnd) {
  const std::uint32_t q = qsgd_level(v, s, inv, qsgd_dither(rnd.stochastic, rnd.seed, rnd.step, i), levels);
  if constexpr (kEf) r[i] = ef_residual(v, qsgd_value(q, s));
  return q;
}

// Fused pass, bucket % 32 == 0: a warp per bucket (grid-stride over buckets).
template <bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    encode_fused_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, std::uint32_t bits,
                        std::uint32_t bucket, QsgdRounding rnd, QsgdScale* __restrict__ scales,
                        std::uint32_t* __restrict__ words, Blob32 head) {
  store_blob(head);
  const unsigned lane = threadIdx.x & 31;
  const std::uint32_t param = qsgd_param(bits, bucket), levels = qsgd_levels(bits);
  const std::uint64_t total_words = QsgdLayout::words(param, n);
  const std::size_t buckets = QsgdLayout::buckets(param, n);
  for (std::size_t b = global_thread() / 32; b < buckets; b += grid_threads() / 32) {
    const std::size_t begin = b * bucket;
    const std::uint32_t len = static_cast<std::uint32_t>(n - begin < bucket ? n - begin : bucket);
    const std::uint32_t chunks = (len + 31) / 32;
    const std::uint64_t group0 = begin / 32;
    if (chunks <= kMaxChunks) {
      float v[kMaxChunks];
      Range range;
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c)
        if (c * 32 + lane < len) range.add(v[c] = ef_input<kEf>(g, r, begin + c * 32 + lane));
      const QsgdScale s = range.warp_scale(bits);
      const float inv = qsgd_inverse(s.unit);
      if (lane == 0) store_pair(scales, b, s);
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        if (c < static_cast<int>(chunks)) {
          const std::size_t i = begin + c * 32 + lane;
          const std::uint32_t q = c * 32 + lane < len ? quantize<kEf>(v[c], r, i, s, inv, levels, rnd) : 0u;
          store_group_words(q, bits, group0 + c, total_words, words, lane);
        }
      }
    } else {
      Range range;
      for (std::uint32_t j = lane; j < len; j += 32) range.add(ef_input<kEf>(g, r, begin + j));
      const QsgdScale s = range.warp_scale(bits);
      const float inv = qsgd_inverse(s.unit);
      if (lane == 0) store_pair(scales, b, s);
      for (std::uint32_t c = 0; c < chunks; ++c) {
        const std::uint32_t j = c * 32 + lane;
        const std::uint32_t q = j < len ? quantize<kEf>(ef_input<kEf>(g, r, begin + j), r, begin + j, s, inv, levels, rnd)
                                        : 0u;
        store_group_words(q, bits, group0 + c, total_words, words, lane);
      }
    }
  }
}

// Two-pass path, any bucket size. Pass 1: a warp per bucket, scales only.
template <bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    scales_kernel(const G* __restrict__ g, const float* __restrict__ r, std::size_t n, std::uint32_t bits,
                  std::uint32_t bucket, QsgdScale* __restrict__ scales) {
  const unsigned lane = threadIdx.x & 31;
  const std::size_t buckets = QsgdLayout::buckets(qsgd_param(bits, bucket), n);
  for (std::size_t b = global_thread() / 32; b < buckets; b += grid_threads() / 32) {
    const std::size_t begin = b * bucket;
    const std::uint32_t len = static_cast<std::uint32_t>(n - begin < bucket ? n - begin : bucket);
    Range range;
    for (std::uint32_t j = lane; j < len; j += 32) range.add(ef_input<kEf>(g, r, begin + j));
    const QsgdScale s = range.warp_scale(bits);
    if (lane == 0) store_pair(scales, b, s);
  }
}

// Pass 2: a warp per 32-element group; each element looks up its bucket's scale.
template <bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    groups_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, std::uint32_t bits,
                  std::uint32_t bucket, QsgdRounding rnd, const QsgdScale* __restrict__ scales,
                  std::uint32_t* __restrict__ words, Blob32 head) {
  store_blob(head);
  const unsigned lane = threadIdx.x & 31;
  const std::uint64_t total_words = QsgdLayout::words(qsgd_param(bits, bucket), n);
  const std::uint32_t levels = qsgd_levels(bits);
  const std::size_t groups = (n + 31) / 32;
  for (std::size_t grp = global_thread() / 32; grp < groups; grp += grid_threads() / 32) {
    const std::size_t i = grp * 32 + lane;
    std::uint32_t q = 0;
    if (i < n) {
      const QsgdScale s = load_pair(scales, i / bucket);
      q = quantize<kEf>(ef_input<kEf>(g, r, i), r, i, s, qsgd_inverse(s.unit), levels, rnd);
    }
    store_group_words(q, bits, grp, total_words, words, lane);
  }
}

// Decode: 4 consecutive elements per thread (four of out).
template <class T>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const QsgdScale* __restrict__ scales, const std::uint32_t* __restrict__ words, std::size_t n,
                  std::uint32_t bits, std::uint32_t bucket, Out<T> out, Combine c,
                  const std::uint32_t* gate, bool vec) {
  decode_elements<4>(
      n, out, c, gate, vec,
      [&](std::size_t u, float* d) {
        const std::size_t i = 4 * u;
        const std::size_t b0 = i / bucket;
        if ((i + 3) / bucket == b0) {
          const QsgdScale s = load_pair(scales, b0);
#pragma unroll
          for (int e = 0; e < 4; ++e) d[e] = qsgd_value(qsgd_code_at(words, i + e, bits), s);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            d[e] = qsgd_value(qsgd_code_at(words, i + e, bits), load_pair(scales, (i + e) / bucket));
        }
      },
      [&](std::size_t i) { return qsgd_value(qsgd_code_at(words, i, bits), load_pair(scales, i / bucket)); });
}

}  // namespace

template <class G>
void qsgd_encode(const G* g, float* r, std::size_t n, std::uint32_t bits, std::uint32_t bucket,
                 const QsgdRounding& rounding, QsgdScale* scales, std::uint32_t* words, const Blob32& head,
                 Stream stream) {
  GZ_ENFORCE(bits >= kQsgdMinBits && bits <= kQsgdMaxBits && bucket >= 1, "qsgd: bits ", bits, ", bucket ", bucket);
  if (n == 0) {
    write_blob(head, stream);
    return;
  }
  const std::size_t buckets = QsgdLayout::buckets(qsgd_param(bits, bucket), n);
  if (bucket % 32 == 0) {
    const unsigned grid = grid_for(buckets * 32);
    if (r)
      encode_fused_kernel<true><<<grid, kThreads, 0, stream>>>(g, r, n, bits, bucket, rounding, scales, words, head);
    else
      encode_fused_kernel<false><<<grid, kThreads, 0, stream>>>(g, r, n, bits, bucket, rounding, scales, words, head);
    GZ_LAUNCH_CHECK(encode_fused_kernel);
    return;
  }
  const unsigned grid1 = grid_for(buckets * 32);
  if (r)
    scales_kernel<true><<<grid1, kThreads, 0, stream>>>(g, r, n, bits, bucket, scales);
  else
    scales_kernel<false><<<grid1, kThreads, 0, stream>>>(g, r, n, bits, bucket, scales);
  GZ_LAUNCH_CHECK(scales_kernel);
  const unsigned grid2 = grid_for((n + 31) / 32 * 32);
  if (r)
    groups_kernel<true><<<grid2, kThreads, 0, stream>>>(g, r, n, bits, bucket, rounding, scales, words, head);
  else
    groups_kernel<false><<<grid2, kThreads, 0, stream>>>(g, r, n, bits, bucket, rounding, scales, words, head);
  GZ_LAUNCH_CHECK(groups_kernel);
}

void qsgd_decode(const QsgdScale* scales, const std::uint32_t* words, std::size_t n, std::uint32_t bits,
                 std::uint32_t bucket, const DecodeOut& out, Combine c, const std::uint32_t* gate, Stream stream) {
  GZ_ENFORCE(bits >= kQsgdMinBits && bits <= kQsgdMaxBits && bucket >= 1, "qsgd: bits ", bits, ", bucket ", bucket);
  if (n == 0) return;
  const bool vec = aligned16(out);
  with_out(out, [&](auto o) {
    decode_kernel<<<decode_grid<4>(n, vec), kThreads, 0, stream>>>(scales, words, n, bits, bucket, o, c, gate, vec);
    GZ_LAUNCH_CHECK(decode_kernel);
  });
}

#define GZ_INSTANTIATE(G)                       \
  template void qsgd_encode(const G*, float*, std::size_t, std::uint32_t, std::uint32_t, \
                const QsgdRounding&, QsgdScale*, std::uint32_t*, const Blob32&, Stream);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE

}  // namespace gz::kernels::cuda
