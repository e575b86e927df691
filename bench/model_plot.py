"""The scale plot of issue 23: the cost model's speedup over the fp32
allreduce against ranks and link rate (gradzip-model), with the speedups
measured on the emulated cluster drawn on it.

    python bench/model_plot.py --model build/bin/gradzip-model \
        --cpu-rates file:bench/results/costmodel/epyc-quiet-rates.txt \
        --points bench/results/costmodel/measured-points.json --out bench/results/costmodel/scale.png

Rows: one rank per node (auto among allgather and scatter_reduce) and 8
ranks per node (hierarchical allowed); columns: the codec rates (this CPU,
H100, H200). Lines: onebit (solid) and topk 1% (dashed), one colour per link
rate. Points: speedups measured on the emulated cluster (--points: a JSON
list of {layout, link, codec, ranks, speedup}; or --measured: the 16M rows of
a bench/cluster/costmodel_table.sh run), drawn on the CPU column.
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LINKS = ["1gbit", "10gbit", "25gbit", "100gbit"]
COLOURS = {"1gbit": "tab:blue", "10gbit": "tab:orange", "25gbit": "tab:green", "100gbit": "tab:red"}
CODECS = {"onebit:block=512": ("onebit", "-", "o"), "topk:density=0.01": ("topk 1%", "--", "s")}


def model_rows(model: str, size: int, compute_ms: float, cpu_rates: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "model.csv"
        subprocess.run([model, "--codecs", ",".join(CODECS), "--links", ",".join(LINKS), "--size", str(size),
                        "--rates", f"{cpu_rates},h100,h200", "--compute-ms", str(compute_ms), "--csv", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
        with out.open() as f:
            rows = list(csv.DictReader(f))
    for r in rows:
        if r["rates"] not in ("h100", "h200"):
            r["rates"] = "cpu"
    return rows


def measured_points(folder: Path | None) -> dict:
    """(layout, link, codec) -> [(ranks, speedup)] from costmodel_table.sh's JSON."""
    points = defaultdict(list)
    if folder is None:
        return points
    for key, layout in (("two", "1/node"), ("four", "1/node"), ("nodes", "8/node")):
        for link in ("1gbit", "10gbit"):
            path = folder / f"{key}-{link}.json"
            if not path.exists():
                continue
            for r in json.loads(path.read_text()):
                if r["codec"] in CODECS and r["elements"] == SIZE[0]:
                    points[(layout, link, r["codec"])].append((r["ranks"], r["speedup"]))
    return points


SIZE = [16777216]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="build/bin/gradzip-model")
    ap.add_argument("--measured", type=Path, help="an OUT_DIR of bench/cluster/costmodel_table.sh")
    ap.add_argument("--points", type=Path, help="a JSON list of {layout, link, codec, ranks, speedup}")
    ap.add_argument("--cpu-rates", default="cpu", help="gradzip-model's --rates for the CPU column (default cpu)")
    ap.add_argument("--size", type=int, default=SIZE[0], help="gradient elements (default 16M, as --measured's rows)")
    ap.add_argument("--compute-ms", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=Path("scale.png"))
    a = ap.parse_args()
    SIZE[0] = a.size
    rows = model_rows(a.model, a.size, a.compute_ms, a.cpu_rates)
    points = measured_points(a.measured)
    if a.points:
        for p in json.loads(a.points.read_text()):
            points[(p["layout"], p["link"], p["codec"])].append((p["ranks"], p["speedup"]))
    sources = [s for s in ("cpu", "h100", "h200") if any(r["rates"] == s for r in rows)]
    layouts = ["1/node", "8/node"]
    fig, axes = plt.subplots(len(layouts), len(sources), figsize=(5 * len(sources), 4.2 * len(layouts)),
                             sharex=True, sharey=True, squeeze=False)
    for i, layout in enumerate(layouts):
        for j, src in enumerate(sources):
            ax = axes[i][j]
            for codec, (label, style, marker) in CODECS.items():
                for link in LINKS:
                    sel = [r for r in rows if r["rates"] == src and r["codec"] == codec and r["layout"] == layout
                           and r["link"] == link]
                    if not sel:
                        continue
                    xs = [int(r["ranks"]) for r in sel]
                    ys = [float(r["speedup"]) for r in sel]
                    ax.plot(xs, ys, style, color=COLOURS[link], label=f"{label}, {link}")
                    if src == "cpu":
                        for ranks, speedup in points.get((layout, link, codec), []):
                            ax.plot([ranks], [speedup], marker, color=COLOURS[link], markersize=8,
                                    markeredgecolor="black")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.axhline(1, color="grey", linewidth=0.8)
            ax.set_title(f"{src.upper() if src != 'cpu' else 'this CPU (1 core/rank)'}, {layout}")
            ax.grid(True, which="both", alpha=0.3)
            if i == len(layouts) - 1:
                ax.set_xlabel("ranks")
            if j == 0:
                ax.set_ylabel("speedup over the fp32 allreduce")
    axes[-1][0].legend(fontsize=7, ncol=2, loc="lower left")
    fig.suptitle(f"gradzip cost model: speedup of the allreduce of {a.size / 1e6:.0f}M floats over fp32; "
                 f"markers: measured on the emulated cluster ({a.points.name if a.points else 'none'})", fontsize=10)
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
