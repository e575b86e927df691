"""The cost model's table from bench/cluster/costmodel_table.sh's OUT_DIR:
predicted against measured for every row, and the memory-traffic limit rows.

    python bench/cluster/costmodel_table.py OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def layout_of(name: str) -> tuple[int, str]:
    """costmodel_table.sh's file names: r<N>-<algorithm>-<link>, nodes-<algorithm>-<link>."""
    head = name.split("-", 1)[0]
    return (4, "2 nodes x 2") if head == "nodes" else (int(head[1:]), f"{head[1:]} ranks")


def main(out: Path) -> None:
    print((out / "machine.txt").read_text().strip().replace("\n", "; "))
    print()
    print("| layout | link | floats | codec | algorithm | measured ms | predicted ms | error | fit ms | fit error "
          "| limit ms | measured / limit |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    within, total, fit_within, below = 0, 0, 0, 0
    groups: dict[str, list[int]] = {}
    files = sorted(out.glob("*.json"), key=lambda p: (p.stem.rsplit("-", 1)[-1], layout_of(p.stem), p.stem))
    for path in files:
        if path.stem == "limit":
            continue
        link = path.stem.rsplit("-", 1)[-1]
        _, layout = layout_of(path.stem)
        for r in rows(path):
            if not r.get("predicted_ms"):
                continue
            t, p, q, lim = r["total_ms"], r["predicted_ms"], r.get("predicted_fit_ms", 0), r.get("limit_ms", 0)
            err, ferr = p / t - 1, (q / t - 1 if q else float("nan"))
            total += 1
            ok = abs(err) <= 0.15
            within += ok
            fit_within += abs(ferr) <= 0.15
            below += bool(lim) and t < lim
            g = groups.setdefault(f"{layout}, {link}", [0, 0])
            g[0] += ok
            g[1] += 1
            x = f"{t / lim:.2f}" if lim else ""
            print(f"| {layout} | {link} | {r['elements'] / 2**20:.0f}M | {r['codec']} | {r['algorithm']} | "
                  f"{t:.1f} | {p:.1f} | {100 * err:+.0f}% | {q:.1f} | {100 * ferr:+.0f}% | {lim:.1f} | {x} |")
    print()
    print("| layout, link | rows within 15% |")
    print("|---|---:|")
    for key, (ok, n) in groups.items():
        print(f"| {key} | {ok} of {n} |")
    print()
    print(f"Rows measured below their printed limit: {below} of {total}.")
    print()
    print(f"Rows within 15%: {within} of {total} (predicted from the rates); {fit_within} of {total} "
          f"(fit: with each row's measured codec time).")
    lim = rows(out / "limit.json")
    if lim:
        print()
        print("| 2 ranks, 1 Gbit/s, 100M floats | measured ms | limit ms | measured / limit | enc ms | dec ms | wire bytes |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in lim:
            if r["codec"] == "none":
                continue
            print(f"| {r['codec']} ({r['algorithm']}) | {r['total_ms']:.1f} | {r['limit_ms']:.1f} | "
                  f"{r['total_ms'] / r['limit_ms']:.2f}x | {r['encode_ms']:.1f} | {r['decode_ms']:.1f} | "
                  f"{r['wire_bytes_per_rank']} |")
    log = out / "runs.log"
    if log.exists():
        print()
        print("Runs (load average before each, the model's measured inputs):")
        print()
        for line in log.read_text().splitlines():
            print(f"    {line}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
