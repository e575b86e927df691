"""The error-feedback state of one gradient buffer: one class for every place
gradzip compresses with error feedback.

An :class:`ErrorFeedback` serves one of two roles, fixed by its first use:

- ``"codec"``: :meth:`gradzip.Codec.encode` keeps the buffer's residual here,
  next to the gradient (same framework, same device), with the count of
  encodes that keys random draws.
- ``"collective"``: :meth:`gradzip.Communicator.allreduce` and
  :meth:`~gradzip.Communicator.reduce_scatter` keep their residuals in C++
  (``gz::ErrorFeedback``, comm/engine/error_feedback.h: the worker residual, and for
  scatter_reduce the server residual of this rank's chunk), which this object
  owns.

The two hold different residuals of different sizes, so a state bound to one
role refuses the other (:class:`gradzip.InvalidArgument` naming both) until
:meth:`ErrorFeedback.reset`.
"""

from __future__ import annotations

import builtins
from typing import Any, Dict, Optional

import numpy as np

from . import _arrays
from . import _core
from ._core import InvalidArgument

__all__ = ["ErrorFeedback"]

# 2: {"version", "role", <the role's fields>}. 1 (still read): the role's
# fields alone, from before one class served both: {"codec", "n", "residual",
# "step"} (ErrorFeedback) or {"data"} (AllreduceState).
_VERSION = 2
CODEC = "codec"
COLLECTIVE = "collective"
_USE = {CODEC: "Codec.encode", COLLECTIVE: "a Communicator collective (allreduce, reduce_scatter)"}


