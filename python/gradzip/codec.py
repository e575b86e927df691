"""Codecs on numpy arrays and torch tensors, and their error-feedback state."""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from . import _arrays
from ._core import Codec as _CoreCodec
from ._core import InvalidArgument, PayloadError, payload_info

__all__ = ["Codec", "ErrorFeedback"]

_STATE_VERSION = 1


class ErrorFeedback:
    """Error-feedback state of one gradient buffer: the residual that encode
    carries from one step to the next (``v = g + r; payload = Q(v); r = v - D(payload)``).

    Created empty; the first :meth:`Codec.encode` allocates the residual as
    zeros next to the gradient (same framework, same device) and binds the
    state to that codec spec and element count. Use one state per buffer.
    It also counts the encodes (:attr:`step`), which key the random draws of
    codecs that make any (qsgd's stochastic rounding).
    :meth:`state_dict` / :meth:`load_state_dict` carry it through a
    checkpoint, and a restored state continues bit-identically.
    """

    __slots__ = ("_residual", "_spec", "_n", "_pending", "_step")

    def __init__(self) -> None:
        self._residual: Any = None
        self._spec: Optional[str] = None
        self._n = 0
        self._pending = False  # restored, not yet placed next to a gradient
        self._step = 0

    @property
    def residual(self) -> Any:
        """The residual (n float32 values), or None before the first encode."""
        return self._residual

    @property
    def bound(self) -> bool:
        """Whether the state holds a residual (after an encode or a restore)."""
        return self._spec is not None

    @property
    def spec(self) -> Optional[str]:
        """The canonical spec of the codec the state is bound to."""
        return self._spec

    @property
    def step(self) -> int:
        """Encodes done with this state: the step the next encode draws its random numbers for."""
        return self._step

    def reset(self) -> None:
        """Forgets the residual: the next encode starts from zeros, for any codec and size."""
        self._residual = None
        self._spec = None
        self._n = 0
        self._pending = False
        self._step = 0

    def state_dict(self) -> Dict[str, Any]:
        """A copy of the state: ``{"version", "codec", "n", "residual", "step"}`` (residual
        in the framework and on the device it lives on; None when unbound)."""
        return {
            "version": _STATE_VERSION,
            "codec": self._spec,
            "n": self._n,
            "residual": None if self._residual is None else _arrays.copy_of(self._residual),
            "step": self._step,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned. The residual is copied: into
        the existing residual when the state is bound, else kept until the first
        encode, which moves it next to the gradient."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise InvalidArgument(
                f"not an ErrorFeedback state_dict (version {_STATE_VERSION}): {type(state).__name__}")
        spec, n, residual, step = state.get("codec"), state.get("n"), state.get("residual"), state.get("step", 0)
        if spec is None:
            self.reset()
            return
        if not isinstance(step, int) or step < 0:
            raise InvalidArgument(f"ErrorFeedback state_dict has an invalid step {step!r}")
        if not isinstance(n, int) or residual is None or _arrays.numel(residual) != n:
            raise InvalidArgument("ErrorFeedback state_dict is inconsistent: 'n' does not match the residual")
        if not isinstance(spec, str):
            raise InvalidArgument(f"ErrorFeedback state_dict: 'codec' must be a spec string, got {type(spec).__name__}")
        if not _arrays.all_finite(residual):
            # One NaN would reach every rank's result through the next payload.
            raise InvalidArgument("ErrorFeedback state_dict: the residual holds NaN or infinite values")
        if self.bound and (spec != self._spec or n != self._n):
            raise InvalidArgument(
                f"state is bound to {self._n} elements of '{self._spec}' but the state_dict holds {n} "
                f"elements of '{spec}'; call reset() first")
        if self.bound and not self._pending:
            src = _arrays.move_like(residual, self._residual).reshape(-1)
            if _arrays.is_torch(self._residual):
                self._residual.copy_(src)
            else:
                np.copyto(self._residual, src)
        else:
            self._residual = _arrays.copy_of(residual).reshape(-1)
            self._pending = True
        self._spec, self._n, self._step = spec, n, step

    def _residual_for(self, spec: str, grad: Any, n: int) -> Any:
        if not self.bound:
            self._residual = _arrays.zeros_like_f32(grad, n)
            self._spec, self._n = spec, n
            return self._residual
        if spec != self._spec or n != self._n:
            raise InvalidArgument(
                f"this ErrorFeedback holds the residual of {self._n} elements for '{self._spec}', but the "
                f"call has {n} elements for '{spec}': use one state per buffer, or reset() it")
        if not _arrays.same_home(self._residual, grad):
            if not self._pending:
                raise InvalidArgument(
                    "the residual lives on another framework or device than grad; "
                    "a state stays where its first gradient was")
            self._residual = _arrays.move_like(self._residual, grad)
        self._pending = False
        return self._residual

    def __repr__(self) -> str:
        if not self.bound:
            return "ErrorFeedback(unbound)"
        return f"ErrorFeedback(codec='{self._spec}', n={self._n})"


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
                and its step advances by one.
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
        if self.error_feedback:
            if state is None:
                raise InvalidArgument(
                    f"'{self.spec}' has error feedback on: pass an ErrorFeedback state "
                    f"(one per buffer), or use ef=off")
            if not isinstance(state, ErrorFeedback):
                raise InvalidArgument(f"state must be a gradzip.ErrorFeedback, got {type(state).__name__}")
            residual = state._residual_for(self.spec, grad, n)
        if out is None:
            payload = _arrays.empty_like_bytes(grad, self.max_payload_bytes(n))
        else:
            payload = _arrays.as_input(out, "out")
            _arrays.check_writable(payload, "out")
        with _arrays.cuda_call(grad) as (stream, torch):
            workspace = self._workspace(grad, n, stream, torch)
            if step is None:
                step = state._step if isinstance(state, ErrorFeedback) else 0
            nbytes = self.encode_into(grad, residual, payload, stream=stream, workspace=workspace, step=step)
        if isinstance(state, ErrorFeedback):
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
