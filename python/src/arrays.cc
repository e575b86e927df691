#include "arrays.h"

#include <optional>
#include <sstream>

#include "common/error.h"

namespace gzpy {
namespace {

// DLPack device types (dlpack.h): kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3.
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3;

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::F32: return "float32";
    case Elem::U8: return "uint8";
    case Elem::Grad: return "float32, float16 or bfloat16";
  }
  return "?";
}

// The gradient dtype of t, if it is one.
std::optional<gz::Dtype> grad_dtype(nb::dlpack::dtype t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 32) return gz::Dtype::Float32;
  if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 16) return gz::Dtype::Float16;
  if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) return gz::Dtype::BFloat16;
  return std::nullopt;
}

bool elem_matches(nb::dlpack::dtype t, Elem e) {
  if (t.lanes != 1) return false;
  if (e == Elem::F32) return grad_dtype(t) == gz::Dtype::Float32;
  if (e == Elem::Grad) return grad_dtype(t).has_value();
  return t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt) && t.bits == 8;
}

std::string dtype_name(nb::dlpack::dtype t) {
  std::ostringstream os;
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int: os << "int"; break;
    case nb::dlpack::dtype_code::UInt: os << "uint"; break;
    case nb::dlpack::dtype_code::Float: os << "float"; break;
    case nb::dlpack::dtype_code::Bfloat: os << "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: os << "complex"; break;
    case nb::dlpack::dtype_code::Bool: os << "bool"; break;
    default: os << "dtype-code-" << int(t.code) << "-"; break;
  }
  os << int(t.bits);
  if (t.lanes != 1) os << "x" << t.lanes;
  return os.str();
}

template <class Array>
Span check_impl(const Array& a, Elem elem, const char* what) {
  if (!a.is_valid()) GZ_THROW(gz::InvalidArgument, what, " is missing");
  if (!elem_matches(a.dtype(), elem))
    GZ_THROW(gz::InvalidArgument, what, " must be ", elem_name(elem), ", got ", dtype_name(a.dtype()));

  Span s;
  switch (a.device_type()) {
    case kDLCPU:
    case kDLCUDAHost: s.place = {gz::Device::Cpu, 0}; break;
    case kDLCUDA: s.place = {gz::Device::Cuda, a.device_id()}; break;
    default:
      GZ_THROW(gz::InvalidArgument, what, " is on an unsupported device (DLPack device type ", a.device_type(),
               "); gradzip takes CPU and CUDA arrays");
  }

  // C-contiguous, ignoring extents of 1 (their strides do not matter).
  std::size_t count = 1;
  for (std::size_t i = 0; i < a.ndim(); ++i) count *= a.shape(i);
  if (a.stride_ptr() != nullptr && count > 1) {
    std::int64_t expect = 1;
    for (std::size_t i = a.ndim(); i-- > 0;) {
      if (a.shape(i) != 1 && a.stride(i) != expect) {
        std::ostringstream shape, strides;
        for (std::size_t j = 0; j < a.ndim(); ++j) {
          shape << (j ? ", " : "") << a.shape(j);
          strides << (j ? ", " : "") << a.stride(j);
        }
        GZ_THROW(gz::InvalidArgument, what, " must be contiguous (C order); got shape (", shape.str(),
                 ") with strides (", strides.str(), ") in elements: pass .contiguous() / np.ascontiguousarray(...)");
      }
      expect *= static_cast<std::int64_t>(a.shape(i));
    }
  }
  s.data = const_cast<void*>(static_cast<const void*>(a.data()));
  s.count = count;
  s.dtype = grad_dtype(a.dtype()).value_or(gz::Dtype::Float32);
  if (count > 0 && s.data == nullptr) GZ_THROW(gz::InvalidArgument, what, " has a null data pointer");
  return s;
}

}  // namespace

std::string to_string(const Place& p) {
  return p.device == gz::Device::Cpu ? std::string("cpu") : "cuda:" + std::to_string(p.device_id);
}

Span check_array(const InArray& a, Elem elem, const char* what) { return check_impl(a, elem, what); }
Span check_array(const OutArray& a, Elem elem, const char* what) { return check_impl(a, elem, what); }

void check_same_place(const Span& a, const char* a_name, const Span& b, const char* b_name) {
  if (!(a.place == b.place))
    GZ_THROW(gz::InvalidArgument, b_name, " is on ", to_string(b.place), " but ", a_name, " is on ",
             to_string(a.place), "; both must be on the same device");
}

void check_disjoint(const Span& a, std::size_t a_bytes, const char* a_name, const Span& b, std::size_t b_bytes,
                    const char* b_name) {
  if (a_bytes == 0 || b_bytes == 0 || !(a.place == b.place)) return;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data), b0 = reinterpret_cast<std::uintptr_t>(b.data);
  if (a0 < b0 + b_bytes && b0 < a0 + a_bytes)
    GZ_THROW(gz::InvalidArgument, a_name, " and ", b_name, " overlap in memory; they must be separate buffers");
}

}  // namespace gzpy
