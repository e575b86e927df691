"""gradzip-sweep --train lm: the transformer experiment (gradzip.experiments.lm)
per method x rank count, one run per point; the records keep the experiment's
per-run results (validation curves included), so that the sweep writes, per
rank count, the same JSON and plot as the experiment itself
(OUT/lm_<P>ranks.json, OUT/lm_<P>ranks.png), and a table in report.md."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence


def take(points: Sequence[Any], data: dict[str, Any], on_row: Callable[[Any, dict[str, Any]], None]) -> str | None:
    """The experiment's JSON ({"settings", "results", "summary"}) -> one row per point."""
    summary = {r.get("method"): r for r in data.get("summary", [])}
    for p in points:
        r = summary.get(p.codec)
        if r is None:
            return f"no summary row for method {p.codec}"
        runs = [x for x in data.get("results", []) if x.get("method") == p.codec]
        steps = data.get("settings", {}).get("steps") or (runs[0]["steps"] if runs else 0)
        on_row(p, {
            "experiment": "lm", "val_loss": r.get("val_loss"), "val_loss_per_seed": [x["val_loss"] for x in runs],
            "seeds": [x["seed"] for x in runs], "steps": steps, "wire_bytes_run": r.get("wire_bytes"),
            "wire_bytes_per_step": r["wire_bytes"] / steps if steps and r.get("wire_bytes") else None,
            "ratio": r.get("wire_ratio"), "seconds": r.get("seconds"),
            "ok": bool(r.get("identical_on_all_ranks", True)), "lm_settings": data.get("settings", {}),
            "runs": runs,
        })
    return None


def _records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("mode") == "train" and r.get("experiment") == "lm"]


def table(records: Sequence[dict[str, Any]]) -> str:
    """The lm points: validation loss against fp32 at the same rank count and seeds, bytes."""
    rs = _records(records)
    if not rs:
        return ""
    lines = ["| ranks | method | val loss | vs fp32 | wire MB/rank (run) | ratio vs fp32 DDP | s | ranks identical |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rs, key=lambda r: r["ranks"]):
        base = next((b for b in rs if b["ranks"] == r["ranks"] and b["codec"] == "fp32"), None)
        vs = ""
        if base is not None and r["codec"] != "fp32":
            pairs = {s: v for s, v in zip(base.get("seeds", []), base.get("val_loss_per_seed", []))}
            d = [100.0 * (v / pairs[s] - 1.0) for s, v in zip(r.get("seeds", []), r.get("val_loss_per_seed", []))
                 if s in pairs]
            vs = f"{sum(d) / len(d):+.2f}%" if d else ""
        loss = r.get("val_loss")
        mb = (r.get("wire_bytes_run") or 0) / 1e6
        lines.append(f"| {r['ranks']} | `{r['codec']}` | {loss:.4f} | {vs} | {mb:.1f} | "
                     f"{(r.get('ratio') or math.nan):.1f}x | {(r.get('seconds') or 0):.0f} | {r.get('ok')} |"
                     if loss is not None else f"| {r['ranks']} | `{r['codec']}` | - | | | | | |")
    return "\n".join(lines) + "\n"


def write(records: Sequence[dict[str, Any]], folder: Path) -> list[Path]:
    """Per rank count: OUT/lm_<P>ranks.json as the experiment's --json writes it
    (settings, every run, the summary against fp32) and its --plot (needs matplotlib)."""
    from ..experiments import lm

    made: list[Path] = []
    rs = _records(records)
    for p in sorted({r["ranks"] for r in rs}):
        mine = [r for r in rs if r["ranks"] == p]
        results = [run for r in mine for run in r.get("runs", [])]
        if not results:
            continue
        path = folder / f"lm_{p}ranks.json"
        path.write_text(json.dumps({"settings": mine[0].get("lm_settings", {}), "results": results,
                                    "summary": lm.summarize(results)}, indent=1) + "\n", encoding="utf-8")
        made.append(path)
        try:
            import matplotlib  # noqa: F401
        except ModuleNotFoundError:
            continue
        lm.plot(results, str(folder / f"lm_{p}ranks.png"))
        made.append(folder / f"lm_{p}ranks.png")
    return made
