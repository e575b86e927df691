// Where a CUDA decode writes (kernels/cuda.h), float or 16-bit. Free of the
// CUDA headers, so that the codec interface (compressors/codec.h) can name it
// in every build.
#pragma once

#include "common/dtype.h"

namespace gz::kernels::cuda {

/// Where a decode writes. For each element i < n, with d the decoded value:
///   float32 out:  out[i] = combine(out[i], d, c)
///   16-bit out:   out[i] = round(combine(a, d, c)), a the value an accumulate
///                 adds to: partial[i] when a float partial sum is given (a
///                 16-bit sum's last payload, the earlier ones summed in float),
///                 else out[i] widened.
/// One pass over out, and the CPU's bits: the CPU combines 16-bit outputs in a
/// float tile and rounds each element once (compressors/codec.cc).
struct DecodeOut {
  void* out = nullptr;
  Dtype dtype = Dtype::Float32;
  float* partial = nullptr;  ///< 16-bit only; sparse decodes add their entries into it
  float* scratch = nullptr;  ///< 16-bit only: n floats a sparse decode may use
};

}  // namespace gz::kernels::cuda