class ErrorFeedback:
    """Error-feedback state of one gradient buffer, for :meth:`Codec.encode` or
    for :meth:`Communicator.allreduce` / :meth:`Communicator.reduce_scatter`.

    Created empty. The first use binds it: an encode allocates the residual
    (``v = g + r; payload = Q(v); r = v - D(payload)``) as zeros next to the
    gradient, for that codec spec and element count (:attr:`role` ``"codec"``);
    a collective call binds the C++ state to the call's codec, size, rank,
    world size and algorithm (:attr:`role` ``"collective"``). Keep one state
    per buffer and use; another spec, size or role raises
    :class:`gradzip.InvalidArgument`, and :meth:`reset` unbinds it.

    :meth:`state_dict` / :meth:`load_state_dict` carry either role through a
    checkpoint (state dicts of older releases load too), and a restored state
    continues bit-identically.
    """

    __slots__ = ("_role", "_native", "_residual", "_spec", "_n", "_pending", "_step")

    def __init__(self) -> None:
        self._role: Optional[str] = None
        self._native: Any = None  # collective: the C++ state (gradzip._core.ErrorFeedback)
        self._residual: Any = None  # codec: n float32 values
        self._spec: Optional[str] = None
        self._n = 0
        self._pending = False  # codec: restored, not yet placed next to a gradient
        self._step = 0

    @property
    def role(self) -> Optional[str]:
        """``"codec"``, ``"collective"``, or None before the first use (and after :meth:`reset`)."""
        return self._role

    @property
    def bound(self) -> bool:
        """Whether the state holds residuals (after a use or a restore)."""
        if self._role == CODEC:
            return self._spec is not None
        return self._native is not None and self._native.bound

    @property
    def spec(self) -> Optional[str]:
        """The canonical spec of the codec the state is bound to (either role)."""
        if self._role == CODEC:
            return self._spec
        layout = self.layout
        return None if layout is None else layout["codec"]

    @property
    def layout(self) -> Optional[Dict[str, Any]]:
        """What the state is bound to, or None: ``{"codec", "n"}`` (codec), or
        ``{"codec", "n", "rank", "world_size", "algorithm"}`` (collective)."""
        if self._role == CODEC:
            return None if self._spec is None else {"codec": self._spec, "n": self._n}
        return None if self._native is None else self._native.layout

    @property
    def residual(self) -> Any:
        """Codec role: the residual (n float32 values, where it lives). None
        otherwise: a collective's residuals live in C++ (:meth:`state_dict` has them)."""
        return self._residual

    @property
    def bytes(self) -> int:
        """Bytes of residual memory held (host or device)."""
        if self._role == CODEC:
            return 0 if self._residual is None else 4 * _arrays.numel(self._residual)
        return 0 if self._native is None else self._native.memory_bytes

    @property
    def step(self) -> int:
        """Codec role: the encodes done with this state, which key the random
        draws of the next one (qsgd's stochastic rounding). 0 otherwise."""
        return self._step

    def reset(self) -> None:
        """Forgets role and residuals: the next use starts from zeros, in either role."""
        ErrorFeedback.__init__(self)

    def residuals(self) -> Any:
        """Collective role: (worker, server), copies of the residuals as float32
        numpy arrays (the server residual is empty except for scatter_reduce).
        Raises InvalidArgument for an unbound state or the codec role (whose
        residual is :attr:`residual`)."""
        if self._role != COLLECTIVE or not self.bound:
            raise InvalidArgument("residuals() needs a bound collective error feedback state (role 'collective'); "
                                  f"this one is {self!r}")
        worker, server = self._native.residuals()
        return np.frombuffer(worker, dtype=np.float32), np.frombuffer(server, dtype=np.float32)

    def respec(self, spec: str) -> None:
        """Collective role: binds the state to codec `spec`, keeping its
        residuals, when they have the same sizes for it (top-k at another
        density: DGC's sparsity warm-up changes the density, and the residual
        carries on). Raises InvalidArgument for an unbound or hierarchical
        state, another residual size, or residuals that are not finite."""
        if self._role != COLLECTIVE or not self.bound:
            raise InvalidArgument(f"respec() needs a bound collective error feedback state; this one is {self!r}")
        self._native.respec(spec)

    def regroup(self) -> None:
        """The group changed (torchft's quorum: another rank or world size):
        the next collective call may bind the state at its new place, for the
        same codec and size. The worker residual (what this rank has not yet
        sent of its own buffer) carries over when that call's layout has one
        of the same size (every flat algorithm); the server residual (sums of
        a chunk this rank owned in the old group) starts from zeros, as does a
        worker residual that cannot carry (hierarchical). Nothing to do for
        an unbound state or the codec role (its residual is the buffer's)."""
        if self._role == COLLECTIVE and self.bound:
            self._native.regroup()

    def zero(self) -> None:
        """Sets the residuals to zeros, keeping what the state is bound to and
        the ranks' last agreement on it: the next call sends what a fresh
        state would, with no agreement round, so one rank may do it alone
        (torchft's healed replica). Nothing to do for an unbound state."""
        if self._role == COLLECTIVE and self.bound:
            self._native.zero()
        elif self._role == CODEC and self._residual is not None:
            self._residual[...] = 0

    def state_dict(self) -> Dict[str, Any]:
        """A copy of the state, for a checkpoint:

        - ``{"version": 2, "role": "codec", "codec", "n", "residual", "step"}``,
          the residual in its framework and on its device;
        - ``{"version": 2, "role": "collective", "data"}``, data the C++ state
          serialised (bytes: layout, residuals, checksum);
        - ``{"version": 2, "role": None}`` when unbound.

        Only tensors, numbers, strings and bytes: ``torch.load(..., weights_only=True)`` reads it.
        """
        if not self.bound:
            return {"version": _VERSION, "role": None}
        if self._role == CODEC:
            return {"version": _VERSION, "role": CODEC, "codec": self._spec, "n": self._n,
                    "residual": _arrays.copy_of(self._residual), "step": self._step}
        return {"version": _VERSION, "role": COLLECTIVE, "data": self._native.save()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned, or a state dict of an older
        release (version 1: ``ErrorFeedback``'s or ``AllreduceState``'s). An
        unbound one resets the state. Binds an unbound state to the dict's
        role; a state bound to the other role refuses it (reset() it first).

        Codec role: the residual is copied into the existing one when the state
        is bound, else kept until the first encode, which moves it next to the
        gradient. Collective role: the bytes are checked in C++ (checksum,
        every field against its limit, finite residuals) before anything is kept.
        """
        role = _role_of(state)
        if role is None:
            self.reset()
            return
        self._check_role(role)
        if role == CODEC:
            self._load_codec(state)
        else:
            self._load_collective(state)
        self._role = role

    # -- the two uses ------------------------------------------------------

    def _residual_for(self, spec: str, grad: Any, n: int) -> Any:
        """Codec.encode: the residual for n elements of `spec` next to grad (binds the state)."""
        self._claim(CODEC)
        if self._spec is None:
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

    def _collective(self) -> Any:
        """A Communicator collective: the C++ state it runs on (binds the role)."""
        self._claim(COLLECTIVE)
        if self._native is None:
            self._native = _new_native()
        return self._native

    def _claim(self, role: str) -> None:
        """Binds the state to `role` at its first use; refuses the other role after."""
        self._check_role(role)
        self._role = role

    def _check_role(self, role: str) -> None:
        if self._role is not None and self._role != role:
            held = f"'{self.spec}', n={self.layout['n']}" if self.bound else "nothing yet"
            raise InvalidArgument(
                f"this ErrorFeedback is bound to {_USE[self._role]} (role '{self._role}', holding {held}) and "
                f"cannot serve {_USE[role]} (role '{role}'): the two keep different residuals. Use one "
                f"state per buffer and use, or reset() it")

    def _load_codec(self, state: Dict[str, Any]) -> None:
        spec, n, residual, step = state.get("codec"), state.get("n"), state.get("residual"), state.get("step", 0)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise InvalidArgument(f"ErrorFeedback state_dict has an invalid step {step!r}")
        if not (_arrays.is_torch(residual) or isinstance(residual, np.ndarray)):
            raise InvalidArgument(f"ErrorFeedback state_dict: 'residual' must be a tensor or numpy array, got "
                                  f"{type(residual).__name__}")
        if _arrays.dtype_name(residual) != "float32":
            raise InvalidArgument(f"ErrorFeedback state_dict: the residual is {_arrays.dtype_name(residual)}, "
                                  f"not float32")
        if not isinstance(n, int) or isinstance(n, bool) or _arrays.numel(residual) != n:
            raise InvalidArgument("ErrorFeedback state_dict is inconsistent: 'n' does not match the residual")
        if not isinstance(spec, str):
            raise InvalidArgument(f"ErrorFeedback state_dict: 'codec' must be a spec string, got {type(spec).__name__}")
        if not _arrays.all_finite(residual):
            # One NaN would reach every rank's result through the next payload.
            raise InvalidArgument("ErrorFeedback state_dict: the residual holds NaN or infinite values")
        if self._spec is not None and (spec != self._spec or n != self._n):
            raise InvalidArgument(
                f"state is bound to {self._n} elements of '{self._spec}' but the state_dict holds {n} "
                f"elements of '{spec}'; call reset() first")
        if self._spec is not None and not self._pending:
            src = _arrays.move_like(residual, self._residual).reshape(-1)
            if _arrays.is_torch(self._residual):
                self._residual.copy_(src)
            else:
                np.copyto(self._residual, src)
        else:
            self._residual = _arrays.copy_of(residual).reshape(-1)
            self._pending = True
        self._spec, self._n, self._step = spec, n, step

    def _load_collective(self, state: Dict[str, Any]) -> None:
        data = state.get("data")
        if not isinstance(data, (builtins.bytes, bytearray, memoryview)):
            raise InvalidArgument(f"ErrorFeedback state_dict: 'data' must be bytes, got {type(data).__name__}")
        native = self._native if self._native is not None else _new_native()
        native.restore(builtins.bytes(data))  # refuses another layout, leaving a bound state as it was
        self._native = native

    # -- copies and printing -----------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        return self.state_dict()

    def __setstate__(self, state: Dict[str, Any]) -> None:
        ErrorFeedback.__init__(self)
        self.load_state_dict(state)

    def __repr__(self) -> str:
        name = type(self).__name__
        if self._role is None:
            return f"{name}(unbound)"
        if not self.bound:
            return f"{name}(role='{self._role}', unbound)"
        layout = self.layout
        if self._role == CODEC:
            return f"{name}(role='codec', codec='{self._spec}', n={self._n}, step={self._step})"
        return (f"{name}(role='collective', codec='{layout['codec']}', n={layout['n']}, "
                f"rank={layout['rank']}/{layout['world_size']}, algorithm='{layout['algorithm']}')")


def _role_of(state: Any) -> Optional[str]:
    """The role a state dict holds (None: an unbound state); InvalidArgument if it is none of them."""
    if not isinstance(state, dict):
        raise InvalidArgument(f"not an ErrorFeedback state_dict: {type(state).__name__}")
    version = state.get("version")
    if version == _VERSION:
        role = state.get("role")
        if role not in (None, CODEC, COLLECTIVE):
            raise InvalidArgument(f"ErrorFeedback state_dict: unknown role {role!r} (valid: None, "
                                  f"'{CODEC}', '{COLLECTIVE}')")
    elif version == 1 and "data" in state:
        role = COLLECTIVE  # gradzip.AllreduceState's
    elif version == 1 and "codec" in state:
        role = CODEC  # gradzip.ErrorFeedback's, when it served Codec.encode only
    else:
        raise InvalidArgument(f"not an ErrorFeedback state_dict (version {version!r}; this build reads "
                              f"version {_VERSION}, and 1 with 'codec' or 'data')")
    if version == 1:
        # Version 1 wrote an unbound state as its fields set to None.
        if (role == CODEC and state.get("codec") is None) or (role == COLLECTIVE and state.get("data") is None):
            return None
        return role
    # Version 2 names its role: a dict must hold exactly that role's fields,
    # so that residuals are never dropped as "unbound" (a dict of one role
    # labelled as the other, or with its data missing).
    held = sorted(k for k, v in state.items() if k not in ("version", "role") and v is not None)
    if role is None:
        if held:
            raise InvalidArgument(f"ErrorFeedback state_dict: role None (an unbound state) holds nothing, but "
                                  f"this one has {', '.join(map(str, held))}")
        return None
    need, other = (("codec", "n", "residual"), ("data",)) if role == CODEC else (("data",), ("codec", "n", "residual"))
    missing = [k for k in need if state.get(k) is None]
    wrong = [k for k in other if k in held]
    if missing or wrong:
        raise InvalidArgument(
            f"ErrorFeedback state_dict of role '{role}' " + (f"lacks {', '.join(missing)}" if missing else "") +
            (" and " if missing and wrong else "") +
            (f"holds {', '.join(wrong)} of the other role" if wrong else "") + " (a damaged or mislabelled dict)")
    return role


def _new_native() -> Any:
    native = getattr(_core, "ErrorFeedback", None)
    if native is None:
        raise InvalidArgument("this gradzip build has no communicator (BUILD['comm'] is False): a collective's "
                              "error feedback cannot be made or restored")
    return native()
