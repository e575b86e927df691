// CUDA launches over the per-element functions in kernels/*.h: the twins of
// the CPU loops in kernels/cpu.h, giving the same bits for the same input.
// Later codecs declare theirs in their own header (qsgd.h, fp8.h), with the
// same conventions.
// Host-callable without the CUDA headers (Stream is cudaStream_t).
//
// Conventions, for every function here (as in kernels/cpu.h):
//   - All pointers are device pointers; work is queued on `stream` and nothing
//     synchronizes the host unless the function says so. No allocation.
//   - `g` is the gradient (n floats), `r` the error-feedback residual (n
//     floats, updated in place; nullptr encodes without feedback).
//   - Decode functions write all n elements of a DecodeOut as
//     kernels/combine.h says (add or overwrite, then scale), like the CPU
//     loops; a 16-bit output in the same pass, rounded once. When `gate` is
//     non-null they do nothing unless *gate == 0 when they start (the payload
//     status word written by a validation launch earlier on the same stream).
//   - Full speed needs g, r, out and the payload body 16-byte aligned (a
//     cudaMalloc'd buffer is); other alignments take a scalar path, same bits.
//   - Functions that need scratch take (void* ws, std::size_t& ws_bytes, ...):
//     with ws == nullptr they only store the bytes they need and return.
//   - Errors: a failed launch or CUDA call throws gz::CudaError naming the
//     call, file and line.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/stream.h"
#include "kernels/combine.h"
#include "kernels/decode_out.h"
#include "kernels/element.h"
#include "kernels/onebit.h"

namespace gz::kernels::cuda {

/// 32 bytes that a launch also stores at `dst` (4-byte aligned) from its first
/// block, so a codec writes its payload header in the same kernel as the body.
/// dst == nullptr: nothing is written.
struct Blob32 {
  std::uint32_t words[8] = {};
  void* dst = nullptr;
};

/// Writes a Blob32 on its own (one tiny kernel).
void write_blob(const Blob32& blob, Stream stream);

/// Number of CUDA devices, 0 when there is none or no driver (never throws).
int device_count();

/// Copies one device word to the host. Synchronizes `stream`.
std::uint32_t fetch_word(const std::uint32_t* device_word, Stream stream);

// ---- gradient element types (T = float | Half | BFloat16) -------------------
/// The twins of cpu::widen and cpu::narrow. narrow does nothing when gate is
/// set and *gate != 0 (a decode whose payload failed validation).
template <class T>
void widen(const T* in, std::size_t n, float* out, Stream stream);
template <class T>
void narrow(const float* in, std::size_t n, T* out, const std::uint32_t* gate, Stream stream);

// ---- none: fp32 as is ------------------------------------------------------
/// out = g + r; r = 0 (or out = g without feedback).
template <class G>
void copy_encode(const G* g, float* r, std::size_t n, float* out, const Blob32& head, Stream stream);
/// out[i] = combine(out[i], in[i], c).
void copy_decode(const float* in, std::size_t n, const DecodeOut& out, Combine c, const std::uint32_t* gate, Stream stream);

// ---- fp16 / bf16 (Fmt = HalfFormat | BFloat16Format) -----------------------
template <class Fmt, class G>
void cast_encode(const G* g, float* r, std::size_t n, std::uint16_t* out, const Blob32& head, Stream stream);
template <class Fmt>
void cast_decode(const std::uint16_t* in, std::size_t n, const DecodeOut& out, Combine c, const std::uint32_t* gate,
                 Stream stream);

// ---- onebit ---------------------------------------------------------------
/// scales: onebit_blocks(n, block) entries; bits: onebit_words(n) words.
/// block % 32 == 0 runs one fused pass (a warp per block: lane sums, shuffle
/// tree, ballot, residual); other block sizes take two passes (scales, then
/// a warp per sign word), same bits.
template <class G>
void onebit_encode(const G* g, float* r, std::size_t n, std::uint32_t block, OnebitScales* scales,
                   std::uint32_t* bits, const Blob32& head, Stream stream);
void onebit_decode(const OnebitScales* scales, const std::uint32_t* bits, std::size_t n, std::uint32_t block,
                   const DecodeOut& out, Combine c, const std::uint32_t* gate, Stream stream);

// ---- top-k ----------------------------------------------------------------
/// Exact (or, with `sampled`, DGC-style) top-k by magnitude of v = g + r,
/// fused with error feedback; the twin of cpu::topk_encode /
/// cpu::topk_encode_sampled (same entries, same values, same residual).
///
/// Writes `count` entries into `body` as the wire format lays them out:
/// count u32 indices (strictly increasing), then count f32 values. The head
/// blob, if any, is written with the entries.
///   - exact: count = min(k, n), known on the host.
///   - sampled: count is decided on the device, within
///     [cpu::topk_sampled_min(k), cpu::topk_sampled_max(k)] or exactly k (the
///     exact fallback). It is stored at *count_out (a device pointer into the
///     workspace, valid once the stream reaches it); reading it on the host
///     needs a synchronization, so write the header after that (write_blob).
///     body must hold topk_sampled_max(k) entries (capped at n).
///
/// Workspace: two phases. ws == nullptr stores the bytes in ws_bytes and
/// returns. n < 2^32 (indices are u32).
///
/// How it runs (kernels/topk.cu): a one-block sample select gives a bound L
/// (kernels/topk.h), one streaming pass applies EF and compacts the indices
/// with key >= L in index order (decoupled look-back), then a radix select
/// over those candidates (or over the whole array when L missed) and an
/// ordered compaction of the winners. No host synchronization.
template <class G>
void topk_encode(void* ws, std::size_t& ws_bytes, const G* g, float* r, std::size_t n, std::size_t k,
                 bool sampled, std::uint32_t* body, const Blob32& head, const std::uint32_t** count_out,
                 Stream stream);

/// A payload of k entries combined into out[0..n) (combine.h's rule for sparse
/// payloads): overwrite zeroes out, then writes the entries; accumulate adds
/// them, then scales all of out when c.scaled(). Indices must be valid
/// (checked by an earlier launch that closes `gate` otherwise). A 16-bit out
/// takes one dense pass over out (plus passes over the k entries); a single
/// accumulate needs out.scratch (k floats).
void topk_decode(const std::uint32_t* idx, const float* val, std::size_t k, std::size_t n, const DecodeOut& out,
                 Combine c, const std::uint32_t* gate, Stream stream);

}  // namespace gz::kernels::cuda
