// How a decode writes what it decoded into its output, on the CPU and the GPU.
//
// For every element i of the range a decode covers, with d the decoded value:
//   accumulate:  out[i] = out[i] + d          overwrite:  out[i] = d
// and then, when scale != 1, out[i] = out[i] * scale: two roundings, in this
// order. A sum of payloads is the first one decoded with overwrite and the rest
// accumulated, the average's 1/P folded into the last one, so that no pass
// zeroes the output first and none scales it after. With scale == 1 nothing is
// multiplied (a -0 stays -0, a NaN keeps its payload).
//
// Sparse payloads (top-k) have no d for the elements they do not name: there an
// overwrite writes +0 and an accumulate leaves out[i] as it is (both then
// scaled when scale != 1).
#pragma once

#include <type_traits>

#include "kernels/hd.h"

namespace gz::kernels {

struct Combine {
  bool accumulate = true;
  float scale = 1.0f;

  GZ_HD bool scaled() const { return scale != 1.0f; }
};

/// The element function, for loops that fix the mode at compile time.
template <bool kAccumulate, bool kScaled>
GZ_HD float combine(float out, float d, float scale) {
  const float v = kAccumulate ? out + d : d;
  return kScaled ? v * scale : v;
}

/// The scaling half of the rule: v * c.scale, or v itself when scale == 1.
GZ_HD float apply_scale(float v, Combine c) { return c.scaled() ? v * c.scale : v; }

/// The same with the mode known only at run time (GPU kernels: the branch is
/// uniform across threads).
GZ_HD float combine(float out, float d, Combine c) { return apply_scale(c.accumulate ? out + d : d, c); }

/// Calls f(std::bool_constant<accumulate>{}, std::bool_constant<scaled>{}):
/// one instantiation of a CPU loop per mode, so each vectorizes.
template <class F>
void with_combine(Combine c, F&& f) {
  if (c.accumulate) {
    if (c.scaled())
      f(std::true_type{}, std::true_type{});
    else
      f(std::true_type{}, std::false_type{});
  } else {
    if (c.scaled())
      f(std::false_type{}, std::true_type{});
    else
      f(std::false_type{}, std::false_type{});
  }
}

}  // namespace gz::kernels
