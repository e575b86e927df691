#!/usr/bin/env python3
"""Block momentum (BMUF) against DDP on the digits experiment, on the emulated
cluster: final accuracy, bytes per rank per epoch, wall time, and the time to
reach DDP fp32's final accuracy.

    sudo build/venv/bin/python bench/bmuf_digits.py --out bench/results/bmuf          # 100 Mbit/s, seeds 0-4
    build/venv/bin/python bench/bmuf_digits.py --link local --seeds 0 --out /tmp/bmuf  # loopback, no root

Every method runs as one job of `gradzip-run -n RANKS --link LINK` (root: each
rank in its own network namespace) with all its seeds, through
`python -m gradzip.experiments.digits --launched --eval-every 1`: the same
model, batches and local SGD as the DDP runs. Methods: the DDP baselines
(--baselines: fp32 every step, and gradzip's onebit hook), then BMUF for every
--codecs x --block-steps x --block-momentum, and BMUF with overlap=on for
--overlap-codecs (at each H, with the last --block-momentum). BMUF's
exchange goes over gradzip's UCX, or with --transport torch over the gloo
group itself (BlockMomentum's default).

Time to accuracy: the target is DDP fp32's final test accuracy, averaged over
the seeds. Each method's accuracy curve (evaluated whenever the model every
rank holds changes: each step for DDP, each block end for BMUF) is averaged
over the seeds at the same steps, as is its training time; the time to the
target is the first point of that mean curve at or above it. Evaluation time
is left out of the training time. Steps to target, from the same mean
curve, do not depend on the machine's speed.

Results in --out: points.json / points.csv (one record per method and seed,
kept as each job ends; the same command again resumes, --fresh starts over),
report.md, accuracy_vs_ratio.png, accuracy_vs_time.png, run.log.
Accuracy and bytes do not depend on the machine's load; the times do, so run
it on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gradzip
from gradzip.sweep import _plots as _sweep_plots
from gradzip.sweep._results import Results
from gradzip.sweep._run import _stop, find_tools
from gradzip.experiments import digits

REPO = Path(__file__).resolve().parents[1]


def bmuf_method(codec: str, h: int, mu: str, overlap: bool = False, transport: str = "gradzip",
                options: str = "") -> str:
    """The digits experiment's method string (gradzip/experiments/_digits_bmuf.py)."""
    m = f"{codec}@bmuf:h={h}"
    if mu != "default":
        m += f",mu={mu}"
    m += ",overlap=on" if overlap else ""
    m += "" if transport == "gradzip" else f",transport={transport}"
    return m + (f",{options}" if options else "")


def methods(args: argparse.Namespace) -> List[str]:
    out = list(args.baselines)
    for mu in args.block_momentum:
        for codec in args.codecs:
            for h in args.block_steps:
                out.append(bmuf_method(codec, h, mu, transport=args.transport, options=args.bmuf_options))
    for codec in args.overlap_codecs:
        for h in args.block_steps:
            out.append(bmuf_method(codec, h, args.block_momentum[-1], overlap=True, transport=args.transport,
                                   options=args.bmuf_options))
    return list(dict.fromkeys(out))


def key(link: str, method: str, seed: int) -> str:
    return f"bmuf-digits/{link}/{method}/seed{seed}"


