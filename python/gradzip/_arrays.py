"""Framework plumbing for arrays: numpy and torch, on the CPU or CUDA.

gradzip's C++ core reads and writes arrays in place through DLPack; this
module only allocates new arrays in the caller's framework (so a torch CUDA
gradient gets a torch CUDA payload from torch's caching allocator) and finds
the CUDA stream and device a call must run on. torch is never imported here:
it is used only when the caller already has it loaded.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Optional, Tuple

import numpy as np

from ._core import InvalidArgument


def _torch() -> Any:
    return sys.modules.get("torch")


def is_torch(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def is_cuda(x: Any) -> bool:
    return is_torch(x) and x.is_cuda


def numel(x: Any) -> int:
    if is_torch(x):
        return x.numel()
    if isinstance(x, np.ndarray):
        return int(x.size)
    raise InvalidArgument(f"expected a numpy array or a torch tensor, got {type(x).__name__}")


def check_writable(x: Any, what: str) -> None:
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise InvalidArgument(f"{what} is a read-only numpy array; gradzip writes into it")


def as_input(x: Any, what: str) -> Any:
    """Accepts numpy arrays, torch tensors and bytes-like payloads (as numpy views)."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        return np.frombuffer(x, dtype=np.uint8)
    if is_torch(x):
        return x.detach()  # a view; DLPack refuses tensors that require grad
    if isinstance(x, np.ndarray) or hasattr(x, "__dlpack__"):
        return x
    raise InvalidArgument(f"{what} must be a numpy array or a torch tensor, got {type(x).__name__}")


def dtype_name(x: Any) -> str:
    """The element type's name as gradzip spells it ("float32", "float16", "bfloat16", ...)."""
    if is_torch(x):
        return str(x.dtype).replace("torch.", "")
    return np.dtype(x.dtype).name


def empty_like_bytes(like: Any, nbytes: int) -> Any:
    """An uninitialised uint8 array of nbytes in like's framework and device."""
    if is_torch(like):
        return _torch().empty(nbytes, dtype=_torch().uint8, device=like.device)
    return np.empty(nbytes, dtype=np.uint8)


def zeros_like_f32(like: Any, n: int) -> Any:
    """n float32 zeros in like's framework and device."""
    if is_torch(like):
        return _torch().zeros(n, dtype=_torch().float32, device=like.device)
    return np.zeros(n, dtype=np.float32)


def same_home(a: Any, b: Any) -> bool:
    """Whether a and b are of one framework and on one device."""
    if is_torch(a) != is_torch(b):
        return False
    return not is_torch(a) or a.device == b.device


def move_like(x: Any, like: Any) -> Any:
    """A float32 copy of x in like's framework and on its device (checkpoint restores only)."""
    t = _torch()
    if is_torch(like):
        src = x if is_torch(x) else t.from_numpy(np.ascontiguousarray(x))
        return src.detach().to(device=like.device, dtype=t.float32, copy=True).contiguous()
    if is_torch(x):
        return x.detach().to("cpu", dtype=t.float32).contiguous().numpy().copy()
    return np.array(x, dtype=np.float32, copy=True)


def all_finite(x: Any) -> bool:
    """Whether every value of x (numpy or torch, any device) is finite."""
    if is_torch(x):
        return bool(_torch().isfinite(x).all())
    return bool(np.isfinite(np.asarray(x)).all())


def copy_of(x: Any) -> Any:
    if is_torch(x):
        return x.detach().clone()
    return np.array(x, copy=True)


@contextlib.contextmanager
def cuda_call(x: Any) -> Iterator[Tuple[int, Optional[Any]]]:
    """For a CUDA tensor: makes its device current and yields (stream handle,
    torch module); for host arrays yields (0, None)."""
    if not is_cuda(x):
        yield 0, None
        return
    t = _torch()
    with t.cuda.device(x.device):
        yield t.cuda.current_stream(x.device).cuda_stream, t
