// Error types thrown by gradzip, and the macros that build their messages.
//
// Every message starts with "[file:line]" so a failure names where it was
// detected (the file relative to the repository, never the build machine's
// folders); set_error_locations(false) leaves the location out, as the Python
// module does for users (docs/python.md). Two families, as in gloo:
//   - InvalidArgument / PayloadError: the caller's input is wrong (a bad spec
//     string, mismatched sizes, a malformed payload). Nothing was modified.
//   - IoError: a peer, the network or a device failed or timed out. Treat the
//     communicator as broken and rebuild it.
#pragma once

#include <atomic>
#include <cstring>
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

inline std::atomic<bool>& error_locations_flag() {
  static std::atomic<bool> on{true};
  return on;
}

// The repository-relative form of __FILE__. Compilers see absolute paths
// (CMake) or paths relative to the build folder (ccache's base_dir), with the
// machine's folders in front; this header's own path has the same front, so
// what precedes "common/error.h" in it is cut from the file's.
inline const char* source_path(const char* file) {
  constexpr const char* self = __FILE__;
  constexpr std::size_t tail = sizeof("common/error.h") - 1;
  const std::size_t len = std::strlen(self);
  if (len < tail || std::strcmp(self + len - tail, "common/error.h") != 0) return file;
  const std::size_t root = len - tail;
  return std::strncmp(file, self, root) == 0 ? file + root : file;
}

template <class E, class... Args>
[[noreturn]] void raise(const char* file, int line, Args&&... args) {
  if (!error_locations_flag().load(std::memory_order_relaxed)) throw E(concat(std::forward<Args>(args)...));
  throw E(concat("[", source_path(file), ":", line, "] ", std::forward<Args>(args)...));
}

}  // namespace detail

/// Whether error messages start with "[file:line] " (on by default). The
/// Python module turns it off unless GRADZIP_VERBOSE_ERRORS is set or it is a
/// debug build: an installed wheel's users get the message alone.
inline void set_error_locations(bool on) { detail::error_locations_flag().store(on, std::memory_order_relaxed); }
inline bool error_locations() { return detail::error_locations_flag().load(std::memory_order_relaxed); }
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
