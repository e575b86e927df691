// CPU loops over the per-element functions in kernels/*.h. These are the
// executable specification of the CUDA launches in kernels/*.cu: for the same
// input both produce the same bits. The loops of the first codecs are declared
// here; later codecs declare theirs in their own header (qsgd.h, fp8.h), with
// the same conventions.
//
// Conventions, for every function here:
//   - `g` is the gradient (n floats). `r` is the error-feedback residual (n
//     floats, updated in place); pass nullptr to encode without feedback.
//   - decode functions decode elements [begin, end) of a payload into
//     out[0 .. end - begin) as kernels/combine.h says: add into out or
//     overwrite it, then scale. A sum of payloads decodes them tile by tile
//     into a small buffer that stays in cache (Codec::decode_sum).
//   - functions that need scratch memory take (void* ws, std::size_t& ws_bytes):
//     with ws == nullptr they only store the size they need and return.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/combine.h"
#include "kernels/element.h"
#include "kernels/onebit.h"
#include "kernels/topk.h"

namespace gz::kernels::cpu {

// ---- none: fp32 as is ------------------------------------------------------
/// out = g + r; r = 0 (nothing is lost).
template <class G>
void copy_encode(const G* g, float* r, std::size_t n, float* out);
/// out[i - begin] = combine(out[i - begin], in[i], c), i in [begin, end).
void copy_decode(const float* in, std::size_t begin, std::size_t end, float* out, Combine c);
/// out[i] = (in[0][i] + in[1][i] + ... + in[m-1][i]) * scale (the multiply
/// only when scale != 1), i < n, the additions in that order; `out` may be one
/// of the inputs. The uncompressed allreduce's reduction: one pass, m reads,
/// and out written without being read (stream_store).
void sum(const float* const* in, std::size_t m, std::size_t n, float scale, float* out);
/// dst[0..n) = src[0..n) with non-temporal stores where the CPU has them: a
/// result that goes back to memory anyway is not first read into the cache
/// (half of what writing it costs). Ends with a store fence.
void stream_store(const float* src, std::size_t n, float* dst);

// ---- gradient element types (T = float | Half | BFloat16, kernels/element.h)
/// out[i] = to_float(in[i]), i < n: exact.
template <class T>
void widen(const T* in, std::size_t n, float* out);
/// out[i] = from_float<T>(in[i]), i < n: round to nearest even.
template <class T>
void narrow(const float* in, std::size_t n, T* out);

// ---- fp16 / bf16 (Fmt = HalfFormat | BFloat16Format) -----------------------
template <class Fmt, class G>
void cast_encode(const G* g, float* r, std::size_t n, std::uint16_t* out);
template <class Fmt>
void cast_decode(const std::uint16_t* in, std::size_t begin, std::size_t end, float* out, Combine c);

// ---- onebit ---------------------------------------------------------------
/// scales: onebit_blocks(n, block) entries; bits: onebit_words(n) words.
template <class G>
void onebit_encode(const G* g, float* r, std::size_t n, std::uint32_t block, OnebitScales* scales,
                   std::uint32_t* bits);
void onebit_decode(const OnebitScales* scales, const std::uint32_t* bits, std::uint32_t block, std::size_t begin,
                   std::size_t end, float* out, Combine c);

// ---- top-k ----------------------------------------------------------------
/// Exact top-k by magnitude of v = g + r, fused with error feedback: writes
/// the k selected indices (strictly increasing) and their values, sets r to v
/// elsewhere and to 0 at the selected indices. k is clamped to n. Returns the
/// number of entries written (min(k, n)).
template <class G>
std::size_t topk_encode(void* ws, std::size_t& ws_bytes, const G* g, float* r, std::size_t n,
                        std::size_t k, std::uint32_t* idx, float* val);

/// DGC-style: sends every element whose magnitude reaches a threshold
/// estimated from a fixed sample. Returns the count, which lies in
/// [topk_sampled_min(k), topk_sampled_max(k)]: when the estimate would send
/// fewer or more, it falls back to the exact selection of k.
template <class G>
std::size_t topk_encode_sampled(void* ws, std::size_t& ws_bytes, const G* g, float* r, std::size_t n,
                                std::size_t k, std::uint32_t* idx, float* val);
inline std::size_t topk_sampled_min(std::size_t k) { return (k + 1) / 2; }
inline std::size_t topk_sampled_max(std::size_t k) { return k + k / 2; }

/// Elements [begin, end) of a payload of k entries (indices validated:
/// strictly increasing) combined into out[0 .. end - begin): named elements
/// take their value, the others follow combine.h's rule for sparse payloads.
void topk_decode(const std::uint32_t* idx, const float* val, std::size_t k, std::size_t begin, std::size_t end,
                 float* out, Combine c);

}  // namespace gz::kernels::cpu
