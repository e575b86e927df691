"""gradzip-sweep: a grid of codec settings x algorithms x sizes x ranks x link
speeds, measured on an emulated cluster, written to CSV/JSON as each point
finishes, with plots and markdown tables.

    python -m gradzip.sweep --codecs "none,fp16,onebit:block=256,1024,topk:density=0.1,0.01" \\
        --sizes 1M,16M,64M --ranks 4 --links 1gbit,10gbit --out sweep-out
    python -m gradzip.sweep --config bench/cluster/headline.toml
    python -m gradzip.sweep --config ... --report-only      # tables and plots from what is recorded

Every point runs under ``gradzip-run --link`` (root needed; ``--links local``
for plain local ranks). gradzip-run and gradzip-bench are the ones installed
with this gradzip (``pip install .`` puts them next to gradzip-sweep), so the
sweep runs from any directory; ``--bin-dir`` picks others. Run the same command again after an interrupt:
points already in OUT/points.json are skipped. Results: OUT/points.json,
OUT/points.csv, OUT/report.md, OUT/*.png, and OUT/sweep.log (subprocess output).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from ._grid import Grid, GridError, make_grid
from ._plots import plot_all
from ._registry import default_codecs
from ._results import Results
from ._run import SweepError, Timing, find_tools, run_points
from ._table import report

DEFAULTS: dict[str, Any] = {
    "codecs": None,  # every codec's first benchmark spec (_registry.default_codecs)
    "algorithms": ["auto"],
    "sizes": ["1M", "4M", "16M"],
    "ranks": [4],
    "links": ["1gbit"],
    "iters": 3,
    "warmup": 1,
    "gloo": True,
    "out": "sweep-out",
    "mtu": None,
    "burst": None,
    "timeout_scale": 1.0,
    "train": None,
    "train_ranks": 4,
    "train_epochs": None,
    "train_steps": None,
    "train_seeds": "0",
    "train_cmd": None,
    "compute_ms": [100.0, 300.0],
    "overlap": 0.0,
    "title": "",
}

_LISTS = ("algorithms", "sizes", "ranks", "links", "compute_ms")


def _load_toml(path: str) -> dict[str, Any]:
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # the package supports 3.9: tomli is the same parser
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise GridError("--config needs Python >= 3.11 (tomllib) or the tomli package") from None
    with open(path, "rb") as f:
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise GridError(f"{path}: {e}") from None


def _split(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [value]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gradzip-sweep", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--config", help="TOML file with these settings (keys as the flags, '-' -> '_'); "
                                     "flags given here win")
    ap.add_argument("--codecs", help="spec grid, e.g. 'topk:density=0.1,0.01,onebit:block=256,1024' "
                                     "(default: every codec's first benchmark spec, as gradzip-bench's default)")
    ap.add_argument("--algorithms", help="auto, allgather, scatter_reduce (comma-separated; default auto)")
    ap.add_argument("--sizes", help="element counts: 1048576, 16M (K/M/G = 1024^k), 25.6e6 (default 1M,4M,16M)")
    ap.add_argument("--ranks", help="rank counts (default 4)")
    ap.add_argument("--links", help="gradzip-run --link values, e.g. 1gbit,10gbit, or 'local' (default 1gbit)")
    ap.add_argument("--iters", type=int, help="timed calls per point (default 3)")
    ap.add_argument("--warmup", type=int, help="untimed calls per point (default 1)")
    ap.add_argument("--gloo", action=argparse.BooleanOptionalAction, default=None,
                    help="also time torch.distributed's gloo allreduce per (ranks, link, size) (default on)")
    ap.add_argument("--mtu", type=int, help="link MTU for gradzip-run (default: its own, 9000)")
    ap.add_argument("--burst", type=int, help="tbf bucket bytes for gradzip-run (default: its own)")
    ap.add_argument("--timeout-scale", type=float, help="multiply every subprocess deadline")
    ap.add_argument("--train", choices=["digits", "lm"],
                    help="train with every codec setting or method instead (digits: accuracy vs bytes; lm: the "
                         "transformer's validation loss vs bytes, methods as gradzip.experiments.lm's --methods)")
    ap.add_argument("--train-ranks", help="rank counts of the training runs, e.g. 4 or 2,4,8 (default 4)")
    ap.add_argument("--train-epochs", type=int, help="epochs of the digits runs (default: the experiment's)")
    ap.add_argument("--train-steps", type=int, help="steps of the lm runs (default: the experiment's)")
    ap.add_argument("--train-seeds", help="seeds of the training runs, e.g. 0,1,2 (default 0)")
    ap.add_argument("--train-cmd", help="the training command (default: python -m gradzip.experiments.<--train>)")
    ap.add_argument("--compute-ms", help="compute times per step for the scaling-efficiency model (default 100,300)")
    ap.add_argument("--overlap", type=float, help="fraction of compute the allreduce can hide behind (default 0)")
    ap.add_argument("--out", help="results folder (default sweep-out)")
    ap.add_argument("--bin-dir", help="folder with the gradzip-run and gradzip-bench to use (default: "
                                      "$GRADZIP_BIN_DIR, else those installed with this gradzip, or a checkout's "
                                      "build/bin, else PATH)")
    ap.add_argument("--title", help="title of report.md")
    ap.add_argument("--fresh", action="store_true", help="forget the points recorded in --out and start over")
    ap.add_argument("--dry-run", action="store_true", help="list the points (and which are done), run nothing")
    ap.add_argument("--report-only", action="store_true", help="write report.md and the plots from recorded points")
    return ap.parse_args(argv)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Defaults, then the TOML file ([sweep] table or top level), then the flags."""
    s = dict(DEFAULTS)
    if args.config:
        data = _load_toml(args.config)
        data = data.get("sweep", data)
        unknown = sorted(set(k.replace("-", "_") for k in data) - set(DEFAULTS))
        if unknown:
            raise GridError(f"{args.config}: unknown setting(s) {', '.join(unknown)}; valid: {', '.join(DEFAULTS)}")
        s.update({k.replace("-", "_"): v for k, v in data.items()})
    for k in DEFAULTS:
        v = getattr(args, k, None)
        if v is not None:
            s[k] = v
    if s["codecs"] is None:
        s["codecs"] = default_codecs()
    for k in _LISTS:
        s[k] = _split(s[k])
    s["compute_ms"] = [float(c) for c in s["compute_ms"]]
    return s


