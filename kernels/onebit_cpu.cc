// CPU loop of the onebit codec. Per block: pass 1 forms the 32 lane sums in the
// order kernels/onebit.h defines (vectorized across lanes), pass 2 writes the
// sign bits and the residual while the block is still in L1.
#include <algorithm>
#include <cstring>

#include "kernels/cpu.h"
#include "kernels/error_feedback.h"

namespace gz::kernels::cpu {
namespace {

constexpr int L = kOnebitLanes;

template <bool kEf>
inline float input(const float* g, const float* r, std::size_t i) {
  return kEf ? g[i] + r[i] : g[i];
}

// Pass 1: the block's scales, summed lane-striped then tree-reduced.
template <bool kEf>
OnebitScales block_scales(const float* g, const float* r, std::size_t begin, std::size_t len) {
  double pos[L] = {}, neg[L] = {};
  std::uint32_t cnt[L] = {};
  std::size_t j = 0;
  for (; j + L <= len; j += L) {
    for (int l = 0; l < L; ++l) {
      const float v = input<kEf>(g, r, begin + j + l);
      const bool is_neg = onebit_is_negative(v);
      const double x = static_cast<double>(v);
      pos[l] += is_neg ? 0.0 : x;
      neg[l] += is_neg ? x : 0.0;
      cnt[l] += is_neg ? 1u : 0u;
    }
  }
  OnebitPartial lane[L];
  for (int l = 0; l < L; ++l) {
    lane[l].pos_sum = pos[l];
    lane[l].neg_sum = neg[l];
    lane[l].neg_count = cnt[l];
  }
  for (int l = 0; j + l < len; ++l) lane[l].add(input<kEf>(g, r, begin + j + l));
  for (int off = L / 2; off > 0; off /= 2)
    for (int l = 0; l < off; ++l) lane[l].merge(lane[l + off]);
  return onebit_scales(lane[0], static_cast<std::uint32_t>(len));
}

// Pass 2 over elements [lo, hi) of one 32-bit sign word (bit b = element base+b).
template <bool kEf>
inline std::uint32_t sign_word(const float* g, float* r, std::size_t base, int lo, int hi, OnebitScales s) {
  std::uint32_t word = 0;
  for (int b = lo; b < hi; ++b) {
    const float v = input<kEf>(g, r, base + b);
    const bool is_neg = onebit_is_negative(v);
    if constexpr (kEf) r[base + b] = ef_residual(v, onebit_value(is_neg, s));
    word |= static_cast<std::uint32_t>(is_neg) << b;
  }
  return word;
}

template <bool kEf>
inline std::uint32_t full_sign_word(const float* g, float* r, std::size_t base, OnebitScales s) {
  std::uint32_t word = 0;
  for (int b = 0; b < 32; ++b) {
    const float v = input<kEf>(g, r, base + b);
    const bool is_neg = onebit_is_negative(v);
    if constexpr (kEf) r[base + b] = ef_residual(v, onebit_value(is_neg, s));
    word |= static_cast<std::uint32_t>(is_neg) << b;
  }
  return word;
}

template <bool kEf>
void encode(const float* g, float* r, std::size_t n, std::uint32_t block, OnebitScales* scales,
            std::uint32_t* bits) {
  std::memset(bits, 0, onebit_words(n) * sizeof(std::uint32_t));
  const std::size_t blocks = onebit_blocks(n, block);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t begin = b * block;
    const std::size_t end = std::min<std::size_t>(n, begin + block);
    const OnebitScales s = block_scales<kEf>(g, r, begin, end - begin);
    scales[b] = s;
    // Words may straddle blocks (when block % 32 != 0): OR each block's part in.
    for (std::size_t i = begin; i < end;) {
      const std::size_t w = i / 32, base = w * 32;
      const int lo = static_cast<int>(i - base);
      const int hi = static_cast<int>(std::min<std::size_t>(end - base, 32));
      bits[w] |= (lo == 0 && hi == 32) ? full_sign_word<kEf>(g, r, base, s) : sign_word<kEf>(g, r, base, lo, hi, s);
      i = base + hi;
    }
  }
}

inline void decode_word(std::uint32_t word, std::size_t base, int lo, int hi, OnebitScales s, float* out) {
  for (int b = lo; b < hi; ++b) out[base + b] += onebit_value((word >> b) & 1u, s);
}

inline void decode_full_word(std::uint32_t word, std::size_t base, OnebitScales s, float* out) {
  for (int b = 0; b < 32; ++b) out[base + b] += onebit_value((word >> b) & 1u, s);
}

}  // namespace

void onebit_encode(const float* g, float* r, std::size_t n, std::uint32_t block, OnebitScales* scales,
                   std::uint32_t* bits) {
  if (r)
    encode<true>(g, r, n, block, scales, bits);
  else
    encode<false>(g, r, n, block, scales, bits);
}

void onebit_decode_accumulate(const OnebitScales* scales, const std::uint32_t* bits, std::size_t n,
                              std::uint32_t block, float* out) {
  const std::size_t blocks = onebit_blocks(n, block);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t begin = b * block;
    const std::size_t end = std::min<std::size_t>(n, begin + block);
    const OnebitScales s = scales[b];
    for (std::size_t i = begin; i < end;) {
      const std::size_t w = i / 32, base = w * 32;
      const int lo = static_cast<int>(i - base);
      const int hi = static_cast<int>(std::min<std::size_t>(end - base, 32));
      if (lo == 0 && hi == 32)
        decode_full_word(bits[w], base, s, out);
      else
        decode_word(bits[w], base, lo, hi, s, out);
      i = base + hi;
    }
  }
}

}  // namespace gz::kernels::cpu
