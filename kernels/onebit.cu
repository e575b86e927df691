// CUDA launches of the onebit codec over kernels/onebit.h.
//
// The block means must have the same bits as the CPU loop, so a warp sums a
// block exactly in the order kernels/onebit.h defines: lane l adds, in
// double and in index order, the elements at positions = l (mod 32) of the
// block, then a __shfl_down_sync halving tree (off = 16..1) merges the lanes.
//
// block % 32 == 0 (the default 512 included): one fused pass, a warp per
// block. The block's values stay in registers (up to kMaxChunks x 32
// elements; larger blocks re-read them, from L1/L2), the scales are broadcast
// with a shuffle, and each 32-element chunk becomes one sign word by ballot,
// written with the residual.
// Other block sizes make sign words straddle blocks: a first launch computes
// the scales (same warp sum), a second turns each 32-element word into a
// ballot, looking up every element's block scale.
#include "kernels/cuda_common.cuh"
#include "kernels/error_feedback.h"
#include "kernels/onebit.h"

namespace gz::kernels::cuda {
namespace {

using namespace detail;

constexpr int kMaxChunks = 16;  // registers hold blocks of up to 512 elements

// The halving tree of kernels/onebit.h across the warp; lane 0 ends with the total.
__device__ __forceinline__ OnebitPartial warp_tree(OnebitPartial p) {
#pragma unroll
  for (int off = kOnebitLanes / 2; off > 0; off /= 2) {
    OnebitPartial o;
    o.pos_sum = __shfl_down_sync(kFullMask, p.pos_sum, off);
    o.neg_sum = __shfl_down_sync(kFullMask, p.neg_sum, off);
    o.neg_count = __shfl_down_sync(kFullMask, p.neg_count, off);
    p.merge(o);
  }
  return p;
}

// Scales of a block from lane 0's total, broadcast to the warp.
__device__ __forceinline__ OnebitScales warp_scales(const OnebitPartial& p, std::uint32_t len) {
  OnebitScales s = onebit_scales(p, len);  // meaningful in lane 0
  s.pos = __shfl_sync(kFullMask, s.pos, 0);
  s.neg = __shfl_sync(kFullMask, s.neg, 0);
  return s;
}

// Sum of one block over the warp, lane-striped, loading from memory.
template <bool kEf, class G>
__device__ __forceinline__ OnebitPartial block_partial(const G* g, const float* r, std::size_t begin,
                                                       std::uint32_t len, unsigned lane) {
  OnebitPartial p;
  for (std::uint32_t j = lane; j < len; j += 32) p.add(ef_input<kEf>(g, r, begin + j));
  return p;
}

// Fused pass, block % 32 == 0: a warp per block (grid-stride over blocks).
template <bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    encode_fused_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, std::uint32_t block,
                        OnebitScales* __restrict__ scales, std::uint32_t* __restrict__ bits, Blob32 head) {
  store_blob(head);
  const unsigned lane = threadIdx.x & 31;
  const std::size_t blocks = onebit_blocks(n, block);
  for (std::size_t b = global_thread() / 32; b < blocks; b += grid_threads() / 32) {
    const std::size_t begin = b * block;
    const std::uint32_t len = static_cast<std::uint32_t>(n - begin < block ? n - begin : block);
    const std::uint32_t chunks = (len + 31) / 32;
    const std::size_t word0 = begin / 32;
    if (chunks <= kMaxChunks) {
      float v[kMaxChunks];
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c)
        if (c * 32 + lane < len) v[c] = ef_input<kEf>(g, r, begin + c * 32 + lane);
      OnebitPartial p;
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c)
        if (c * 32 + lane < len) p.add(v[c]);
      const OnebitScales s = warp_scales(warp_tree(p), len);
      if (lane == 0) store_pair(scales, b, s);
      std::uint32_t my_word = 0;  // lane c keeps word c, so the words go out in one store
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        if (c < static_cast<int>(chunks)) {
          const bool valid = c * 32 + lane < len;
          const bool neg = valid && onebit_is_negative(v[c]);
          if (kEf && valid) r[begin + c * 32 + lane] = ef_residual(v[c], onebit_value(neg, s));
          const std::uint32_t word = __ballot_sync(kFullMask, neg);
          if (lane == static_cast<unsigned>(c)) my_word = word;
        }
      }
      if (lane < chunks) bits[word0 + lane] = my_word;
    } else {
      const OnebitScales s = warp_scales(warp_tree(block_partial<kEf>(g, r, begin, len, lane)), len);
      if (lane == 0) store_pair(scales, b, s);
      for (std::uint32_t c = 0; c < chunks; ++c) {
        const std::uint32_t j = c * 32 + lane;
        const bool valid = j < len;
        const float v = valid ? ef_input<kEf>(g, r, begin + j) : 0.0f;
        const bool neg = valid && onebit_is_negative(v);
        if (kEf && valid) r[begin + j] = ef_residual(v, onebit_value(neg, s));
        const std::uint32_t word = __ballot_sync(kFullMask, neg);
        if (lane == 0) bits[word0 + c] = word;
      }
    }
  }
}

