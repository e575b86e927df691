"""The sweep's grid: codec spec grids, sizes, links, and the points they make.

The codec names come from the registry (_registry.py); the grid, element
counts and links are parsed by gradzip's own C++ parsers (compressors/spec.cc
``expand_spec_grid``, common/units.h), through the extension or
gradzip-bench (_registry.parse), never a second way::

    topk:density=0.1,0.01,onebit:block=256,1024
      -> topk:density=0.1  topk:density=0.01  onebit:block=256  onebit:block=1024

An item with ':' starts a codec (name, then its first key=value); an item
that is a codec name alone starts a codec without keys; an item with '=' and
no ':' adds a key to the current codec; any other item is one more value of
the current key. Several keys multiply (a product, in the order given).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ._registry import algorithm_names, parse

#: A point's mode: a bare allreduce (gradzip-bench), torch's gloo allreduce
#: (the outside baseline), or a training run (--train digits).
MODES = ("allreduce", "gloo", "train")

LOCAL = "local"  # no emulated link: ranks on loopback / shared memory


class GridError(ValueError):
    """A sweep setting that cannot be understood; the message says why."""


def expand_spec_grid(text: str | Sequence[str]) -> list[str]:
    """Expands spec grids into single specs as the grid writes them, in
    order, without duplicates."""
    if not isinstance(text, str):
        out: list[str] = []
        for t in text:
            out += [s for s in expand_spec_grid(t) if s not in out]
        return out
    try:
        specs = parse("grid", text)
    except ValueError as e:
        raise GridError(str(e)) from None
    out = []
    for s in specs:
        if s not in out:
            out.append(s)
    return out


def parse_size(value: int | str) -> int:
    """An element count: 1048576, "1M" (K/M/G are powers of 1024, as in
    gradzip-bench), "25.6e6" or 1e8 (decimal counts for round model sizes);
    strings by gradzip-bench's own parser (common/units.h)."""
    if isinstance(value, bool):
        raise GridError(f"size {value!r} is not a count")
    if isinstance(value, float):
        if not value.is_integer():
            raise GridError(f"size {value} is not a whole number of elements")
        value = int(value)
    if isinstance(value, int):
        n = value
    else:
        try:
            n = int(parse("count", value))
        except ValueError as e:
            raise GridError(str(e)) from None
    if n < 1 or n > 1 << 34:
        raise GridError(f"size {value!r} is outside 1..2^34 elements")
    return n


def parse_link(text: str) -> str:
    """Checks a link as gradzip-run --link takes it ("1gbit", "10gbit,50us";
    the launcher's own parser) or "local"; returns it lower-cased without spaces."""
    t = text.strip().lower().replace(" ", "")
    if t == LOCAL:
        return t
    try:
        parse("link", t)
    except ValueError as e:
        raise GridError(f"link '{text}': {e} (or 'local')") from None
    return t


def link_rate_bps(link: str) -> float | None:
    """Bits per second of a link, None for "local"."""
    if link == LOCAL:
        return None
    return float(parse("link", link)["rate_bps"])


def fp32_link_bound_s(ranks: int, elements: int, link: str) -> float | None:
    """The fp32 allreduce's lower bound on a link: 2(P-1)/P x 4n bytes / rate."""
    rate = link_rate_bps(link)
    if rate is None or ranks < 2:
        return None
    return 2 * (ranks - 1) / ranks * 4 * elements * 8 / rate


@dataclass(frozen=True, order=True)
class Point:
    """One measurement of the sweep; `key` identifies it across runs (resume)."""

    ranks: int
    link: str
    elements: int
    mode: str
    algorithm: str  # as requested (auto resolves in the bench); "gloo" / "train"
    codec: str      # as requested; "gloo" for the gloo baseline; a method for train

    @property
    def key(self) -> str:
        return f"{self.mode}|{self.ranks}|{self.link}|{self.algorithm}|{self.elements}|{self.codec}"

    def describe(self) -> str:
        size = f" n={self.elements}" if self.elements else ""
        alg = f" {self.algorithm}" if self.mode == "allreduce" else ""
        return f"{self.mode} P={self.ranks} {self.link}{size}{alg} {self.codec}"


