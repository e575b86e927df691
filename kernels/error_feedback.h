// The error-feedback rule shared by every codec:
//   v = g + r;  payload = Q(v);  r_new = v - D(payload)
// so that D(payload) + r_new == g + r_old (to rounding).
#pragma once

#include "kernels/hd.h"

namespace gz::kernels {

/// New residual after sending `sent` for input `v`. A non-finite difference
/// (the gradient itself was inf/NaN, or its block's scale was) is dropped
/// rather than carried: one overflowed step must not poison every later step.
/// The inf/NaN still travels in the payload so loss scalers see it.
GZ_HD float ef_residual(float v, float sent) {
  const float r = v - sent;
  return keep_if(!is_nonfinite(r), r);
}

}  // namespace gz::kernels