def run_method(method: str, seeds: List[int], args: argparse.Namespace, tools: Any, log: Any) -> List[Dict[str, Any]]:
    """One gradzip-run job: the method with every seed; returns the per-seed records."""
    with tempfile.TemporaryDirectory(prefix="gradzip-bmuf-") as tmp:
        out = os.path.join(tmp, "out.json")
        cmd = [tools.run, "-n", str(args.ranks), "--grace", "10"]
        if args.link != "local":
            cmd += ["--link", args.link]
        cmd += ["--", sys.executable, "-m", "gradzip.experiments.digits", "--launched", "--methods", method,
                "--seeds", ",".join(map(str, seeds)), "--eval-every", "1", "--json", out]
        if args.epochs:
            cmd += ["--epochs", str(args.epochs)]
        log.write(f"\n### {_now()}\n### {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + args.timeout_per_seed * len(seeds) + 120
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    _stop(proc)
                    raise RuntimeError(f"{method}: timed out (see {log.name})")
                time.sleep(0.5)
        except BaseException:
            _stop(proc)
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"{method}: exited with code {proc.returncode} (see {log.name})")
        with open(out, encoding="utf-8") as f:
            data = json.load(f)
    meta = _meta()
    return [{"key": key(args.link, method, r["seed"]), "mode": "digits", "ranks": r["ranks"], "link": args.link,
             "codec": method, "seed": r["seed"], "accuracy": r["test_accuracy"],
             "wire_bytes_per_step": r["wire_bytes_per_step"], "finished_at": _now(), "machine": meta["machine"],
             "commit": meta["commit"], "epochs": data["settings"]["epochs"], "result": r}
            for r in data["results"]]


def mean_curve(results: List[Dict[str, Any]]) -> List[Tuple[float, float, int]]:
    """(mean training seconds, mean accuracy, step) at the evaluation steps every seed has."""
    by_step: Dict[int, List[Tuple[float, float]]] = {}
    for r in results:
        for t, step, acc in r["extra"]["curve"]:
            by_step.setdefault(step, []).append((t, acc))
    full = sorted(s for s, pts in by_step.items() if len(pts) == len(results))
    return [(statistics.mean(t for t, _ in by_step[s]), statistics.mean(a for _, a in by_step[s]), s) for s in full]


def time_to(curve: List[Tuple[float, float, int]], target: float) -> Optional[float]:
    hit = first_at(curve, target)
    return None if hit is None else hit[0]


def first_at(curve: List[Tuple[float, float, int]], target: float) -> Optional[Tuple[float, float, int]]:
    """The first point of the mean curve at or above the target."""
    return next((point for point in curve if point[1] >= target - 1e-9), None)


def summarize(records: List[Dict[str, Any]], order: List[str], baseline: str) -> Tuple[List[Dict[str, Any]], float]:
    """digits.summarize's rows (accuracy, bytes per step) plus bytes per epoch,
    wall time, time to the target and the ratios against the baseline."""
    records = sorted((r for r in records if r["codec"] in order), key=lambda r: (order.index(r["codec"]), r["seed"]))
    results = [r["result"] for r in records]
    epochs = {r["codec"]: r["epochs"] for r in records}
    rows = digits.summarize(results)
    base = [r for r in results if r["method"] == baseline]
    target = statistics.mean(r["test_accuracy"] for r in base)
    base_row = next(row for row in rows if row["method"] == baseline)
    for row in rows:
        rs = [r for r in results if r["method"] == row["method"]]
        steps_per_epoch = rs[0]["steps"] / epochs[row["method"]]
        row["steps_per_epoch"] = steps_per_epoch
        row["wire_bytes_per_epoch"] = row["wire_bytes_per_step"] * steps_per_epoch
        row["accuracy_delta_mean"] = 100 * (row["accuracy_mean"] - base_row["accuracy_mean"])
        row["curve"] = mean_curve(rs)
        hit = first_at(row["curve"], target)
        row["time_to_target"], row["steps_to_target"] = (None, None) if hit is None else (hit[0], hit[2])
        row.update({k: rs[0]["extra"].get(k) for k in ("block_steps", "block_momentum", "overlap")})
    for row in rows:
        row["bytes_ratio"] = base_row["wire_bytes_per_epoch"] / row["wire_bytes_per_epoch"]
        t, t0 = row["time_to_target"], base_row["time_to_target"]
        row["time_speedup"] = t0 / t if t and t0 else None
        row["wall_speedup"] = base_row["seconds"] / row["seconds"]
    return rows, target


