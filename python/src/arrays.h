// Checks on arrays handed in from Python (numpy, torch, anything with
// __dlpack__), turned into raw pointers for the C++ core. Every check raises
// gz::InvalidArgument (gradzip.InvalidArgument in Python) with a message that
// names the argument and what was wrong, before any work starts.
#pragma once

#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/stream.h"

namespace gzpy {

namespace nb = nanobind;

/// Read-only view of any array: float32 inputs and payloads.
using InArray = nb::ndarray<nb::ro>;
/// Writable view: residuals, outputs, payload buffers, workspaces.
using OutArray = nb::ndarray<>;

/// Where an array lives, as gradzip sees it.
struct Place {
  gz::Device device = gz::Device::Cpu;
  int device_id = 0;
  bool operator==(const Place&) const = default;
};
std::string to_string(const Place& p);

/// A checked, contiguous array.
struct Span {
  void* data = nullptr;
  std::size_t count = 0;  ///< elements
  Place place;
  gz::Dtype dtype = gz::Dtype::Float32;  ///< Elem::Grad: which of the three
  std::size_t bytes() const { return count * gz::dtype_bytes(dtype); }
};

/// Element types the bindings accept.
enum class Elem {
  F32,   ///< float32 (residuals)
  U8,    ///< uint8 (payloads, workspaces)
  Grad,  ///< a gradient: float32, float16 or bfloat16 (Span::dtype says which)
};

/// Checks dtype, contiguity and device (CPU, pinned host or CUDA); any shape
/// is accepted as long as it is C-contiguous (it is used flattened).
/// `what` names the argument in messages ("grad", "payload", ...).
Span check_array(const InArray& a, Elem elem, const char* what);
Span check_array(const OutArray& a, Elem elem, const char* what);

/// Throws unless `b` lives where `a` does.
void check_same_place(const Span& a, const char* a_name, const Span& b, const char* b_name);
/// Throws when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) overlap.
void check_disjoint(const Span& a, std::size_t a_bytes, const char* a_name, const Span& b, std::size_t b_bytes,
                    const char* b_name);

}  // namespace gzpy
