"""Tune before comparing: every method over a learning-rate grid, then seeds at the best.

A comparison with fp32 means fp32 at its own best learning rate (docs/python.md,
"Against a tuned baseline"). The protocol, shared by the LM and digits
experiments (their ``--tune``):

1. Grid: every method at every learning rate of the grid on the first seed.
2. Widening: a method whose best learning rate is the lowest or highest it has
   tried gets the next point past that edge (half or twice it), until its best
   is inside its grid or ``max_widen`` points were added on that side.
3. Seeds: every method at its own best learning rate and at the baseline's
   best, on every seed.

The report gives each method at its own best and every method at the
baseline's best, with the mean over seeds, the worst seed against the
baseline on the same seed, and the baseline's own seed-to-seed spread: a
difference inside that spread is reported as a tie, not a win or a loss.

Runs are deterministic given (method, seed, learning rate), so a records file
(one JSON object per finished run) lets a rerun of the same command skip what
is done; records made with other settings are refused, not mixed in.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: (method, seed, learning rate): one training run.
Run = Tuple[str, int, float]


@dataclass(frozen=True)
class Metric:
    """What a run is judged by: the record's field, its direction, and how a
    difference to the baseline is written (relative, in %, or in points)."""

    field: str
    lower_is_better: bool
    relative: bool  # True: 100 (v / base - 1) %; False: 100 (v - base) points
    name: str

    def delta(self, value: float, base: float) -> float:
        """How much worse than `base` (positive: worse), in the metric's unit."""
        d = 100.0 * (value / base - 1.0) if self.relative else 100.0 * (value - base)
        return d if self.lower_is_better else -d

    def shown(self, worse_by: float) -> str:
        """A delta as tables write it: in the metric's own direction (loss up is worse, accuracy down is)."""
        return f"{worse_by if self.lower_is_better else -worse_by:+.2f}{self.unit}"

    @property
    def sign_note(self) -> str:
        return "Positive: worse than it." if self.lower_is_better else "Negative: worse than it."

    @property
    def unit(self) -> str:
        return "%" if self.relative else " points"


LOSS = Metric("val_loss", lower_is_better=True, relative=True, name="validation loss")
ACCURACY = Metric("test_accuracy", lower_is_better=False, relative=False, name="test accuracy")


def lr_key(lr: float) -> str:
    """The learning rate as records and tables name it (4 significant digits)."""
    return f"{lr:.4g}"


def grid(center: float, points: int = 5, factor: float = 2.0) -> List[float]:
    """`points` learning rates a `factor` apart, `center` in the middle (or just above it for an even count)."""
    lo = -(points // 2)
    return [center * factor ** k for k in range(lo, lo + points)]


def parse_lrs(text: str) -> List[float]:
    """'1e-3,2e-3,4e-3' -> a sorted list; 'grid:C' or 'grid:C:N' -> N (default 5) points a factor 2 around C."""
    if text.startswith("grid:"):
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"--lr {text!r}: write grid:CENTER or grid:CENTER:POINTS")
        return grid(float(parts[1]), int(parts[2]) if len(parts) == 3 else 5)
    lrs = sorted({float(v) for v in text.split(",") if v})
    if not lrs or any(not (v > 0 and math.isfinite(v)) for v in lrs):
        raise ValueError(f"--lr {text!r}: learning rates are positive numbers")
    return lrs


