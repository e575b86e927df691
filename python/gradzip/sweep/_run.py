"""Runs the sweep's points as subprocesses: gradzip-run + gradzip-bench (or the
gloo baseline, or the digits or lm training) and records each point as it finishes.

Points that share ranks, link, algorithm and size run in one gradzip-bench
(it measures the fp32 baseline once per size and then every codec); the
bench appends each row to a JSON-lines file as it finishes, which is read
while the bench runs. Every subprocess runs in a session of its own with a
deadline: on timeout or Ctrl-C it gets SIGTERM (gradzip-run then stops its
ranks and removes its namespaces), then SIGKILL after a grace period.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ._grid import LOCAL, Point, fp32_link_bound_s, link_rate_bps
from ._process import stop as _stop
from ._registry import CHECKOUT, PROGRAMS, find_program
from ._results import Results


class SweepError(RuntimeError):
    """A sweep that cannot run (missing binaries, no root for --link, ...)."""


#: torch.distributed's gloo allreduce, shipped in the package; run by its path (see its docstring).
GLOO_SCRIPT = Path(__file__).resolve().parents[1] / "baselines" / "gloo_allreduce.py"


@dataclass
class Tools:
    """Where the programs are."""

    run: str                 # gradzip-run
    bench: str               # gradzip-bench
    gloo_script: str = str(GLOO_SCRIPT)
    python: str = sys.executable
    #: The digits experiment (the Python package's); it takes --ranks --methods
    #: --seeds --json [--epochs] and writes {"summary": [...]} (see _take_training).
    train_cmd: list[str] = field(default_factory=lambda: [sys.executable, "-m", "gradzip.experiments.digits"])


def find_tools(bin_dir: str | None, train_cmd: str | None = None, train: str | None = None) -> Tools:
    """gradzip-run and gradzip-bench as _registry.find_program finds them
    (--bin-dir or $GRADZIP_BIN_DIR alone, else those that came with this
    gradzip, else PATH); a SweepError names each one missing and where it looked."""
    found: dict[str, str] = {}
    missing: list[str] = []
    for name in PROGRAMS:
        path, looked = find_program(name, bin_dir)
        if path is None:
            missing.append(f"{name} (looked in: {'; '.join(looked)})")
        else:
            found[name] = path
    if missing:
        if bin_dir or os.environ.get("GRADZIP_BIN_DIR"):
            hint = "point --bin-dir (or $GRADZIP_BIN_DIR) at a folder holding both"
        elif CHECKOUT is not None:
            hint = f"build this checkout (cmake --build {CHECKOUT / 'build'}), or pass --bin-dir DIR"
        else:
            hint = ("this gradzip was installed without them: reinstall it from the repository with pip install . "
                    "(its wheel carries both), or pass --bin-dir DIR")
        raise SweepError(f"cannot find {' or '.join(missing)}: {hint}")
    if not GLOO_SCRIPT.is_file():
        raise SweepError(f"this gradzip package is incomplete: {GLOO_SCRIPT} is missing (reinstall it)")
    tools = Tools(found["gradzip-run"], found["gradzip-bench"])
    if train_cmd:
        tools.train_cmd = shlex.split(train_cmd)
    elif train == "lm":
        tools.train_cmd = [sys.executable, "-m", "gradzip.experiments.lm"]
    return tools


@dataclass
class Timing:
    """How points are measured."""

    iters: int = 3
    warmup: int = 1
    mtu: int | None = None
    burst: int | None = None
    timeout_scale: float = 1.0   # multiplies every subprocess deadline
    train_epochs: int | None = None
    train_seeds: str = "0"
    train_steps: int | None = None  # lm


def _wire_fraction(codec: str, ranks: int, algorithm: str, elements: int) -> float:
    """Roughly what share of fp32's bytes a codec sends (for the estimate only):
    its payload against 4 bytes per element, times P/2 when it is allgathered
    (every rank receives P-1 payloads; fp32's ring moves 2(P-1)/P of the buffer).
    Without the compiled extension (a checkout's own tests): 1, the longest deadline."""
    try:
        from .._core import Codec, InvalidArgument
    except ImportError:
        return 1.0
    try:
        c = Codec(codec)
    except InvalidArgument:
        return 1.0
    n = max(elements, 1 << 20)
    share = c.max_payload_bytes(n) / (4 * n)
    allgather = algorithm == "allgather" or (algorithm == "auto" and c.prefers_allgather(ranks))
    return min(1.0, share * ranks / 2) if allgather else share


def predicted_seconds(point: Point, timing: Timing) -> float:
    """A rough cost of one point, for the time-remaining estimate and the
    deadlines: per call, the link time of its bytes plus the CPU work of the
    ranks sharing the machine's cores (calibrated on the 2-core VM: the fp32
    allreduce of 100M floats on 4 ranks spends about 0.5 s in copies and sums,
    a codec about twice that), times the calls, plus start-up."""
    if point.mode == "train" and point.algorithm == "lm":  # 4 ranks, 400 steps: 1-2 minutes on 2 loaded cores
        return 150.0 * (timing.train_steps or 400) / 400 * max(point.ranks, 4) / 4
    if point.mode == "train":
        return 120.0 * (timing.train_epochs or 40) / 40
    calls = timing.iters + timing.warmup + 1
    bound = fp32_link_bound_s(point.ranks, point.elements, point.link) or 0.0
    share = max(1.0, point.ranks / max(os.cpu_count() or 1, 1))
    cpu = 1.2e-9 * point.elements * share
    if point.codec in ("none", "gloo"):
        per_call = bound + cpu
    else:
        per_call = bound * _wire_fraction(point.codec, point.ranks, point.algorithm, point.elements) + 2 * cpu
    check = 5e-9 * point.elements * point.ranks if point.mode == "allreduce" else 0.0  # the bench's error check
    return 3.0 + calls * per_call + check


def _launcher(tools: Tools, ranks: int, link: str, timing: Timing) -> list[str]:
    cmd = [tools.run, "-n", str(ranks), "--grace", "10"]
    if link != LOCAL:
        cmd += ["--link", link]
        if timing.mtu:
            cmd += ["--mtu", str(timing.mtu)]
        if timing.burst:
            cmd += ["--burst", str(timing.burst)]
    return cmd + ["--"]


@dataclass
class Group:
    """Points run by one subprocess."""

    points: list[Point]
    cmd: list[str] = field(default_factory=list)
    rows_file: str = ""
    deadline_s: float = 0.0


def plan_groups(points: Sequence[Point], tools: Tools, timing: Timing, tmp: str) -> list[Group]:
    """Groups pending points into subprocess runs, in the points' order."""
    groups: dict[tuple[Any, ...], Group] = {}
    for p in points:
        if p.mode == "allreduce":
            gk: tuple[Any, ...] = ("allreduce", p.ranks, p.link, p.algorithm, p.elements)
        elif p.mode == "gloo":
            gk = ("gloo", p.ranks, p.link)
        else:
            gk = ("train", p.ranks, p.codec)
        groups.setdefault(gk, Group([])).points.append(p)
    out = []
    for i, g in enumerate(groups.values()):
        p0 = g.points[0]
        g.rows_file = os.path.join(tmp, f"group{i}.jsonl")
        if p0.mode == "allreduce":
            g.cmd = _launcher(tools, p0.ranks, p0.link, timing) + [
                tools.bench, "--codecs", ",".join(p.codec for p in g.points), "--sizes", str(p0.elements),
                "--algorithm", p0.algorithm, "--iters", str(timing.iters), "--warmup", str(timing.warmup),
                "--jsonl", g.rows_file]
        elif p0.mode == "gloo":
            g.cmd = _launcher(tools, p0.ranks, p0.link, timing) + [
                tools.python, tools.gloo_script, "--sizes", ",".join(str(p.elements) for p in g.points),
                "--iters", str(timing.iters), "--warmup", str(timing.warmup), "--jsonl", g.rows_file]
        else:
            # One method per run: it is recorded when it finishes. A gradzip spec's
            # commas are kept together by the experiment's own --methods parsing.
            g.cmd = tools.train_cmd + ["--ranks", str(p0.ranks), "--methods", p0.codec,
                                       "--seeds", timing.train_seeds, "--json", g.rows_file]
            if timing.train_epochs and p0.algorithm != "lm":
                g.cmd += ["--epochs", str(timing.train_epochs)]
            if timing.train_steps and p0.algorithm == "lm":
                g.cmd += ["--steps", str(timing.train_steps)]
        g.deadline_s = timing.timeout_scale * (120.0 + 5.0 * sum(predicted_seconds(p, timing) for p in g.points))
        out.append(g)
    return out


def _machine() -> str:
    return f"{socket.gethostname()} ({os.cpu_count()} cpus)"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def record_for(point: Point, row: dict[str, Any]) -> dict[str, Any]:
    """A point's record: the bench's (or gloo's) row plus the grid coordinates."""
    rec: dict[str, Any] = {
        "key": point.key, "mode": point.mode, "ranks": point.ranks, "link": point.link,
        "elements": point.elements, "algorithm": point.algorithm, "codec": point.codec,
        "resolved_algorithm": row.get("algorithm"), "resolved_codec": row.get("codec"),
    }
    rec.update({k: v for k, v in row.items() if k not in ("algorithm", "codec")})
    rate = link_rate_bps(point.link)
    if rate and "wire_bytes_per_rank" in row:
        rec["link_bound_ms"] = row["wire_bytes_per_rank"] * 8 / rate * 1e3
    rec["finished_at"] = _now()
    rec["machine"] = _machine()
    return rec


def _rows(path: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines appended to `path` since `offset`."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, offset + end


def run_group(group: Group, log_path: Path, on_row: Callable[[Point, dict[str, Any]], None]) -> str | None:
    """Runs one group; calls on_row for each point as its row arrives.
    Returns None on success, else what went wrong (the log has the rest)."""
    pending = list(group.points)
    mode = pending[0].mode
    offset = 0
    extra_rows = 0

    def take(rows: list[dict[str, Any]]) -> None:
        nonlocal extra_rows
        for row in rows:
            if pending:
                on_row(pending.pop(0), row)  # rows come in the order of --codecs / --sizes
            else:
                extra_rows += 1  # the bench's fp32 baseline row, when no point asked for it
                base = group.points[0]
                if row.get("codec") == "none" and row.get("algorithm") == "scatter_reduce":
                    on_row(Point(base.ranks, base.link, base.elements, "allreduce", "scatter_reduce", "none"), row)

    with open(log_path, "ab") as log:
        log.write(f"\n### {_now()}\n### {' '.join(group.cmd)}\n".encode())
        log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(group.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        start = time.monotonic()
        try:
            while proc.poll() is None:
                if mode != "train":  # training writes one JSON document at the end
                    rows, offset = _rows(group.rows_file, offset)
                    take(rows)
                if time.monotonic() - start > group.deadline_s:
                    _stop(proc)
                    return f"timed out after {group.deadline_s:.0f} s"
                time.sleep(0.5)
        except BaseException:
            _stop(proc)
            raise
        if mode != "train":
            rows, offset = _rows(group.rows_file, offset)
            take(rows)
    if mode == "train":
        return _take_training(group, on_row) if proc.returncode == 0 else f"exited with code {proc.returncode}"
    if proc.returncode != 0:
        return f"exited with code {proc.returncode}" + (f"; {len(pending)} point(s) not measured" if pending else "")
    if pending:
        return f"{len(pending)} point(s) produced no row"
    return None


def _take_training(group: Group, on_row: Callable[[Point, dict[str, Any]], None]) -> str | None:
    """The digits experiment's JSON: {"summary": [{"method", "accuracy_mean",
    "wire_bytes_per_step", "wire_ratio", ...}], ...} (gradzip.experiments.digits)."""
    try:
        with open(group.rows_file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return f"no readable result: {e}"
    if group.points[0].algorithm == "lm":
        from ._lm import take

        return take(group.points, data, on_row)
    summary = {r.get("method"): r for r in data.get("summary", [])}
    for p in group.points:
        r = summary.get(p.codec)
        if r is None:
            return f"no summary row for method {p.codec}"
        on_row(p, {
            "accuracy": r.get("accuracy_mean"), "accuracy_per_seed": r.get("accuracy"),
            "wire_bytes_per_step": r.get("wire_bytes_per_step"), "ratio": r.get("wire_ratio"),
            "payload_bytes_per_step": r.get("payload_bytes_per_step"), "payload_ratio": r.get("payload_ratio"),
            "seconds": r.get("seconds"), "ok": bool(r.get("identical_on_all_ranks", True)),
            "seeds": r.get("seeds"), "epochs": data.get("settings", {}).get("epochs"),
        })
    return None


class Progress:
    """A one-line progress bar with time remaining on stderr, weighted by
    each point's predicted cost (a 100M-float point at 1 Gbit/s counts for
    far more than a 1M-float one), corrected by the measured pace."""

    def __init__(self, weights: dict[str, float], already: int) -> None:
        self.weights = weights
        self.total = sum(weights.values())
        self.done_w = 0.0
        self.done = 0
        self.already = already
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.failed = 0

    def update(self, key: str | None, label: str) -> None:
        if key is not None and key in self.weights:
            self.done_w += self.weights[key]
            self.done += 1
        elapsed = time.monotonic() - self.start
        left_w = max(self.total - self.done_w, 0.0)
        pace = elapsed / self.done_w if self.done_w > 0 else 1.0
        eta = left_w * pace
        width = 24
        fill = int(width * (self.done_w / self.total if self.total else 1.0))
        n = len(self.weights)
        line = (f"[{'#' * fill}{'-' * (width - fill)}] {self.done}/{n} points"
                f"{f' (+{self.already} done before)' if self.already else ''}  {_fmt(elapsed)} elapsed, "
                f"~{_fmt(eta)} left  {label}")
        if self.tty:
            sys.stderr.write("\r\033[K" + line[:200])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def _fmt(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def run_points(points: Sequence[Point], results: Results, tools: Tools, timing: Timing,
               log_path: Path) -> list[str]:
    """Runs the points not yet in `results`; returns the failures (messages)."""
    todo = [p for p in points if not results.done(p.key)]
    if any(p.mode == "gloo" for p in todo) and importlib.util.find_spec("torch") is None:
        print(f"sweep: torch is not installed for {tools.python}: skipping the gloo baseline "
              "(pip install torch; --no-gloo leaves it out)", file=sys.stderr)
        todo = [p for p in todo if p.mode != "gloo"]
    needs_root = any(p.link != LOCAL for p in todo)
    if needs_root and os.geteuid() != 0:
        raise SweepError("emulated links (--links other than 'local') need root: gradzip-run --link makes "
                         "network namespaces. Run as root, or sweep with --links local")
    progress = Progress({p.key: predicted_seconds(p, timing) for p in todo}, len(points) - len(todo))
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gradzip-sweep-") as tmp:
        groups = plan_groups(todo, tools, timing, tmp)
        progress.update(None, "starting")
        for g in groups:
            label = g.points[0].describe()
            progress.update(None, label)

            def on_row(point: Point, row: dict[str, Any]) -> None:
                if point.key in progress.weights or not results.done(point.key):
                    results.add(record_for(point, row))
                progress.update(point.key, point.describe())

            err = run_group(g, log_path, on_row)
            if err:
                failures.append(f"{label}: {err} (see {log_path})")
                progress.failed += 1
                sys.stderr.write(f"\nsweep: {failures[-1]}\n")
    progress.finish()
    return failures


def iter_records(results: Results, mode: str) -> Iterator[dict[str, Any]]:
    return (r for r in results.records if r.get("mode") == mode)