def markdown(rows: List[Dict[str, Any]], target: float, args: argparse.Namespace, records: List[Dict[str, Any]]) -> str:
    s = digits.Settings(epochs=args.epochs or digits.Settings.epochs)
    seeds = rows[0]["seeds"]
    machines = ", ".join(sorted({r["machine"] for r in records}))
    commits = ", ".join(f"`{c}`" for c in sorted({r["commit"] for r in records}))
    when = sorted(r["finished_at"] for r in records)
    lines = [
        f"# BMUF on digits, {args.ranks} ranks, link {args.link}",
        "",
        f"{machines}; {when[0]} to {when[-1]}; commit {commits}. {digits.describe(s, args.ranks, seeds)} "
        f"BMUF: that SGD is each rank's local optimizer. Target: DDP fp32's final accuracy, mean over the "
        f"seeds: **{100 * target:.2f}%**. Bytes: what one rank puts on the wire (DDP: a ring, modelled; "
        f"BMUF: counted by the communicator). Times: training only (evaluations left out), mean over the seeds.",
        "",
        "| method | H | mu | test accuracy % (per seed) | mean | vs fp32: mean / worst seed (points) "
        "| wire B/rank/epoch | fewer bytes than fp32 | steps to target | train time (s) | time to target (s) "
        "| faster than fp32 |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        accs = digits.per_seed(r["accuracy"])
        delta = "" if r["method"] == args.baselines[0] else \
            f"{r['accuracy_delta_mean']:+.2f} / {r['delta_points_worst']:+.2f}"
        ttt = "not reached" if r["time_to_target"] is None else f"{r['time_to_target']:.2f}"
        stt = "" if r["steps_to_target"] is None else str(r["steps_to_target"])
        speed = "" if r["time_speedup"] is None else f"{r['time_speedup']:.1f}x"
        h = r["block_steps"] or ""
        mu = "" if r["block_momentum"] is None else f"{r['block_momentum']:g}"
        lines.append(
            f"| {r['method']} | {h} | {mu} | {accs} | {100 * r['accuracy_mean']:.2f} | {delta} | "
            f"{r['wire_bytes_per_epoch']:,.0f} | {r['bytes_ratio']:,.1f}x | {stt} | {r['seconds']:.2f} | {ttt} | "
            f"{speed} |")
    return "\n".join(lines) + "\n"


def _label(row: Dict[str, Any], baselines: List[str]) -> str:
    if row["method"] in baselines:
        return f"DDP {row['method']}" + ("" if row["method"] == "fp32" else " hook")
    spec = row["method"].partition("@")[0]
    return f"BMUF {spec} H={row['block_steps']}" + (" overlap" if row["overlap"] else "")


def plots(rows: List[Dict[str, Any]], target: float, args: argparse.Namespace, out: Path) -> List[Path]:
    """Both plots show the baselines and BMUF at the last block momentum (the
    grid's tuned value); the time plot BMUF with the first codec that is not
    none (the headline), with and without overlap."""
    mu = args.block_momentum[-1]
    tuned = {bmuf_method(c, h, mu, o, args.transport, args.bmuf_options)
             for c in args.codecs + args.overlap_codecs for h in args.block_steps for o in (False, True)}
    headline = next((c for c in args.codecs if c != "none"), args.codecs[0])
    timed = set(args.baselines) | {bmuf_method(headline, h, mu, o, args.transport, args.bmuf_options)
                                   for h in args.block_steps for o in (False, True)}
    ratio = [{"mode": "train", "codec": r["method"], "label": _label(r, args.baselines),
              "accuracy": r["accuracy_mean"], "ratio": r["bytes_ratio"]}
             for r in rows if r["method"] in tuned or r["method"] in args.baselines]
    curves = [{"mode": "train", "codec": r["method"], "label": _label(r, args.baselines),
               "curve": [(t, a) for t, a, _ in r["curve"]]} for r in rows if r["method"] in timed]
    made = [_sweep_plots.accuracy_vs_ratio(ratio, out / "accuracy_vs_ratio.png"),
            _sweep_plots.accuracy_vs_time(curves, out / "accuracy_vs_time.png", target,
                                          f"digits, {args.ranks} ranks at {args.link}: mean of {len(args.seeds)} seeds")]
    return [p for p in made if p is not None]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _meta() -> Dict[str, str]:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = next(line for line in info.splitlines() if line.startswith("flags")).split()
        isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
        model = f"{model}, {os.cpu_count()} CPUs, {isa}"
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "?"
    return {"machine": model, "commit": commit}


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--link", default="100mbit", help="gradzip-run --link RATE, or 'local' (default 100mbit)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--codecs", default="none,onebit,topk:density=0.01,qsgd:bits=4",
                    help="BMUF codec specs, comma-separated (default none,onebit,topk:density=0.01,qsgd:bits=4)")
    ap.add_argument("--block-steps", default="4,16,64", help="H values (default 4,16,64)")
    ap.add_argument("--block-momentum", default="default,0.5",
                    help="block momentum values; 'default' is the paper's 1 - 1/P (default default,0.5)")
    ap.add_argument("--overlap-codecs", default="onebit",
                    help="codecs also run with overlap=on, at each H with the last block momentum ('' for none)")
    ap.add_argument("--transport", choices=("gradzip", "torch"), default="gradzip",
                    help="what carries BMUF's exchange: gradzip's UCX (default; what BENCHMARKS.md section 7 "
                         "measured) or the gloo group itself (BlockMomentum's own default)")
    ap.add_argument("--bmuf-options", default="",
                    help="more BlockMomentum options for every BMUF method, as in its method string, e.g. "
                         "algorithm=scatter_reduce,server=onebit")
    ap.add_argument("--baselines", default="fp32,onebit",
                    help="DDP methods, the first being the reference (default fp32,onebit: DDP fp32, and "
                         "gradzip's onebit hook)")
    ap.add_argument("--epochs", type=int, default=None, help="default: the experiment's (40)")
    ap.add_argument("--timeout-per-seed", type=float, default=120.0)
    ap.add_argument("--out", default="bmuf-out")
    ap.add_argument("--bin-dir", help="folder with gradzip-run (default: $GRADZIP_BIN_DIR, build/bin)")
    ap.add_argument("--fresh", action="store_true", help="forget what --out holds and start over")
    ap.add_argument("--report-only", action="store_true", help="write report.md and the plots from what is recorded")
    args = ap.parse_args(argv)
    args.codecs = gradzip.split_spec_list(args.codecs)
    args.overlap_codecs = gradzip.split_spec_list(args.overlap_codecs) if args.overlap_codecs else []
    args.baselines = digits._split_methods(args.baselines)
    args.block_steps = [int(h) for h in args.block_steps.split(",")]
    args.block_momentum = [m.strip() for m in args.block_momentum.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.fresh:
        for name in ("points.json", "points.csv"):
            (out / name).unlink(missing_ok=True)
    results = Results(out).load()
    order = methods(args)
    if not args.report_only:
        if args.link != "local" and os.geteuid() != 0:
            print("bmuf_digits: --link needs root (gradzip-run makes network namespaces); or --link local",
                  file=sys.stderr)
            return 2
        tools = find_tools(args.bin_dir)
        start = time.monotonic()
        with open(out / "run.log", "a", encoding="utf-8") as log:
            for i, method in enumerate(order):
                todo = [s for s in args.seeds if not results.done(key(args.link, method, s))]
                if not todo:
                    continue
                print(f"[{i + 1}/{len(order)}] {method} seeds {todo} ({time.monotonic() - start:.0f} s so far)",
                      file=sys.stderr, flush=True)
                for record in run_method(method, todo, args, tools, log):
                    results.add(record)
    mine = [r for r in results.records if r.get("mode") == "digits" and r.get("link") == args.link
            and r.get("seed") in args.seeds]
    if not mine:
        print(f"bmuf_digits: nothing recorded in {out} for link {args.link}", file=sys.stderr)
        return 1
    rows, target = summarize(mine, order, args.baselines[0])
    table = markdown(rows, target, args, mine)
    (out / "report.md").write_text(table, encoding="utf-8")
    (out / "summary.json").write_text(json.dumps({"target": target, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    made = plots(rows, target, args, out)
    print(table)
    print(f"bmuf_digits: wrote {out / 'report.md'}, {out / 'summary.json'}, " + ", ".join(map(str, made)),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
