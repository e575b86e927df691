#!/usr/bin/env python3
"""The report of bench/cluster/engine_targets.sh: issue 16's C++ targets, met or missed.

    python3 bench/cluster/engine_targets.py OUT_DIR

Reads the gradzip-bench and gloo JSON records the script wrote and prints a
markdown report: the machine, the commit, one line per target with the
measured value, and the rows behind them.
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

RATE = 1e9  # 1 Gbit/s


def load(out: Path, name: str) -> list[dict]:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else []


def row(rows: list[dict], codec: str, elements: int, algorithm: str | None = None) -> dict | None:
    """The record of `codec` (a prefix of its canonical spec) at `elements`."""
    for r in rows:
        if r["codec"].startswith(codec) and r["elements"] == elements and algorithm in (None, r["algorithm"]):
            return r
    return None


def link_bound_ms(ranks: int, n: int) -> float:
    return 2 * (ranks - 1) / ranks * 4 * n * 8 / RATE * 1e3


def machine() -> str:
    model, flags = "unknown cpu", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and model == "unknown cpu":
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    isa += " + F16C" if "f16c" in flags else ""
    cpus = sum(1 for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("processor"))
    return f"{model} ({isa}), {cpus} CPUs, Linux {platform.release()}"


def commit() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + (" (with local changes)" if dirty else "")
    except OSError:
        return "unknown"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def main(out: Path) -> int:
    lines = [f"Machine: {machine()}; commit {commit()}; results in `{out}`.", ""]
    loads = [l for l in (out / "runs.log").read_text().splitlines() if "load average" in l] \
        if (out / "runs.log").exists() else []
    if loads:
        lines += ["Load before each run: " + "; ".join(l.split("load average:")[1].strip() for l in loads), ""]
    lines += ["| target | measured | |", "|---|---|---|"]
    n = 100_000_000

    two, two_fp32, two_gloo = load(out, "two-bench"), load(out, "two-fp32"), load(out, "two-gloo")
    base = row(two, "none", n, "scatter_reduce")
    if base:
        for codec, want in (("onebit", 22.0), ("topk:density=0.01", 22.0), ("fp16", 1.95)):
            r = row(two, codec, n)
            if r:
                lines.append(f"| 2 ranks, 100M: {codec} >= {want}x over gradzip fp32 | {r['speedup']:.2f}x "
                             f"({r['total_ms']:.0f} ms vs {base['total_ms']:.0f} ms) | {verdict(r['speedup'] >= want)} |")
    for size in (4194304, 16777216, n):
        fp32 = row(two_fp32 if size != n else two, "none", size, "scatter_reduce")
        g = row(two_gloo, "gloo", size)
        if fp32:
            bound = link_bound_ms(2, size)
            lines.append(f"| 2 ranks, {size:,}: fp32 <= 1.05x link bound ({bound:.0f} ms) | "
                         f"{fp32['total_ms'] / bound:.3f}x ({fp32['total_ms']:.0f} ms) | "
                         f"{verdict(fp32['total_ms'] <= 1.05 * bound)} |")
        if fp32 and g:
            lines.append(f"| 2 ranks, {size:,}: fp32 no slower than gloo | gradzip {fp32['total_ms']:.0f} ms, gloo "
                         f"{g['total_ms']:.0f} ms ({g['total_ms'] / fp32['total_ms']:.3f}x) | "
                         f"{verdict(fp32['total_ms'] <= g['total_ms'])} |")

    four, four_gloo = load(out, "four-bench"), load(out, "four-gloo")
    base4 = row(four, "none", n, "scatter_reduce")
    g4 = row(four_gloo, "gloo", n)
    if base4:
        for codec in ("onebit", "topk:density=0.01"):
            r = row(four, codec, n)
            if r:
                vs_gloo = f", {g4['total_ms'] / r['total_ms']:.2f}x over gloo" if g4 else ""
                lines.append(f"| 4 ranks, 100M: {codec} >= 12x over gradzip fp32 | {r['speedup']:.2f}x "
                             f"({r['total_ms']:.0f} ms: encode {r['encode_ms']:.0f}, decode {r['decode_ms']:.0f}, "
                             f"wait {r.get('wait_ms', 0):.0f}{vs_gloo}) | {verdict(r['speedup'] >= 12)} |")
        bound = link_bound_ms(4, n)
        lines.append(f"| 4 ranks, 100M: fp32 vs link bound ({bound:.0f} ms) and gloo | {base4['total_ms'] / bound:.3f}x"
                     + (f", gloo {g4['total_ms']:.0f} ms" if g4 else "") + " | |")

    flat, hier = row(load(out, "nodes-flat"), "onebit", 25_600_000, "scatter_reduce"), \
        row(load(out, "nodes-hier"), "onebit", 25_600_000, "hierarchical")
    if flat and hier:
        ratio = flat["total_ms"] / hier["total_ms"]
        lines.append(f"| 2 nodes x 2 ranks, 25.6M: hierarchical onebit >= 1.5x flat scatter_reduce, error no larger | "
                     f"{ratio:.2f}x ({hier['total_ms']:.0f} vs {flat['total_ms']:.0f} ms); error {hier['rel_error']:.3f} "
                     f"vs {flat['rel_error']:.3f} | {verdict(ratio >= 1.5 and hier['rel_error'] <= flat['rel_error'])} |")

    lines += ["", "| run | elements | codec | algorithm | wire B/rank | encode ms | decode ms | comm ms | wait ms "
              "| hidden | segments | total ms | speedup | rel. error |", "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("two-bench", "two-fp32", "two-gloo", "four-bench", "four-gloo", "nodes-flat", "nodes-hier"):
        for r in load(out, name):
            lines.append(f"| {name} | {r['elements']:,} | `{r['codec']}` | {r['algorithm']} | {r['wire_bytes_per_rank']:,} "
                         f"| {r.get('encode_ms', 0):.0f} | {r.get('decode_ms', 0):.0f} | {r.get('comm_ms', 0):.0f} "
                         f"| {r.get('wait_ms', 0):.0f} | {100 * r.get('hidden', 0):.0f}% | {r.get('segments', 0)} "
                         f"| {r['total_ms']:.0f} | {r.get('speedup', 0):.2f} | {r.get('rel_error', 0):.2e} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
