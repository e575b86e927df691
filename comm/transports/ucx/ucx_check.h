// GZ_UCX_CHECK: a failed UCX call becomes gz::IoError naming the call, the
// file and line, and UCX's status string.
#pragma once

#include <ucp/api/ucp.h>

#include "common/error.h"

#define GZ_UCX_CHECK(call)                                                                   \
  do {                                                                                       \
    const ucs_status_t gz_ucx_status_ = (call);                                              \
    if (gz_ucx_status_ != UCS_OK)                                                            \
      GZ_THROW(::gz::IoError, #call " failed: ", ucs_status_string(gz_ucx_status_));         \
  } while (0)
