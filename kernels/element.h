// Gradient element types (common/dtype.h) on the host and the device: loads
// widen exactly to float, stores round float to nearest even. The codecs'
// math is float; only the load of an encode's input (cpu_loops.h input /
// input8, cuda_common.cuh ef_input) and the store of a decode's output go
// through these, so one loop serves every element type.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/dtype.h"
#include "kernels/cast.h"
#include "kernels/hd.h"

namespace gz::kernels {

/// An IEEE binary16 element as stored: its own type, so that templates and
/// overloads tell it from bfloat16 and from an integer.
struct Half {
  std::uint16_t bits;
};
/// A bfloat16 element as stored.
struct BFloat16 {
  std::uint16_t bits;
};

/// The exact float value of an element.
GZ_HD float to_float(float v) { return v; }
GZ_HD float to_float(Half h) { return half_to_float(h.bits); }
GZ_HD float to_float(BFloat16 b) { return bf16_to_float(b.bits); }

/// `v` rounded to T, to nearest even; a finite value beyond T's range becomes
/// inf (IEEE conversion, as torch's .to() does), NaN stays NaN (quieted).
template <class T>
GZ_HD T from_float(float v) {
  if constexpr (std::is_same_v<T, Half>)
    return Half{half_from_float_rne(v)};
  else if constexpr (std::is_same_v<T, BFloat16>)
    return BFloat16{bf16_from_float_rne(v)};
  else
    return v;
}

template <class T>
inline constexpr Dtype dtype_of = std::is_same_v<T, Half>       ? Dtype::Float16
                                  : std::is_same_v<T, BFloat16> ? Dtype::BFloat16
                                                                : Dtype::Float32;

/// f(static_cast<T*>(p)) with T the element type `d` names (const kept):
/// the one switch from a run-time dtype to a typed loop.
template <class P, class F>
decltype(auto) with_elements(Dtype d, P* p, F&& f) {
  constexpr bool kConst = std::is_const_v<P>;
  auto as = [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Ptr = std::conditional_t<kConst, const T*, T*>;
    return f(static_cast<Ptr>(p));
  };
  switch (d) {
    case Dtype::Float16: return as(std::type_identity<Half>{});
    case Dtype::BFloat16: return as(std::type_identity<BFloat16>{});
    case Dtype::Float32: break;
  }
  return as(std::type_identity<float>{});
}

}  // namespace gz::kernels

/// X(T) for each gradient element type: explicit instantiations of the loops.
#define GZ_FOR_EACH_GRAD(X) X(float) X(Half) X(BFloat16)
