// Error types thrown by gradzip, and the macros that build their messages.
//
// Every message starts with "[file:line]" so a failure names where it was
// detected. Two families, as in gloo:
//   - InvalidArgument / PayloadError: the caller's input is wrong (a bad spec
//     string, mismatched sizes, a malformed payload). Nothing was modified.
//   - IoError: a peer, the network or a device failed or timed out. Treat the
//     communicator as broken and rebuild it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace gz {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The caller passed something invalid; no state was changed.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A payload failed validation; the output buffer was left untouched.
class PayloadError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

/// A transport, peer or device failed or timed out.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A CUDA or NCCL call failed.
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <class E, class... Args>
[[noreturn]] void raise(const char* file, int line, Args&&... args) {
  throw E(concat("[", file, ":", line, "] ", std::forward<Args>(args)...));
}

}  // namespace detail
}  // namespace gz

/// Throws `Type` with a "[file:line] ..." message built from the arguments.
#define GZ_THROW(Type, ...) ::gz::detail::raise<Type>(__FILE__, __LINE__, __VA_ARGS__)

/// Throws gz::InvalidArgument unless `cond` holds; the message names the condition.
#define GZ_ENFORCE(cond, ...)                                                   \
  do {                                                                          \
    if (!(cond)) GZ_THROW(::gz::InvalidArgument, "expected " #cond ": ", __VA_ARGS__); \
  } while (0)

/// Throws `Type` unless `cond` holds.
#define GZ_CHECK_AS(Type, cond, ...)                      \
  do {                                                    \
    if (!(cond)) GZ_THROW(Type, __VA_ARGS__);             \
  } while (0)

/// Binary comparisons that print both operands, e.g. GZ_ENFORCE_EQ(a, b, "sizes").
#define GZ_ENFORCE_OP_(a, b, op, ...)                                                    \
  do {                                                                                   \
    const auto& gz_a_ = (a);                                                             \
    const auto& gz_b_ = (b);                                                             \
    if (!(gz_a_ op gz_b_))                                                               \
      GZ_THROW(::gz::InvalidArgument, "expected " #a " " #op " " #b " (", gz_a_, " vs ", \
               gz_b_, "): ", __VA_ARGS__);                                               \
  } while (0)
#define GZ_ENFORCE_EQ(a, b, ...) GZ_ENFORCE_OP_(a, b, ==, __VA_ARGS__)
#define GZ_ENFORCE_LE(a, b, ...) GZ_ENFORCE_OP_(a, b, <=, __VA_ARGS__)
#define GZ_ENFORCE_LT(a, b, ...) GZ_ENFORCE_OP_(a, b, <, __VA_ARGS__)
#define GZ_ENFORCE_GE(a, b, ...) GZ_ENFORCE_OP_(a, b, >=, __VA_ARGS__)
