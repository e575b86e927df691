#!/usr/bin/env python3
"""gradzip-bench --json output -> the markdown table of BENCHMARKS.md.

    python3 scripts/bench_json_table.py results.json [more.json ...]

Rows tagged with a `link` (scripts/gpu-check.sh's headline, run on several
emulated links) get it as a first column.
"""
import json
import sys

HEADER = ("transport | ranks | elements | codec | algorithm | wire B/rank | ratio | encode ms | comm ms "
          "| decode ms | total ms | speedup vs fp32 | rel. error")
ALIGN = "---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:"


def row(r):
    return (f"{r['transport']} | {r['ranks']} | {r['elements']:,} | `{r['codec']}` | {r['algorithm']} "
            f"| {r['wire_bytes_per_rank']:,} | {r['ratio']:.1f} | {r['encode_ms']:.2f} | {r['comm_ms']:.2f} "
            f"| {r['decode_ms']:.2f} | {r['total_ms']:.2f} | {r['speedup']:.2f} | {r['rel_error']:.2e}")


def main(paths):
    rows = [r for path in paths for r in json.load(open(path))]
    linked = any("link" in r for r in rows)
    lead = (lambda r: f"| {r.get('link', '')} ") if linked else (lambda r: "")
    print(("| link " if linked else "") + f"| {HEADER} |")
    print(("|---" if linked else "") + f"|{ALIGN}|")
    for r in rows:
        print(f"{lead(r)}| {row(r)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
