"""The DDP hook's preconditioning for adaptive optimizers: compress each
bucket in the optimizer's own units.

Adam divides each coordinate of the gradient by sqrt(v), its running second
moment. A compression error is therefore not judged by its size in the
gradient but by its size after that division, and the gradient's units hide
that: one onebit block spans coordinates whose sqrt(v) differ by orders of
magnitude, so its one magnitude is wrong for most of them; top-k picks the
largest gradients, not the largest steps. The hook divides the bucket by
d = sqrt(v_hat) before it is encoded and multiplies the decoded average by d:
the codec (and its error feedback) then works where Adam will look. Every rank
holds the same v (it comes from the averaged gradients), hence the same d, so
the ranks still end with the same bits.

d is floored at ``FLOOR`` times its mean over the bucket: a coordinate whose
gradient has been near zero for long (an embedding row no batch touched) has
a tiny v; unfloored, its next gradient would be amplified past every other
coordinate of its block or top-k. BENCHMARKS.md section 11, "The hook in the
optimizer's units".
"""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch

FLOOR = 0.01

# The state key holding each optimizer's second moment (or what it divides by),
# and how it becomes d. Others (Adafactor's factored moments, Adadelta's two
# accumulators, SparseAdam) are not preconditioned.
_SQRT_BIAS_CORRECTED = ("Adam", "AdamW", "NAdam", "RAdam")


def _kind(optimizer: Any) -> Optional[str]:
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim"):
            name = cls.__name__
            if name in _SQRT_BIAS_CORRECTED or name in ("Adamax", "RMSprop", "Adagrad"):
                return name
    return None


def supported(optimizer: Any) -> bool:
    """Whether the hook can read `optimizer`'s second moment."""
    return _kind(optimizer) is not None


def _locate(optimizer: Any, params: List[torch.Tensor]) -> List[Tuple[Optional[dict], int]]:
    """(group, position in its "params") of each of `params` ((None, 0): in no group)."""
    at = {id(p): (g, j) for g in optimizer.param_groups for j, p in enumerate(g["params"])}
    return [at.get(id(p), (None, 0)) for p in params]


def _groups(optimizer: Any, params: List[torch.Tensor], cache: Optional[dict]) -> List[Optional[dict]]:
    """Each of `params`' group in `optimizer` (None: not stepped by it).
    `cache` (the bucket's plan cache) keeps the answer with, per parameter,
    its position in its group's list: it is used again while the optimizer is
    the same object, its param_groups the same dicts, and each parameter
    still at its position (an ``add_param_group``, a list edited in place or
    a replaced optimizer rebuild it); a parameter it found in no group is
    looked for again every call."""
    if cache is not None:
        held = cache.get("precondition_groups")
        if held is not None and held[0]() is optimizer:
            _, ids, where = held
            if ids == [id(g) for g in optimizer.param_groups] and all(
                    g is not None and j < len(g["params"]) and g["params"][j] is p
                    for p, (g, j) in zip(params, where)):
                return [g for g, _ in where]
    where = _locate(optimizer, params)
    if cache is not None:
        cache["precondition_groups"] = (weakref.ref(optimizer), [id(g) for g in optimizer.param_groups], where)
    return [g for g, _ in where]


def _scale_of(kind: str, state: dict, group: dict) -> Optional[torch.Tensor]:
    """What `optimizer` divides this parameter's step by (before its eps), or None."""
    if kind in _SQRT_BIAS_CORRECTED:
        v = state.get("max_exp_avg_sq") if group.get("amsgrad") else state.get("exp_avg_sq")
        step = state.get("step")
        if v is None or step is None:
            return None
        t = float(step)
        return (v / (1.0 - group["betas"][1] ** t)).sqrt() if t > 0 else None
    if kind == "Adamax":
        u = state.get("exp_inf")
        return None if u is None else u.clone()
    key = "square_avg" if kind == "RMSprop" else "sum"
    v = state.get(key)
    return None if v is None else v.sqrt()


def scale(optimizer: Any, params: List[torch.Tensor], cache: Optional[dict] = None) -> Optional[torch.Tensor]:
    """d for a bucket holding `params`' gradients in this order (DDP's bucket
    layout): one float32 tensor of their total size on their device, floored
    at FLOOR x its mean; None when the optimizer has no second moment yet for
    one of them (its first step, a parameter without a gradient so far).
    `cache`: a dict kept with the bucket (its plan's), where the parameters'
    groups are kept between calls (see _groups)."""
    kind = _kind(optimizer)
    if kind is None:
        return None
    parts = []
    for p, group in zip(params, _groups(optimizer, params, cache)):
        st = optimizer.state.get(p) if group is not None else None
        s = _scale_of(kind, st, group) if st else None
        if s is None or s.numel() != p.numel():
            return None
        parts.append(s.reshape(-1).to(torch.float32))
    d = torch.cat(parts) if len(parts) > 1 else parts[0]  # _scale_of's tensors are fresh: clamped in place
    mean = float(d.mean())
    if not mean > 0.0 or mean != mean or mean == float("inf"):
        return None  # all zero (nothing learnt yet) or not finite: leave the bucket as it is
    return d.clamp_min_(FLOOR * mean)


def holding(params: Iterable[torch.Tensor]) -> Optional[Any]:
    """The live torch optimizer over every one of `params`, found by a walk of
    the heap (a restored run, whose optimizer has not stepped since: the step
    pre-hook has not seen it yet). None if there is none or more than one."""
    found = over(params)
    return found[0] if len(found) == 1 else None


def over(params: Iterable[torch.Tensor]) -> List[Any]:
    """Every live torch optimizer over all of `params` (a stack's wrapper
    around an optimizer is one too), by a walk of the heap."""
    want = {id(p) for p in params}
    with warnings.catch_warnings():  # the walk touches deprecated objects (torch.distributed.reduce_op)
        warnings.simplefilter("ignore")
        return [o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)
                and want <= {id(p) for g in o.param_groups for p in g["params"]}]


class Watch:
    """A global optimizer step pre-hook recording the adaptive optimizer that
    steps the watched parameters (a weak reference). Holds no reference to the
    hook state."""

    def __init__(self, is_adaptive: Callable[[Any], bool]) -> None:
        self.params: set = set()
        self.adaptive: Optional[bool] = None
        self.optimizer: Optional[weakref.ref] = None
        self.covers = False  # the optimizer steps every watched parameter
        me = weakref.ref(self)

        self._is_adaptive = is_adaptive

        def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            watch = me()
            if watch is not None:
                watch._observe(optimizer, {id(p) for g in optimizer.param_groups for p in g["params"]})

        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._handle = register_optimizer_step_pre_hook(pre_hook)

    def _observe(self, optimizer: Any, mine: set) -> None:
        """An optimizer about to step the parameters with ids `mine`."""
        if self.params & mine:
            adaptive = self._is_adaptive(optimizer)
            self.adaptive = bool(self.adaptive) or adaptive
            if adaptive and self.optimizer is None:
                self.optimizer = weakref.ref(optimizer)
                self.covers = self.params <= mine

    def watch(self, params: List[torch.Tensor]) -> None:
        self.params.update(id(p) for p in params)

    def close(self) -> None:
        self._handle.remove()

    def __del__(self) -> None:
        if hasattr(self, "_handle"):
            self._handle.remove()
