"""The sweep's plots (matplotlib, PNG, no display needed).

- speedup_vs_size.png: speedup over the uncompressed fp32 allreduce against
  the message size, one line per codec, one panel per (ranks, link); the
  gloo allreduce is drawn as a dashed line (its speedup over gradzip's fp32).
- error_vs_ratio.png: relative error of one allreduce against the
  compression ratio (wire bytes of fp32 / of the codec).
- accuracy_vs_ratio.png: --train digits: final test accuracy against the
  compression ratio of the bytes sent per step (records may carry a
  shorter "label" than their codec).
- accuracy_vs_time.png: test accuracy against training time, one line per
  method, with the accuracy to reach (bench/bmuf_digits.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Sequence

from ._registry import codec_names

_PALETTE = ("black", "tab:blue", "tab:cyan", "tab:red", "tab:green", "tab:orange", "tab:purple", "tab:brown",
            "tab:pink", "tab:olive")


def _family_color(family: str, fallback: str | None = None) -> str | None:
    """A color per registered codec, by registry order (stable across plots); gray for gloo."""
    if family == "gloo":
        return "gray"
    if family == "fp32":  # the uncompressed baseline of the training experiments
        family = "none"
    names = codec_names()
    return _PALETTE[names.index(family) % len(_PALETTE)] if family in names else fallback


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a server
    import matplotlib.pyplot as plt

    return plt


def _family(codec: str) -> str:
    """The codec's name: 'topk' for 'topk:density=0.01', 'onebit' for 'onebit@bmuf:h=16'."""
    return codec.replace(" ", ":").split(":", 1)[0].split("@", 1)[0]


_STYLES = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--")]


def _label(r: dict[str, Any]) -> str:
    alg = r["algorithm"]
    return r["codec"] if alg == "auto" else f"{r['codec']} ({alg})"


