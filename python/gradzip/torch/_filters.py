"""Layer filters (CGX's): which parameters travel exact (fp32, no codec) and
which through the codec. One policy for the DDP hook (a segment of a bucket),
BlockMomentum (the flat model update) and FSDP2 (each rank's chunk of a
reduce-scatter input): :func:`check` validates the option, :func:`split_runs`
splits any contiguous layout of parameters, :func:`gather` and
:func:`scatter` move the runs in and out of one buffer per kind.

A parameter travels exact when it has at most one dimension (biases, norm
weights and gains) or fewer than ``exact_below`` elements. These hold a tiny
share of the bytes, but a codec treats them badly: onebit gives every element
of a 512-element block one magnitude, so a norm's gains would share a scale
with the matrix beside them in the bucket, and Adam's per-coordinate division
then magnifies the error. The compressed part of a segment is its other
parameters gathered in order, so a block scale never spans a parameter of
another kind; its error feedback is the segment's own. The exact part is
averaged with gradzip's ``none`` codec (the same bits on every rank).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

# (offset in the segment, length) runs.
Runs = List[Tuple[int, int]]


def check(exact_below: Any, auto: bool = False) -> Any:
    """`exact_below` if it is None or an integer >= 0 (not a bool), or with
    `auto` (the DDP hook's: decided with the optimizer) "auto"; else ValueError."""
    if auto and isinstance(exact_below, str) and exact_below == "auto":
        return exact_below
    if exact_below is not None and (not isinstance(exact_below, int) or isinstance(exact_below, bool)
                                    or exact_below < 0):
        allowed = "'auto', None" if auto else "None"
        raise ValueError(f"exact_below must be {allowed} (no layer filter) or an integer >= 0, got {exact_below!r}")
    return exact_below


def is_exact(shape: Sequence[int], exact_below: int) -> bool:
    """Whether a parameter of this shape travels exact."""
    return len(shape) <= 1 or math.prod(shape) < exact_below


class Split:
    """The exact and compressed runs of one layout (a hook segment, a flat model, a chunk), with scratch buffers."""

    __slots__ = ("exact", "compressed", "n_exact", "n_compressed", "exact_ef", "scratch")

    def __init__(self, exact: Runs, compressed: Runs) -> None:
        import gradzip

        self.exact = exact
        self.compressed = compressed
        self.n_exact = sum(m for _, m in exact)
        self.n_compressed = sum(m for _, m in compressed)
        self.exact_ef = gradzip.ErrorFeedback()  # the none codec keeps no residual: nothing to checkpoint
        self.scratch: Dict[str, torch.Tensor] = {}

    def buffer(self, name: str, n: int, like: torch.Tensor) -> torch.Tensor:
        x = self.scratch.get(name)
        if x is None or x.numel() != n or x.device != like.device or x.dtype != like.dtype:
            x = self.scratch[name] = torch.empty(n, dtype=like.dtype, device=like.device)
        return x


def split_runs(layout: Iterable[Tuple[Sequence[int], int, int]], exact_below: Optional[int]) -> Optional[Split]:
    """The split of a contiguous layout of parameters, given as (shape, offset,
    elements) in order (elements may differ from the shape's: a shard), or
    None when it has nothing to keep exact (or nothing to compress: then the
    whole is sent as is) or filters are off (`exact_below` None)."""
    if exact_below is None:
        return None
    exact: Runs = []
    compressed: Runs = []
    for shape, off, m in layout:
        if m == 0:
            continue
        runs = exact if is_exact(shape, exact_below) else compressed
        if runs and sum(runs[-1]) == off:
            runs[-1] = (runs[-1][0], runs[-1][1] + m)
        else:
            runs.append((off, m))
    if not exact:
        return None
    return Split(exact, compressed)


def split_of(seg: Any, shapes: List[Tuple[int, ...]], exact_below: Optional[int]) -> Optional[Split]:
    """A DDP hook segment's split (:func:`split_runs` of its parameters)."""
    if exact_below is None:
        return None
    return split_runs(((shapes[key], off, m) for key, off, m in zip(seg.keys, seg.offsets(), seg.numels)),
                      exact_below)


def split_end_to_end(parts: Sequence[Tuple[Sequence[int], int]], exact_below: Optional[int]) -> Optional[Split]:
    """The split of parameters laid end to end, given as (shape, elements) in
    order: the whole parameter's elements, or its shard's in a chunk (FSDP)."""
    offsets = itertools.accumulate((m for _, m in parts), initial=0)
    return split_runs(((shape, off, m) for (shape, m), off in zip(parts, offsets)), exact_below)


def split_flat(shapes: Sequence[Sequence[int]], exact_below: Optional[int]) -> Optional[Split]:
    """The split of whole parameters of these shapes laid end to end (BlockMomentum's flat model)."""
    return split_end_to_end([(shape, math.prod(shape)) for shape in shapes], exact_below)


def gather(x: torch.Tensor, runs: Runs, out: torch.Tensor) -> None:
    """out = x's runs, end to end. x and out may be (rows, n) matrices: each row alike."""
    o = 0
    for lo, m in runs:
        out[..., o:o + m].copy_(x[..., lo:lo + m])
        o += m


def scatter(src: torch.Tensor, runs: Runs, x: torch.Tensor) -> None:
    """x's runs = src, end to end (the inverse of :func:`gather`)."""
    o = 0
    for lo, m in runs:
        x[..., lo:lo + m].copy_(src[..., o:o + m])
        o += m


def exchange_parts(x: torch.Tensor, split: Split, compressed: Callable[[torch.Tensor], Any],
                   exact: Callable[[torch.Tensor], Any]) -> Tuple[Any, Any]:
    """x's compressed runs, gathered end to end, go through `compressed`, its
    exact runs through `exact` (each averages its buffer in place and returns
    the wire bytes), and back into x. Returns (wire bytes, of which exact)."""
    wire = 0
    if split.n_compressed:
        c = split.buffer("compressed", split.n_compressed, x)
        gather(x, split.compressed, c)
        wire += compressed(c)
        scatter(c, split.compressed, x)
    e = split.buffer("exact", split.n_exact, x)
    gather(x, split.exact, e)
    exact_wire = exact(e)
    scatter(e, split.exact, x)
    return wire + exact_wire, exact_wire


def allreduce(comm: Any, codec: Any, seg: Any, split: Split, x: torch.Tensor, algorithm: str,
              server_codec: Optional[str]) -> Tuple[float, float]:
    """Averages the segment x in place: its exact runs with the none codec, the
    rest with the codec (the segment's error feedback). Returns (wire bytes,
    the exact part's wire bytes)."""
    return exchange_parts(
        x, split,
        lambda c: comm.allreduce(c, codec, seg.ef, op="avg", algorithm=algorithm,
                                 server_codec=server_codec)["wire_bytes"],
        lambda e: comm.allreduce(e, none_codec(), split.exact_ef, op="avg")["wire_bytes"])


@functools.lru_cache(maxsize=None)
def none_codec() -> Any:
    """gradzip's ``none`` codec (fp32, the same bits on every rank): the exact part's."""
    import gradzip

    return gradzip.Codec("none")