@dataclass
class Grid:
    """Everything a sweep measures (the settings of timing live in SweepConfig)."""

    codecs: list[str]
    algorithms: list[str]
    sizes: list[int]
    ranks: list[int]
    links: list[str]
    gloo: bool = True
    train: str | None = None       # "digits" or "lm"
    train_ranks: int | list[int] = 4  # one rank count, or several (a grid of methods x ranks)

    def points(self) -> list[Point]:
        """All points: per (ranks, link, size) the gloo baseline first, then
        the codecs per algorithm. With `train`, the training runs instead
        (one per codec setting, plus the fp32 reference)."""
        if self.train:
            methods = dict.fromkeys(["fp32"] + self.codecs)
            ranks = self.train_ranks if isinstance(self.train_ranks, list) else [self.train_ranks]
            return [Point(p, LOCAL, 0, "train", self.train, m) for p in ranks for m in methods]
        pts: list[Point] = []
        for p in self.ranks:
            for link in self.links:
                for n in self.sizes:
                    if self.gloo:
                        pts.append(Point(p, link, n, "gloo", "gloo", "gloo"))
                    for alg in self.algorithms:
                        pts += [Point(p, link, n, "allreduce", alg, c) for c in self.codecs]
        return pts


def split_lm_methods(text: str) -> list[str]:
    """The LM experiment's methods, commas inside a method kept with it: a
    part whose name (before any '@', '/', ':') holds '=' (mu=0, ef=off,
    block=512) continues the previous method. The experiment's own
    split_methods does the same against the codec names; this one needs no
    compiled extension (the sweep's grid is checked without it)."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name = part.split("@")[0].split("/")[0].split(":")[0]
        if out and "=" in name:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def make_grid(codecs: str | Sequence[str], algorithms: Iterable[str], sizes: Iterable[int | str],
              ranks: Iterable[int], links: Iterable[str], gloo: bool = True, train: str | None = None,
              train_ranks: int | Iterable[int] = 4) -> Grid:
    """Validates and expands the settings into a Grid; raises GridError."""
    if train == "lm":  # methods, as the experiment's --methods takes them (onebit@bmuf:h=8,mu=0, ...)
        specs = split_lm_methods(codecs) if isinstance(codecs, str) else [str(c) for c in codecs]
    else:
        specs = expand_spec_grid(codecs)
    if not specs:
        raise GridError("no codecs to sweep")
    algs = [a.strip().replace("-", "_") for a in algorithms]
    for a in algs:
        if a not in algorithm_names():
            raise GridError(f"algorithm '{a}': valid: {', '.join(algorithm_names())}")
    ns = [parse_size(s) for s in sizes]
    ps = [int(r) for r in ranks]
    for r in ps:
        if r < 1 or r > 253:
            raise GridError(f"ranks {r}: must be in 1..253")
    ls = [parse_link(x) for x in links]
    if train not in (None, "digits", "lm"):
        raise GridError(f"--train '{train}': the experiments are 'digits' and 'lm'")
    if isinstance(train_ranks, str):
        train_ranks = [r for r in train_ranks.split(",") if r.strip()]
    try:
        trs = [int(r) for r in ([train_ranks] if isinstance(train_ranks, int) else train_ranks)]
    except ValueError:
        raise GridError(f"--train-ranks {train_ranks}: rank counts, e.g. 4 or 2,4,8") from None
    if not trs or any(r < 2 or r > 64 for r in trs):
        raise GridError(f"--train-ranks {train_ranks}: rank counts in 2..64")
    if not (algs and ns and ps and ls):
        raise GridError("algorithms, sizes, ranks and links each need at least one value")
    return Grid(specs, list(dict.fromkeys(algs)), list(dict.fromkeys(ns)), list(dict.fromkeys(ps)),
                list(dict.fromkeys(ls)), gloo, train, trs[0] if len(trs) == 1 else list(dict.fromkeys(trs)))