class Records:
    """The finished runs, by (method, seed, learning rate), kept in a JSON-lines
    file when one is given; every record carries the settings it ran with."""

    def __init__(self, path: Optional[str], settings: Dict[str, Any]) -> None:
        self.path, self.settings, self.by = path, _comparable(settings), {}
        if path and os.path.exists(path):
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        r = json.loads(line)
                        key = self.key(r["method"], r["seed"], r["lr"])
                        theirs = _comparable(r["settings"])
                    except (ValueError, KeyError, TypeError) as e:
                        raise ValueError(f"{path}:{n}: not a run record ({e})") from None
                    if theirs != self.settings:
                        diff = sorted(k for k in set(theirs) | set(self.settings)
                                      if theirs.get(k) != self.settings.get(k))
                        raise ValueError(f"{path}:{n}: a run with other settings ({', '.join(diff)}); "
                                         "give another --records file")
                    self.by[key] = r

    @staticmethod
    def key(method: str, seed: int, lr: float) -> Tuple[str, int, str]:
        return method, int(seed), lr_key(lr)

    def get(self, run: Run) -> Optional[Dict[str, Any]]:
        return self.by.get(self.key(*run))

    def add(self, records: Sequence[Dict[str, Any]]) -> None:
        """Keeps `records`, appending to the file those it does not hold yet (an
        experiment's rank 0 may have appended each run as it finished)."""
        on_disk = set()
        if self.path and os.path.exists(self.path):
            with open(self.path) as f:
                on_disk = {self.key(r["method"], r["seed"], r["lr"]) for r in map(json.loads, filter(str.strip, f))}
        for r in records:
            r.setdefault("settings", self.settings)
            key = self.key(r["method"], r["seed"], r["lr"])
            self.by[key] = r
            if self.path and key not in on_disk:
                with open(self.path, "a") as f:
                    f.write(json.dumps(r) + "\n")

    def all(self) -> List[Dict[str, Any]]:
        return list(self.by.values())


