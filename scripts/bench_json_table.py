#!/usr/bin/env python3
"""gradzip-bench --json output -> the markdown table of BENCHMARKS.md.

    python3 scripts/bench_json_table.py results.json [more.json ...]
"""
import json
import sys


def main(paths):
    print("| transport | ranks | elements | codec | algorithm | wire B/rank | ratio | encode ms | comm ms "
          "| decode ms | total ms | speedup vs fp32 | rel. error |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path in paths:
        for r in json.load(open(path)):
            print(f"| {r['transport']} | {r['ranks']} | {r['elements']:,} | `{r['codec']}` | {r['algorithm']} "
                  f"| {r['wire_bytes_per_rank']:,} | {r['ratio']:.1f} | {r['encode_ms']:.2f} | {r['comm_ms']:.2f} "
                  f"| {r['decode_ms']:.2f} | {r['total_ms']:.2f} | {r['speedup']:.2f} | {r['rel_error']:.2e} |")


if __name__ == "__main__":
    main(sys.argv[1:])
