"""Which parameters the hook compresses together, and with which residuals.

DDP calls the hook per bucket, but its buckets change: a new DDP object runs
its first iteration with one provisional layout and then rebuilds the buckets
in gradient-ready order (and a run restored from a checkpoint starts again
from the provisional layout). Error feedback must follow the *parameters*
through these changes, and a restored run must compress exactly as the
uninterrupted run did. So the hook works on segments, not buckets:

- A *key* names a parameter portably: its position in the first layout this
  state observes (the concatenation of the first step's buckets in index
  order). DDP builds that layout deterministically from the model, so a
  restarted process assigns the same keys.
- A *segment* is a run of keys compressed as one buffer, with its own
  error-feedback object. Normally a segment is exactly one bucket (no copies).
- Planning a bucket (``Tracker.plan``):
    1. its keys are exactly one segment, in order: compress the bucket as is;
    2. it holds only whole segments (e.g. the provisional single bucket after
       a restore): compress each segment separately, gathering its parameters
       into a scratch buffer, so the result is what the segments' own buckets
       would have given;
    3. otherwise: a new segment for the bucket, whose error feedback is
       assembled parameter by parameter from the segments that held them.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# (source residual or None, offset in it, length): where a parameter's residual was.
Source = Tuple[Any, int, int]


class Segment:
    """Parameters compressed together, and their error-feedback state."""

    __slots__ = ("keys", "numels", "n", "ef", "message_cache")

    def __init__(self, keys: Sequence[int], numels: Sequence[int], ef: Any) -> None:
        self.keys = tuple(keys)
        self.numels = tuple(numels)
        self.n = sum(self.numels)
        self.ef = ef
        self.message_cache: Any = None

    def offsets(self) -> List[int]:
        out, o = [], 0
        for m in self.numels:
            out.append(o)
            o += m
        return out


class Plan:
    """How one bucket is compressed: its segments, and for each either None
    (the segment is the whole bucket, in order) or the copy runs
    (bucket offset, segment offset, length) that gather it from the bucket."""

    __slots__ = ("params", "generation", "parts", "cache")

    def __init__(self, params: Tuple[Any, ...], generation: int,
                 parts: List[Tuple[Segment, Optional[List[Tuple[int, int, int]]]]]) -> None:
        self.params = params  # the bucket's parameters (held: ids of dead ones get reused)
        self.generation = generation
        self.parts = parts
        self.cache: Dict[str, Any] = {}  # per-plan buffers of the exchange

    @property
    def identity(self) -> bool:
        return len(self.parts) == 1 and self.parts[0][1] is None

    def inputs(self, buffer: Any) -> List[Any]:
        """Each segment's gradient: the bucket itself, or its parameters
        gathered into scratch (kept in the plan, reused every step)."""
        import torch

        out = []
        for j, (seg, runs) in enumerate(self.parts):
            if runs is None:
                out.append(buffer)
                continue
            key = f"scratch{j}"
            x = self.cache.get(key)
            if x is None or x.device != buffer.device or x.dtype != buffer.dtype:
                x = self.cache[key] = torch.empty(seg.n, dtype=buffer.dtype, device=buffer.device)
            for bo, so, m in runs:
                x[so:so + m].copy_(buffer[bo:bo + m])
            out.append(x)
        return out

    def scatter(self, inputs: List[Any], buffer: Any) -> None:
        """Copies gathered segments (inputs() scratch) back into the bucket."""
        for (_, runs), x in zip(self.parts, inputs):
            if runs is not None:
                for bo, so, m in runs:
                    buffer[bo:bo + m].copy_(x[so:so + m])


class LayoutMismatch(ValueError):
    """Restored state does not describe this model's parameters (or its DDP layout)."""