def _comparable(settings: Dict[str, Any]) -> Dict[str, Any]:
    """The settings that change a run's result (the learning rate is the run's own)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.items()
            if k not in ("lr", "eval_every", "threads_per_rank")}


class Tuner:
    """Runs the protocol of the module doc. `train(runs)` trains a list of runs
    (one launch of the experiment's ranks) and returns one record per run with
    at least method, seed, lr and the metric's field."""

    def __init__(self, methods: Sequence[str], lrs: Sequence[float], seeds: Sequence[int],
                 train: Callable[[List[Run]], List[Dict[str, Any]]], metric: Metric, records: Records,
                 baseline: str = "fp32", max_widen: int = 3, log: Callable[[str], None] = lambda s: None) -> None:
        if baseline not in methods:
            raise ValueError(f"tuning compares with {baseline!r}: put it among the methods")
        if len(lrs) < 3:
            raise ValueError("a learning-rate grid needs at least 3 points (5 recommended, a factor 2 apart)")
        self.methods, self.seeds, self.metric = list(methods), list(seeds), metric
        self.train, self.records, self.baseline, self.max_widen, self.log = train, records, baseline, max_widen, log
        self.tried: Dict[str, List[float]] = {m: sorted(lrs) for m in methods}
        self.widened: Dict[str, int] = {m: 0 for m in methods}

    def _ensure(self, runs: Sequence[Run]) -> None:
        missing = list(dict.fromkeys(r for r in runs if self.records.get(r) is None))
        if missing:
            self.log(f"tune: training {len(missing)} run(s) ({len(runs) - len(missing)} already recorded)")
            self.records.add(self.train(missing))

    def _score(self, method: str, seed: int, lr: float) -> float:
        v = self.records.get((method, seed, lr))[self.metric.field]  # type: ignore[index]
        if not math.isfinite(v):
            return math.inf
        return v if self.metric.lower_is_better else -v

    def best_lr(self, method: str) -> float:
        """The method's best learning rate on the first seed (ties: the lower rate)."""
        s0 = self.seeds[0]
        return min(self.tried[method], key=lambda lr: (self._score(method, s0, lr), lr))

    def at_edge(self, method: str) -> Optional[str]:
        """'low' or 'high' when the best is the lowest or highest rate tried, else None."""
        best, tried = self.best_lr(method), self.tried[method]
        return "low" if best == tried[0] else "high" if best == tried[-1] else None

    def run(self) -> "Tuned":
        s0 = self.seeds[0]
        self._ensure([(m, s0, lr) for m in self.methods for lr in self.tried[m]])
        while True:
            more = []
            for m in self.methods:
                edge = self.at_edge(m)
                if edge and self.widened[m] < self.max_widen:
                    lr = self.tried[m][0] / 2 if edge == "low" else self.tried[m][-1] * 2
                    self.tried[m] = sorted(self.tried[m] + [lr])
                    self.widened[m] += 1
                    more.append((m, s0, lr))
            if not more:
                break
            self.log("tune: best at the grid's edge for " + ", ".join(f"{m} (adding {lr_key(lr)})"
                                                                      for m, _, lr in more))
            self._ensure(more)
        base_lr = self.best_lr(self.baseline)
        self._ensure([(m, s, lr) for m in self.methods for lr in dict.fromkeys([self.best_lr(m), base_lr])
                      for s in self.seeds])
        return Tuned(self)


@dataclass
class Row:
    method: str
    lr: float
    values: List[float]           # per seed
    mean: float
    delta_mean: float             # vs the baseline's mean at its best (positive: worse)
    delta_worst: float            # the worst seed vs the baseline's same seed at its best
    verdict: str                  # 'tie' (inside the baseline's spread), 'better', 'worse', 'one seed'
    record: Dict[str, Any]        # the first seed's record (bytes, extras)


class Tuned:
    """What the protocol found: best learning rates, per-seed values, the
    baseline's spread, and rows at each method's own best and at the baseline's."""

    def __init__(self, tuner: Tuner) -> None:
        self.t = tuner
        self.metric, self.seeds, self.baseline = tuner.metric, tuner.seeds, tuner.baseline
        self.best = {m: tuner.best_lr(m) for m in tuner.methods}
        self.edge = {m: tuner.at_edge(m) for m in tuner.methods}
        self.base_lr = self.best[self.baseline]
        self.base_values = self.values(self.baseline, self.base_lr)
        self.base_mean = statistics.mean(self.base_values)
        # The baseline's own seed-to-seed spread, in the metric's unit: (max - min) over the seeds.
        self.spread = (self.metric.delta(max(self.base_values), min(self.base_values)) if self.metric.lower_is_better
                       else self.metric.delta(min(self.base_values), max(self.base_values)))
        self.own = [self.row(m, self.best[m]) for m in tuner.methods]
        self.at_base = [self.row(m, self.base_lr) for m in tuner.methods]

    def record(self, method: str, seed: int, lr: float) -> Dict[str, Any]:
        r = self.t.records.get((method, seed, lr))
        assert r is not None, (method, seed, lr)
        return r

    def values(self, method: str, lr: float) -> List[float]:
        return [float(self.record(method, s, lr)[self.metric.field]) for s in self.seeds]

    def grid_values(self, method: str) -> List[Tuple[float, float]]:
        """(learning rate, value on the first seed) for every rate the method tried."""
        return [(lr, float(self.record(method, self.seeds[0], lr)[self.metric.field])) for lr in self.t.tried[method]]

    def row(self, method: str, lr: float) -> Row:
        vals = self.values(method, lr)
        mean = statistics.mean(vals)
        worst = max(self.metric.delta(v, b) for v, b in zip(vals, self.base_values))
        d = self.metric.delta(mean, self.base_mean)
        if len(self.seeds) < 2:
            verdict = "one seed"  # no spread to judge by
        else:  # a difference the tables print as 0.00 is no difference
            verdict = "tie" if abs(d) <= max(self.spread, 0.005) else ("worse" if d > 0 else "better")
        return Row(method, lr, vals, mean, d, worst, verdict, self.record(method, self.seeds[0], lr))

    def summary(self) -> Dict[str, Any]:
        def row_dict(r: Row) -> Dict[str, Any]:
            return {"method": r.method, "lr": r.lr, "values": r.values, "mean": r.mean, "delta_mean": r.delta_mean,
                    "delta_worst": r.delta_worst, "verdict": r.verdict}

        return {"metric": self.metric.field, "unit": self.metric.unit.strip(), "seeds": self.seeds,
                "baseline": self.baseline, "baseline_lr": self.base_lr, "baseline_values": self.base_values,
                "baseline_spread": self.spread,
                "grid": {m: self.grid_values(m) for m in self.t.methods},
                "best_lr": self.best, "best_at_edge": {m: e for m, e in self.edge.items() if e},
                "own_best": [row_dict(r) for r in self.own], "at_baseline_lr": [row_dict(r) for r in self.at_base]}

    def markdown(self, extra_columns: Sequence[Tuple[str, Callable[[Row], str]]] = ()) -> str:
        """The grid (first seed), then every method at its own best and at the baseline's best."""
        m, fmt = self.metric, (lambda v: f"{v:.4f}" if self.metric.relative else f"{100 * v:.2f}")
        lrs = sorted({lr for tried in self.t.tried.values() for lr in tried})
        lines = [f"Learning-rate grid, seed {self.seeds[0]}: {m.name} per peak learning rate (best in bold; "
                 "'edge': the best stayed at the edge after widening).", "",
                 "| method | " + " | ".join(lr_key(lr) for lr in lrs) + " | best |",
                 "|---|" + "---:|" * (len(lrs) + 1)]
        for method in self.t.methods:
            got = dict(self.grid_values(method))
            cells = [("**" + fmt(got[lr]) + "**" if lr == self.best[method] else fmt(got[lr])) if lr in got else ""
                     for lr in lrs]
            lines.append(f"| {method} | " + " | ".join(cells) + f" | {lr_key(self.best[method])}"
                         + (" (edge)" if self.edge[method] else "") + " |")
        seeds = ", ".join(map(str, self.seeds))
        base = (f"{self.baseline} at its best learning rate {lr_key(self.base_lr)}: "
                + " / ".join(fmt(v) for v in self.base_values) + f" (seeds {seeds}), mean {fmt(self.base_mean)}, "
                f"seed-to-seed spread {self.spread:.2f}{m.unit}")
        head = ("| method | lr | " + " / ".join(f"seed {s}" for s in self.seeds) + f" | mean | vs {self.baseline} "
                f"(mean) | worst seed vs {self.baseline} | inside {self.baseline}'s spread? |"
                + "".join(f" {name} |" for name, _ in extra_columns))
        rule = "|---|---:|---|---:|---:|---:|---|" + "---:|" * len(extra_columns)

        def table(rows: Sequence[Row]) -> List[str]:
            out = [head, rule]
            for r in rows:
                delta = "" if r.method == self.baseline else m.shown(r.delta_mean)
                worst = "" if r.method == self.baseline else m.shown(r.delta_worst)
                verdict = "" if r.method == self.baseline else {"tie": "tie", "worse": "no: worse",
                                                                "better": "no: better",
                                                                "one seed": "(one seed)"}[r.verdict]
                out.append(f"| {r.method} | {lr_key(r.lr)} | " + " / ".join(fmt(v) for v in r.values)
                           + f" | {fmt(r.mean)} | {delta} | {worst} | {verdict} |"
                           + "".join(f" {cell(r)} |" for _, cell in extra_columns))
            return out

        lines += ["", base + ". " + m.sign_note, "", "Each method at its own best learning rate:", ""]
        lines += table(self.own)
        lines += ["", f"Every method at {self.baseline}'s best learning rate ({lr_key(self.base_lr)}):", ""]
        lines += table(self.at_base)
        return "\n".join(lines) + "\n"


def tune(methods: Sequence[str], lrs: Sequence[float], seeds: Sequence[int],
         train: Callable[[List[Run]], List[Dict[str, Any]]], metric: Metric, settings: Dict[str, Any],
         records_path: Optional[str] = None, baseline: str = "fp32", max_widen: int = 3,
         log: Callable[[str], None] = lambda s: None) -> Tuned:
    """The protocol of the module doc; see Tuner."""
    records = Records(records_path, settings)
    return Tuner(methods, lrs, seeds, train, metric, records, baseline, max_widen, log).run()
