// CPU loops over the per-element functions in kernels/*.h. These are the
// executable specification of the CUDA launches in kernels/*.cu: for the same
// input both produce the same bits. The loops of the first codecs are declared
// here; later codecs declare theirs in their own header (qsgd.h, fp8.h), with
// the same conventions.
//
// Conventions, for every function here:
//   - `g` is the gradient (n floats). `r` is the error-feedback residual (n
//     floats, updated in place); pass nullptr to encode without feedback.
//   - decode functions *add* into `out` (out += decoded), never overwrite.
//   - functions that need scratch memory take (void* ws, std::size_t& ws_bytes):
//     with ws == nullptr they only store the size they need and return.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/onebit.h"
#include "kernels/topk.h"

namespace gz::kernels::cpu {

// ---- none: fp32 as is ------------------------------------------------------
/// out = g + r; r = 0 (nothing is lost).
void copy_encode(const float* g, float* r, std::size_t n, float* out);
/// out += in.
void add_accumulate(const float* in, std::size_t n, float* out);
/// out *= alpha.
void scale(float* out, std::size_t n, float alpha);

// ---- fp16 / bf16 (Fmt = HalfFormat | BFloat16Format) -----------------------
template <class Fmt>
void cast_encode(const float* g, float* r, std::size_t n, std::uint16_t* out);
template <class Fmt>
void cast_decode_accumulate(const std::uint16_t* in, std::size_t n, float* out);

// ---- onebit ---------------------------------------------------------------
/// scales: onebit_blocks(n, block) entries; bits: onebit_words(n) words.
void onebit_encode(const float* g, float* r, std::size_t n, std::uint32_t block, OnebitScales* scales,
                   std::uint32_t* bits);
void onebit_decode_accumulate(const OnebitScales* scales, const std::uint32_t* bits, std::size_t n,
                              std::uint32_t block, float* out);

// ---- top-k ----------------------------------------------------------------
/// Exact top-k by magnitude of v = g + r, fused with error feedback: writes
/// the k selected indices (strictly increasing) and their values, sets r to v
/// elsewhere and to 0 at the selected indices. k is clamped to n. Returns the
/// number of entries written (min(k, n)).
std::size_t topk_encode(void* ws, std::size_t& ws_bytes, const float* g, float* r, std::size_t n,
                        std::size_t k, std::uint32_t* idx, float* val);

/// DGC-style: sends every element whose magnitude reaches a threshold
/// estimated from a fixed sample. Returns the count, which lies in
/// [topk_sampled_min(k), topk_sampled_max(k)]: when the estimate would send
/// fewer or more, it falls back to the exact selection of k.
std::size_t topk_encode_sampled(void* ws, std::size_t& ws_bytes, const float* g, float* r, std::size_t n,
                                std::size_t k, std::uint32_t* idx, float* val);
inline std::size_t topk_sampled_min(std::size_t k) { return (k + 1) / 2; }
inline std::size_t topk_sampled_max(std::size_t k) { return k + k / 2; }

/// out[idx[j]] += val[j]. Indices must already be validated (< n).
void topk_decode_accumulate(const std::uint32_t* idx, const float* val, std::size_t k, float* out);

}  // namespace gz::kernels::cpu
