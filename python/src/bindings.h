// The parts of gradzip._core, one function per source file.
#pragma once

#include <nanobind/nanobind.h>

namespace gzpy {

void bind_codec(nanobind::module_& m);  // codec.cc
void bind_comm(nanobind::module_& m);   // comm.cc (when gz_comm is built)

}  // namespace gzpy
