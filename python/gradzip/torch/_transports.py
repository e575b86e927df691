"""The two transports of gradzip's torch entry points (the DDP hook and
BlockMomentum): either way the caller gets a :class:`gradzip.Communicator`
and runs the same C++ compressed allreduce through it; they differ only in
what carries its bytes.

- ``"torch"`` (_torch_transport): the process group itself, through its
  point-to-point calls (gloo on CPU, NCCL on GPU): no other connections.
- ``"gradzip"`` (_gradzip_transport): gradzip's own transports (UCX on
  CPU, NCCL on GPU), connected through torch's rendezvous store; or a
  communicator the caller made.
"""

from typing import Any, Optional

from . import _gradzip_transport, _torch_transport

TRANSPORTS = {"torch": _torch_transport, "gradzip": _gradzip_transport}


def check(transport: Any, communicator: Any) -> None:
    """Raises ValueError for an unknown transport, or a communicator given with transport='torch'."""
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; valid: {', '.join(TRANSPORTS)}")
    if transport == "torch" and communicator is not None:
        raise ValueError("a communicator is used only with transport='gradzip' (transport='torch' runs over "
                         "the process group itself)")


def connect(transport: str, process_group: Any, communicator: Any, timeout: Optional[float]) -> Any:
    """The communicator over `transport` for the ranks of `process_group` (None: WORLD). Collective."""
    return TRANSPORTS[transport].connect(process_group, communicator, timeout)
