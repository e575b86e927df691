// GZ_CUDA_CHECK: turns a failed CUDA runtime call into gz::CudaError naming the
// call, file and line. Include only from code built with the CUDA headers.
#pragma once

#include <cuda_runtime_api.h>

#include "common/error.h"

#define GZ_CUDA_CHECK(call)                                                              \
  do {                                                                                   \
    const cudaError_t gz_err_ = (call);                                                  \
    if (gz_err_ != cudaSuccess)                                                          \
      GZ_THROW(::gz::CudaError, #call " failed: ", cudaGetErrorName(gz_err_), ": ",      \
               cudaGetErrorString(gz_err_));                                             \
  } while (0)

/// Checks the launch that was just issued (bad configuration, missing image).
#define GZ_CUDA_CHECK_LAUNCH(kernel_name) GZ_CUDA_CHECK(cudaPeekAtLastError())
