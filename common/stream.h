// A CUDA stream handle that host-only code can pass around without including
// the CUDA headers (the same typedef cuda_runtime_api.h makes).
#pragma once

struct CUstream_st;

namespace gz {

using Stream = CUstream_st*;

/// Where a buffer lives.
enum class Device : unsigned char { Cpu = 0, Cuda = 1 };

inline const char* to_string(Device d) { return d == Device::Cpu ? "cpu" : "cuda"; }

}  // namespace gz