// Two-pass path, any block size. Pass 1: a warp per block, scales only.
template <bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    scales_kernel(const G* __restrict__ g, const float* __restrict__ r, std::size_t n, std::uint32_t block,
                  OnebitScales* __restrict__ scales) {
  const unsigned lane = threadIdx.x & 31;
  const std::size_t blocks = onebit_blocks(n, block);
  for (std::size_t b = global_thread() / 32; b < blocks; b += grid_threads() / 32) {
    const std::size_t begin = b * block;
    const std::uint32_t len = static_cast<std::uint32_t>(n - begin < block ? n - begin : block);
    const OnebitScales s = warp_scales(warp_tree(block_partial<kEf>(g, r, begin, len, lane)), len);
    if (lane == 0) store_pair(scales, b, s);
  }
}

// Pass 2: a warp per 32-element sign word; each element looks up its block.
template <bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    words_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, std::uint32_t block,
                 const OnebitScales* __restrict__ scales, std::uint32_t* __restrict__ bits, Blob32 head) {
  store_blob(head);
  const unsigned lane = threadIdx.x & 31;
  const std::size_t words = onebit_words(n);
  for (std::size_t w = global_thread() / 32; w < words; w += grid_threads() / 32) {
    const std::size_t i = w * 32 + lane;
    const bool valid = i < n;
    bool neg = false;
    if (valid) {
      const float v = ef_input<kEf>(g, r, i);
      neg = onebit_is_negative(v);
      if constexpr (kEf) r[i] = ef_residual(v, onebit_value(neg, load_pair(scales, i / block)));
    }
    const std::uint32_t word = __ballot_sync(kFullMask, neg);
    if (lane == 0) bits[w] = word;
  }
}

// Decode: 4 consecutive elements per thread (four of out, 4 bits of a word).
template <class T>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const OnebitScales* __restrict__ scales, const std::uint32_t* __restrict__ bits, std::size_t n,
                  std::uint32_t block, Out<T> out, Combine c, const std::uint32_t* gate, bool vec) {
  decode_elements<4>(
      n, out, c, gate, vec,
      [&](std::size_t u, float* d) {
        const std::size_t i = 4 * u;
        const std::uint32_t nib = bits[i / 32] >> (i % 32);  // i % 32 <= 28: the 4 bits are in this word
        const std::size_t b0 = i / block;
        if ((i + 3) / block == b0) {
          const OnebitScales s = load_pair(scales, b0);
#pragma unroll
          for (int e = 0; e < 4; ++e) d[e] = onebit_value((nib >> e) & 1u, s);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) d[e] = onebit_value((nib >> e) & 1u, load_pair(scales, (i + e) / block));
        }
      },
      [&](std::size_t i) { return onebit_value((bits[i / 32] >> (i % 32)) & 1u, load_pair(scales, i / block)); });
}

}  // namespace

template <class G>
void onebit_encode(const G* g, float* r, std::size_t n, std::uint32_t block, OnebitScales* scales,
                   std::uint32_t* bits, const Blob32& head, Stream stream) {
  GZ_ENFORCE(block >= 1, "onebit block size must be >= 1");
  if (n == 0) {
    write_blob(head, stream);
    return;
  }
  const std::size_t blocks = onebit_blocks(n, block);
  if (block % 32 == 0) {
    const unsigned grid = grid_for(blocks * 32);
    if (r)
      encode_fused_kernel<true><<<grid, kThreads, 0, stream>>>(g, r, n, block, scales, bits, head);
    else
      encode_fused_kernel<false><<<grid, kThreads, 0, stream>>>(g, r, n, block, scales, bits, head);
    GZ_LAUNCH_CHECK(encode_fused_kernel);
    return;
  }
  const unsigned grid1 = grid_for(blocks * 32);
  if (r)
    scales_kernel<true><<<grid1, kThreads, 0, stream>>>(g, r, n, block, scales);
  else
    scales_kernel<false><<<grid1, kThreads, 0, stream>>>(g, r, n, block, scales);
  GZ_LAUNCH_CHECK(scales_kernel);
  const unsigned grid2 = grid_for(onebit_words(n) * 32);
  if (r)
    words_kernel<true><<<grid2, kThreads, 0, stream>>>(g, r, n, block, scales, bits, head);
  else
    words_kernel<false><<<grid2, kThreads, 0, stream>>>(g, r, n, block, scales, bits, head);
  GZ_LAUNCH_CHECK(words_kernel);
}

void onebit_decode(const OnebitScales* scales, const std::uint32_t* bits, std::size_t n, std::uint32_t block,
                   const DecodeOut& out, Combine c, const std::uint32_t* gate, Stream stream) {
  GZ_ENFORCE(block >= 1, "onebit block size must be >= 1");
  if (n == 0) return;
  const bool vec = aligned16(out);
  with_out(out, [&](auto o) {
    decode_kernel<<<decode_grid<4>(n, vec), kThreads, 0, stream>>>(scales, bits, n, block, o, c, gate, vec);
    GZ_LAUNCH_CHECK(decode_kernel);
  });
}

#define GZ_INSTANTIATE(G)                       \
  template void onebit_encode(const G*, float*, std::size_t, std::uint32_t, \
                OnebitScales*, std::uint32_t*, const Blob32&, Stream);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE

}  // namespace gz::kernels::cuda
