// GZ_NCCL_CHECK: a failed NCCL call becomes gz::IoError naming the call, the
// file and line, and NCCL's error string. ncclInProgress (a non-blocking
// communicator still working) is not a failure; callers wait for it.
#pragma once

#include <nccl.h>

#include "common/error.h"

#define GZ_NCCL_CHECK(call)                                                                  \
  do {                                                                                       \
    const ncclResult_t gz_nccl_res_ = (call);                                                \
    if (gz_nccl_res_ != ncclSuccess && gz_nccl_res_ != ncclInProgress)                       \
      GZ_THROW(::gz::IoError, #call " failed: ", ncclGetErrorString(gz_nccl_res_));          \
  } while (0)