class Tracker:
    """Parameter keys, segments and per-bucket plans of one hook state.

    ``make_ef(n, sources)`` builds the error-feedback object of a new segment
    of n elements from per-parameter sources (each (residual, offset, length),
    residual None when the parameter had none).
    """

    __slots__ = ("_key_of", "_shapes", "_observing", "_next_key", "_owner", "_plans",
                 "_generation", "_saved_shapes", "events")

    def __init__(self) -> None:
        self._key_of: Dict[int, Tuple[Any, int]] = {}  # id(param) -> (weakref, key)
        self._shapes: List[Tuple[int, ...]] = []  # shape of each key
        self._observing = True  # still in the first step: keys are being assigned
        self._next_key = 0
        self._owner: Dict[int, Tuple[Segment, int]] = {}  # key -> (segment, offset in it)
        self._plans: Dict[int, Plan] = {}
        self._generation = 0
        self._saved_shapes: Optional[List[Tuple[int, ...]]] = None
        self.events: List[str] = []  # what happened, for logs and tests

    # -- keys ---------------------------------------------------------------

    def _keys_of(self, params: Sequence[Any]) -> List[int]:
        keys = []
        for p in params:
            entry = self._key_of.get(id(p))
            if entry is not None and entry[0]() is p:
                keys.append(entry[1])
                continue
            if not self._observing:
                raise ValueError(
                    "a DDP bucket holds a parameter this CompressionState has not seen in its first "
                    "step: use one CompressionState per DDP model")
            key = self._next_key
            self._next_key += 1
            shape = tuple(p.shape)
            if self._saved_shapes is not None:
                if key >= len(self._saved_shapes) or self._saved_shapes[key] != shape:
                    had = self._saved_shapes[key] if key < len(self._saved_shapes) else "no parameter"
                    self._mismatch(f"parameter {key} of the first DDP layout has shape {shape}; "
                                   f"the checkpoint has {had}")
            self._key_of[id(p)] = (weakref.ref(p), key)
            self._shapes.append(shape)
            keys.append(key)
        return keys

    def end_step(self) -> None:
        if self._observing:
            self._observing = False
            if self._saved_shapes is not None and len(self._saved_shapes) != len(self._shapes):
                self._mismatch(f"the model has {len(self._shapes)} parameters, the checkpoint "
                               f"{len(self._saved_shapes)}")
            self._saved_shapes = None

    # -- plans --------------------------------------------------------------

    def plan(self, index: int, params: Sequence[Any], numel: int,
             make_ef: Callable[[int, List[Source]], Any]) -> Plan:
        params = tuple(params)
        cached = self._plans.get(index)
        if (cached is not None and cached.generation == self._generation and len(cached.params) == len(params)
                and all(a is b for a, b in zip(cached.params, params))):
            return cached
        keys = self._keys_of(params)
        numels = [p.numel() for p in params]
        if sum(numels) != numel:
            raise ValueError(f"bucket {index}: its parameters hold {sum(numels)} elements but its buffer "
                             f"{numel}; gradzip needs dense buckets")
        plan = self._plan_for(params, keys, numels, make_ef)
        self._plans[index] = plan
        return plan

    def _plan_for(self, params: Tuple[Any, ...], keys: List[int], numels: List[int],
                  make_ef: Callable[[int, List[Source]], Any]) -> Plan:
        owners = [self._owner.get(k) for k in keys]
        segments: List[Segment] = []
        for o in owners:
            if o is not None and all(o[0] is not s for s in segments):
                segments.append(o[0])
        key_set = set(keys)

        # 1. The bucket is one segment, in order.
        if len(segments) == 1 and segments[0].keys == tuple(keys):
            return Plan(params, self._generation, [(segments[0], None)])

        # 2. The bucket holds whole segments only: gather each.
        if segments and all(o is not None for o in owners) and all(
                all(k in key_set for k in s.keys) for s in segments):
            bucket_offset = {}
            off = 0
            for k, m in zip(keys, numels):
                bucket_offset[k] = off
                off += m
            parts = []
            for s in segments:
                runs = [(bucket_offset[k], so, m) for k, so, m in zip(s.keys, s.offsets(), s.numels)]
                parts.append((s, runs))
            self.events.append(f"gather:{len(segments)}")
            return Plan(params, self._generation, parts)

        # 3. A new segment; residuals follow their parameters.
        sources: List[Source] = []
        for o, m in zip(owners, numels):
            if o is None:
                sources.append((None, 0, m))
            else:
                s, so = o
                sources.append((s.ef, so, m))
        seg = Segment(keys, numels, make_ef(sum(numels), sources))
        off = 0
        for k, m in zip(keys, numels):
            self._owner[k] = (seg, off)
            off += m
        self._generation += 1
        self.events.append("new" if all(o is None for o in owners) else "remap")
        return Plan(params, self._generation, [(seg, None)])

    # -- checkpoints ----------------------------------------------------------

    def segments(self) -> List[Segment]:
        """Every live segment, in order of their first key."""
        seen: Dict[int, Segment] = {}
        for seg, _ in self._owner.values():
            seen.setdefault(id(seg), seg)
        return sorted(seen.values(), key=lambda s: s.keys[0] if s.keys else -1)

    def shapes(self) -> List[Tuple[int, ...]]:
        return list(self._shapes)

    def restore(self, shapes: List[Tuple[int, ...]], segments: List[Segment]) -> None:
        """Replaces every segment with restored ones. In a state that has not
        observed a step yet, the keys are checked against `shapes` as they are
        assigned; in one that has, right away."""
        self._owner.clear()
        self._plans.clear()
        self._generation += 1
        for seg in segments:
            off = 0
            for k, m in zip(seg.keys, seg.numels):
                self._owner[k] = (seg, off)
                off += m
        if not shapes:  # saved before any step: nothing to match
            return
        if self._observing and not self._shapes:
            self._saved_shapes = [tuple(s) for s in shapes]
        elif [tuple(s) for s in shapes] != self._shapes:
            self._owner.clear()
            self._mismatch("its parameter shapes differ from the ones this state has seen")

    def _mismatch(self, why: str) -> None:
        self._saved_shapes = None
        self._owner.clear()
        self._plans.clear()
        self._generation += 1
        raise LayoutMismatch(
            f"the restored CompressionState does not fit this model: {why}. Parameters are matched by "
            f"their position in DDP's first bucket layout, so restore into the same model built with "
            f"the same DDP bucket settings")
