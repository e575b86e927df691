"""Codecs on numpy arrays and torch tensors (their error-feedback state: error_feedback.py)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from . import _arrays
from ._core import Codec as _CoreCodec
from ._core import InvalidArgument, PayloadError, payload_info
from .error_feedback import ErrorFeedback

__all__ = ["Codec", "ErrorFeedback", "server_codec_arg"]


class Codec(_CoreCodec):
    """A gradient codec named by a spec string, on numpy arrays and torch tensors.

    ``encode`` compresses a float32, float16 or bfloat16 gradient (fused with
    error feedback; the residual is float32 whatever the gradient's dtype) into
    a uint8 payload; ``decode_accumulate`` adds a payload's values into a
    float32, float16 or bfloat16 output, so a sum of payloads needs no
    temporaries. A 16-bit gradient is widened exactly (its payload is the one
    of its float32 copy) and a 16-bit output gets the float sum rounded once,
    to nearest even. Arrays are used in place
    (DLPack, zero-copy): host arrays by the CPU loops, CUDA tensors by the CUDA
    kernels on torch's current stream. Wrong dtypes, devices, sizes, non-contiguous
    arrays and malformed payloads raise :class:`gradzip.InvalidArgument` /
    :class:`gradzip.PayloadError` (both ValueErrors).

    Example::

        codec = gradzip.Codec("topk:density=0.01")
        state = gradzip.ErrorFeedback()
        payload = codec.encode(grad, state)       # uint8, same framework/device as grad
        total = np.zeros_like(grad)
        codec.decode_accumulate(payload, total)   # total += decoded

    Spec strings: ``name[:key=value,...]``; :func:`gradzip.codec_info` lists the
    codecs and their keys (README.md, "Codecs", explains them). Every codec
    takes ``ef=on|off``.
    A Codec is not meant for concurrent calls from several threads (they are
    serialised by a lock).

    Scratch memory: the C++ codec takes a workspace on every call and never
    allocates (CUB's two phases); this wrapper keeps one per codec, per host and
    per (CUDA device, stream), grown when a larger call needs more. Calls on one
    stream are ordered, so reusing that stream's workspace is safe.
    """

    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        self._workspaces: Dict[Any, Any] = {}

    def _workspace(self, like: Any, n: int, stream: int, torch: Any) -> Any:
        """The cached workspace for a call on n elements of like's dtype beside `like` (None when none is needed)."""
        dtype = _arrays.dtype_name(like)
        need = self.workspace_bytes(n, "cpu" if torch is None else "cuda",
                                    dtype if dtype in ("float16", "bfloat16") else "float32")
        if need == 0:
            return None
        key = "cpu" if torch is None else (str(like.device), stream)
        ws = self._workspaces.get(key)
        if ws is None or _arrays.numel(ws) < need:
            ws = np.empty(need, dtype=np.uint8) if torch is None else torch.empty(need, dtype=torch.uint8,
                                                                                    device=like.device)
            self._workspaces[key] = ws
        return ws

    def encode(self, grad: Any, state: Optional[ErrorFeedback] = None, *, out: Any = None,
               step: Optional[int] = None) -> Any:
        """Compresses grad into a new payload (or into ``out``) and returns it.

        Args:
            grad: float32, float16 or bfloat16, contiguous; numpy array or torch
                tensor, CPU or CUDA.
            state: the buffer's :class:`ErrorFeedback` (required when the codec has
                error feedback; ignored otherwise). Its residual is updated in place
                and its step advances by one. A state that serves a collective is
                refused (InvalidArgument): the two keep different residuals.
            out: optional uint8 buffer of at least ``max_payload_bytes(n)`` bytes on
                grad's device, reused instead of allocating.
            step: the step that keys random draws (qsgd's stochastic rounding);
                default: the state's :attr:`ErrorFeedback.step` (0 without a state).

        Returns:
            The payload: a uint8 view of exactly the encoded bytes, in grad's
            framework and on its device.
        """
        grad = _arrays.as_input(grad, "grad")
        n = _arrays.numel(grad)
        residual = None
        if state is not None and not isinstance(state, ErrorFeedback):
            raise InvalidArgument(f"state must be a gradzip.ErrorFeedback, got {type(state).__name__}")
        if self.error_feedback:
            if state is None:
                raise InvalidArgument(
                    f"'{self.spec}' has error feedback on: pass an ErrorFeedback state "
                    f"(one per buffer), or use ef=off")
            residual = state._residual_for(self.spec, grad, n)
        elif state is not None:
            state._claim("codec")  # no residual, but its step keys the draws: a collective's state is refused
        if out is None:
            payload = _arrays.empty_like_bytes(grad, self.max_payload_bytes(n))
        else:
            payload = _arrays.as_input(out, "out")
            _arrays.check_writable(payload, "out")
        with _arrays.cuda_call(grad) as (stream, torch):
            workspace = self._workspace(grad, n, stream, torch)
            if step is None:
                step = 0 if state is None else state._step
            nbytes = self.encode_into(grad, residual, payload, stream=stream, workspace=workspace, step=step)
        if state is not None:
            state._step += 1
        return payload.reshape(-1)[:nbytes]

    def decode_accumulate(self, payload: Any, out: Any) -> None:
        """Adds the decoded payload into out (float32, float16 or bfloat16, contiguous, on
        the payload's device). A 16-bit out gets ``round(out + decoded)``: one rounding.

        Raises PayloadError, leaving out untouched, when the payload is malformed or
        was made by another codec or for another element count.
        """
        payload = _arrays.as_input(payload, "payload")
        out = _arrays.as_input(out, "out")
        _arrays.check_writable(out, "out")
        with _arrays.cuda_call(out) as (stream, torch):
            workspace = self._workspace(out, _arrays.numel(out), stream, torch)
            self.decode_accumulate_into(payload, out, stream=stream, workspace=workspace)

    def decode(self, payload: Any, n: Optional[int] = None, *, max_n: Optional[int] = None) -> Any:
        """Returns the decoded payload as a new float32 array of n elements (in the
        payload's framework and on its device).

        The array is allocated before the payload is decoded, so its size comes
        from the caller, never from the payload alone: pass ``n`` (the element
        count; the payload must hold exactly that many), or ``max_n`` to take the
        count from a host payload's header when it is at most ``max_n``.

        Raises:
            InvalidArgument: neither n nor max_n, or a CUDA payload without n.
            PayloadError: the payload is malformed, claims more than max_n
                elements, or holds another count than n.
        """
        payload = _arrays.as_input(payload, "payload")
        if n is None:
            if max_n is None:
                raise InvalidArgument(
                    "decode needs n (the element count) or max_n (the most elements to allocate for): "
                    "a payload's header alone does not decide how much memory to allocate")
            if _arrays.is_cuda(payload):
                raise InvalidArgument("decode of a CUDA payload needs n (the element count)")
            host = payload.cpu() if _arrays.is_torch(payload) else payload
            n = int(payload_info(host)["count"])
            if n > max_n:
                raise PayloadError(f"the payload claims {n} elements, more than max_n={max_n}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise InvalidArgument(f"n must be an element count (an integer >= 0), got {n!r}")
        out = _arrays.zeros_like_f32(payload, n)
        self.decode_accumulate(payload, out)
        return out

    def __reduce__(self) -> Any:
        return (type(self), (self.spec,))


def server_codec_arg(server_codec: Optional[str]) -> Optional[str]:
    """A ``server_codec`` argument as every entry point takes it (the hook,
    BlockMomentum, the backend's Policy, CompressedAdamW/SGD,
    Communicator.allreduce), checked: None, the engine's default for the
    codec (fp16 for onebit, the codec itself otherwise); ``"same"``, the
    codec itself; anything else, a spec, returned canonical. The engine
    resolves it (``_core.server_codec_spec(codec, given)``, C++'s
    server_codec_config), so the meaning is one everywhere."""
    if server_codec is None or server_codec == "same":
        return server_codec
    if not isinstance(server_codec, str):
        raise InvalidArgument(f"server_codec must be None, 'same' or a codec spec, got {server_codec!r}")
    return Codec(server_codec).spec