def speedup_vs_size(records: Sequence[dict[str, Any]], path: Path) -> Path | None:
    ar = [r for r in records if r.get("mode") == "allreduce" and r.get("total_ms")]
    if not ar:
        return None
    plt = _pyplot()
    panels = sorted({(r["ranks"], r["link"]) for r in ar}, key=lambda k: (k[0], _rate_key(k[1])))
    cols = min(len(panels), 2)
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.6 * rows), squeeze=False)
    for ax, (p, link) in zip(axes.flat, panels):
        mine = [r for r in ar if (r["ranks"], r["link"]) == (p, link)]
        seen: dict[str, int] = {}  # settings drawn per codec family: marker and line style
        for label in dict.fromkeys(_label(r) for r in mine):
            pts = sorted((r["elements"], r["speedup"]) for r in mine if _label(r) == label)
            fam = _family(label)
            marker, style = _STYLES[seen.get(fam, 0) % len(_STYLES)]
            seen[fam] = seen.get(fam, 0) + 1
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker=marker, linestyle=style, label=label,
                    color=_family_color(fam))
        gloo = sorted((r["elements"], r["total_ms"]) for r in records
                      if r.get("mode") == "gloo" and (r["ranks"], r["link"]) == (p, link))
        base = {r["elements"]: r["baseline_ms"] for r in mine if r.get("baseline_ms")}
        g = [(n, base[n] / t) for n, t in gloo if n in base and t]
        if g:
            ax.plot([x for x, _ in g], [y for _, y in g], "k--", marker="s", label="torch gloo (fp32)")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_plain())
        ax.yaxis.set_minor_formatter(_plain(minor=True))
        ax.set_xlabel("gradient size (floats)")
        ax.set_ylabel("speedup over fp32 allreduce")
        ax.set_title(f"{p} ranks, {link}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def error_vs_ratio(records: Sequence[dict[str, Any]], path: Path) -> Path | None:
    ar = [r for r in records if r.get("mode") == "allreduce" and r.get("ratio")]
    if not ar:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.8))
    # One point per codec setting, on the most ranks measured, at its largest
    # size (the error barely moves with size; the ratio of allgather codecs
    # moves with the rank count).
    ranks = max(r["ranks"] for r in ar)
    best: dict[str, dict[str, Any]] = {}
    for r in ar:
        k = _label(r)
        if r["ranks"] == ranks and (k not in best or r["elements"] > best[k]["elements"]):
            best[k] = r
    # Labels of neighbouring points (ratios within 40%) are staggered vertically.
    offsets = [(5, 5), (5, -11), (5, 17), (5, -23), (5, 29), (5, -35)]
    last_x, k = 0.0, 0
    for label, r in sorted(best.items(), key=lambda kv: kv[1]["ratio"]):
        err = max(r["rel_error"], 1e-9)
        k = k + 1 if last_x and r["ratio"] < 1.4 * last_x else 0
        last_x = r["ratio"]
        ax.scatter(r["ratio"], err, color=_family_color(_family(label)), s=40)
        ax.annotate(label, (r["ratio"], err), fontsize=7, xytext=offsets[k % len(offsets)],
                    textcoords="offset points")
    ax.set_title(f"error vs compression ({ranks} ranks)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(top=20 * max(max(r["rel_error"] for r in best.values()), 1e-9))  # room for the labels
    ax.set_xlabel("compression ratio (fp32 wire bytes / codec wire bytes)")
    ax.set_ylabel("relative L2 error of one allreduce (zero EF state)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy_vs_ratio(records: Sequence[dict[str, Any]], path: Path) -> Path | None:
    tr = [r for r in records if r.get("mode") == "train" and r.get("accuracy") is not None and r.get("ratio")]
    if not tr:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.8))
    offsets = [(5, 5), (5, -11), (5, 17), (5, -23)]
    last_x, k = 0.0, 0
    for r in sorted(tr, key=lambda r: (r["ratio"], -r["accuracy"])):
        k = k + 1 if last_x and r["ratio"] < 1.4 * last_x else 0
        last_x = r["ratio"]
        ax.scatter(r["ratio"], 100 * r["accuracy"], color=_family_color(_family(r["codec"]), "tab:purple"),
                   s=40)
        ax.annotate(r.get("label", r["codec"]), (r["ratio"], 100 * r["accuracy"]), fontsize=7,
                    xytext=offsets[k % len(offsets)], textcoords="offset points")
    ax.set_xscale("log")
    ax.margins(x=0.3, y=0.08)
    ax.set_xlabel("compression ratio of the bytes sent per step")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("digits: accuracy vs compression")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy_vs_time(records: Sequence[dict[str, Any]], path: Path, target: float | None = None,
                     title: str = "digits: accuracy vs training time") -> Path | None:
    """records: {"mode": "train", "codec": spec (gives the color), "label": optional,
    "curve": [(seconds, accuracy), ...]}; target: an accuracy (0-1) drawn as a dashed line."""
    tr = [r for r in records if r.get("mode") == "train" and r.get("curve")]
    if not tr:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    seen: dict[str, int] = {}  # methods drawn per codec family: marker and line style
    for r in tr:
        fam = _family(r["codec"])
        marker, style = _STYLES[seen.get(fam, 0) % len(_STYLES)]
        seen[fam] = seen.get(fam, 0) + 1
        pts = [(t, 100 * a) for t, a in r["curve"] if t > 0]
        ax.plot([t for t, _ in pts], [a for _, a in pts], linestyle=style, marker=marker, markersize=3,
                markevery=max(1, len(pts) // 12), label=r.get("label", r["codec"]),
                color=_family_color(fam, "tab:purple"))
    if target is not None:
        ax.axhline(100 * target, color="gray", linestyle="--", lw=0.8, label=f"target {100 * target:.2f}%")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(_plain())
    late = [a for r in tr for _, a in r["curve"][len(r["curve"]) // 2:]]
    ax.set_ylim(max(0.0, min(90.0, 100 * min(late) - 2)), 100)  # the approach to the target, not the first steps
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plain(minor: bool = False) -> Any:
    """Tick labels like 0.5, 2, 20 on a log axis (not 2x10^0)."""
    from matplotlib.ticker import FuncFormatter

    def fmt(y: float, _pos: int) -> str:
        if minor and not any(abs(y - m * 10 ** math.floor(math.log10(y))) < 1e-9 * y for m in (2, 5)):
            return ""
        return f"{y:g}"

    return FuncFormatter(fmt)


def _rate_key(link: str) -> float:
    from ._grid import link_rate_bps

    r = link_rate_bps(link)
    return r if r is not None else math.inf


def plot_all(records: Sequence[dict[str, Any]], folder: Path) -> list[Path]:
    """Writes every plot that has data; returns their paths. Without matplotlib
    (an optional dependency: gradzip[sweep]) none, and says so."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        print("sweep: matplotlib is not installed: no plots (pip install matplotlib, or gradzip[sweep]); the "
              "tables are in report.md", file=sys.stderr)
        return []
    made = [speedup_vs_size(records, folder / "speedup_vs_size.png"),
            error_vs_ratio(records, folder / "error_vs_ratio.png"),
            accuracy_vs_ratio(records, folder / "accuracy_vs_ratio.png")]
    return [p for p in made if p is not None]
