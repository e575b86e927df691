"""gradzip: gradient compression for data-parallel allreduce.

- :class:`Codec` compresses float32 gradients (numpy or torch, CPU or CUDA)
  into byte payloads with error feedback, and adds payloads back into a sum.
- :class:`ErrorFeedback` is the error-feedback state of one gradient buffer,
  for :meth:`Codec.encode` and for the :class:`Communicator`'s collectives.
- :mod:`gradzip.torch` plugs the codecs into PyTorch DDP as a communication hook.
- :class:`Communicator` (when the build has gradzip's transports) runs
  gradzip's own compressed allreduce over UCX or NCCL.

Errors: :class:`InvalidArgument` and :class:`PayloadError` are ValueErrors;
:class:`IoError` and :class:`CudaError` are RuntimeErrors; all derive from
:class:`GradzipError`. Messages say what is wrong; the C++ file and line
that found it are added in debug builds, with ``GRADZIP_VERBOSE_ERRORS=1`` or
after ``set_error_locations(True)``.
"""

from ._preload import preload as _preload

_preload()  # before _core: see _preload.py

from ._core import (
    BUILD,
    HEADER_BYTES,
    CudaError,
    GradzipError,
    InvalidArgument,
    IoError,
    PayloadError,
    __version__,
    canonical_spec,
    codec_info,
    codec_names,
    error_locations,
    expand_spec_grid,
    payload_info,
    set_error_locations,
    split_spec_list,
)
from .codec import Codec
from .error_feedback import ErrorFeedback

if BUILD["comm"]:  # gradzip's own transports (comm/transports/registry.h)
    from ._core import server_codec_spec, transport_available, transport_names
    from .comm import AllreduceState, Communicator  # AllreduceState: deprecated alias of ErrorFeedback

# Created in C++ under gradzip._core; shown as gradzip.<name> in tracebacks.
for _exc in (GradzipError, InvalidArgument, PayloadError, IoError, CudaError):
    _exc.__module__ = "gradzip"
del _exc

__all__ = [
    "BUILD",
    "HEADER_BYTES",
    "Codec",
    "CudaError",
    "ErrorFeedback",
    "GradzipError",
    "InvalidArgument",
    "IoError",
    "PayloadError",
    "__version__",
    "canonical_spec",
    "codec_info",
    "codec_names",
    "error_locations",
    "expand_spec_grid",
    "payload_info",
    "set_error_locations",
    "split_spec_list",
]
if BUILD["comm"]:
    __all__ += ["AllreduceState", "Communicator", "server_codec_spec", "transport_available", "transport_names"]

# The collective algorithms' registry (issue 23): names, descriptions and
# each one's cost formula, from C++ (comm/algorithms/registry.h).
if BUILD["comm"]:
    from ._core import algorithm_wire_cost, algorithms, allreduce_algorithm_names

    __all__ += ["algorithm_wire_cost", "algorithms", "allreduce_algorithm_names"]
