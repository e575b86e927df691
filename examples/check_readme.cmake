# Fails unless README.md quotes examples/compress_gradient.cc verbatim, so the
# example in the README is always the one the build compiles and runs.
file(READ "${SOURCE_DIR}/README.md" readme)
file(READ "${SOURCE_DIR}/examples/compress_gradient.cc" example)
string(FIND "${readme}" "${example}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "README.md does not contain examples/compress_gradient.cc verbatim: update the README's C++ example")
endif()