def build_grid(s: dict[str, Any]) -> Grid:
    return make_grid(s["codecs"], s["algorithms"], s["sizes"], s["ranks"], s["links"], bool(s["gloo"]),
                     s["train"], s["train_ranks"])


def write_report(results: Results, grid: Grid, s: dict[str, Any], out: Path) -> list[Path]:
    from . import _lm

    text = report(results.records, s["compute_ms"], float(s["overlap"]), grid.codecs, s["title"])
    lm = _lm.table(results.records)
    if lm:
        text += "\n## Training (lm)\n\nThe transformer (gradzip.experiments.lm); per rank count the experiment's " \
                "JSON and plot: lm_<P>ranks.json, lm_<P>ranks.png.\n\n" + lm
    (out / "report.md").write_text(text, encoding="utf-8")
    return [out / "report.md"] + plot_all(results.records, out) + _lm.write(results.records, out)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        s = settings(args)
        grid = build_grid(s)
    except (GridError, OSError, ValueError) as e:
        print(f"gradzip-sweep: {e}", file=sys.stderr)
        return 2
    out = Path(s["out"])
    if args.fresh and out.exists():
        for name in ("points.json", "points.csv", "sweep.log"):
            (out / name).unlink(missing_ok=True)
    results = Results(out).load()
    points = grid.points()
    timing = Timing(iters=int(s["iters"]), warmup=int(s["warmup"]), mtu=s["mtu"], burst=s["burst"],
                    timeout_scale=float(s["timeout_scale"]), train_epochs=s["train_epochs"],
                    train_seeds=str(s["train_seeds"]), train_steps=s["train_steps"])
    meta = {"grid": asdict(grid), "timing": asdict(timing)}
    meta_path = out / "sweep.json"
    if meta_path.exists() and not args.fresh and not args.report_only:
        old = json.loads(meta_path.read_text(encoding="utf-8"))
        if old.get("timing") != meta["timing"]:
            print(f"gradzip-sweep: note: {out} holds points measured with {old.get('timing')}; new points use "
                  f"{meta['timing']} (--fresh starts over)", file=sys.stderr)

    if args.dry_run:
        for p in points:
            print(f"{'done' if results.done(p.key) else 'todo'}  {p.describe()}")
        return 0
    failures: list[str] = []
    if not args.report_only:
        meta_path.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        try:
            tools = find_tools(args.bin_dir, s["train_cmd"], s["train"])
            failures = run_points(points, results, tools, timing, out / "sweep.log")
        except SweepError as e:
            print(f"gradzip-sweep: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"\ngradzip-sweep: interrupted; {len(results.records)} point(s) are in {out}/points.json. "
                  "Run the same command again to resume.", file=sys.stderr)
            return 130
    made = write_report(results, grid, s, out) if results.records else []
    for f in failures:
        print(f"gradzip-sweep: FAILED {f}", file=sys.stderr)
    done = sum(results.done(p.key) for p in points)
    print(f"gradzip-sweep: {done}/{len(points)} points recorded in {out}/points.json and points.csv"
          + (f"; wrote {', '.join(str(m) for m in made)}" if made else ""))
    return 1 if failures else 0

