#!/usr/bin/env python3
"""Turns gradzip-kernels-bench JSON output into the markdown tables of BENCHMARKS.md.

    build/bin/gradzip-kernels-bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \\
        --benchmark_out=kernels.json --benchmark_out_format=json
    python3 scripts/kernels_bench_table.py kernels.json
    python3 scripts/kernels_bench_table.py --cuda kernels.json   # section 2's GPU table alone

Uses the median of the repetitions. Ratios are against copy (elements per
second for the CPU benches, bytes moved per second for the CUDA ones) and
nth_element, from the same run.
"""
import json
import sys
from collections import defaultdict


def medians(path):
    data = json.load(open(path))
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        name = b["run_name"] if "run_name" in b else b["name"]
        # Manually timed (CUDA event) benchmarks carry the time kind in their name.
        for suffix in ("/manual_time", "/real_time"):
            name = name[:-len(suffix)] if name.endswith(suffix) else name
        out[name] = b
    return data.get("context", {}), out


def main(path):
    ctx, runs = medians(path)
    rows = defaultdict(dict)  # (family, n) -> codec -> (enc, dec)
    print(f"Context: {ctx.get('cpu_model', '?')} ({ctx.get('cpu_isa', '?')}), kernels built for "
          f"{ctx.get('build_isa', '?')}; {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs at "
          f"{ctx.get('mhz_per_cpu', '?')} MHz, {ctx.get('date', '?')}\n")
    print("| benchmark | time (ms) | GB/s moved | elements/s |")
    print("|---|---:|---:|---:|")
    for name, b in runs.items():
        t = b["real_time"] * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        print(f"| `{name}` | {t:.2f} | {b.get('bytes_per_second', 0) / 1e9:.1f} | "
              f"{b.get('items_per_second', 0) / 1e9:.2f} G |")
    for family, copy, key in (("", "copy", "items_per_second"), ("_cuda", "copy_cuda", "bytes_per_second")):
        for name, b in runs.items():
            parts = name.split("/")
            if parts[0] in (f"encode{family}", f"decode{family}") and len(parts) == 3:
                base = runs.get(f"{copy}/{parts[2]}")
                if base:
                    rows[(family, int(parts[2]))].setdefault(parts[1], {})[parts[0]] = b[key] / base[key]
    for family in ("", "_cuda"):
        keys = sorted(k for k in rows if k[0] == family)
        if not keys:
            continue
        unit = "elements/s" if family == "" else "bytes moved/s"
        print(f"\n| codec | n | encode{family} / copy{family} | decode{family} / copy{family} |  ({unit})")
        print("|---|---:|---:|---:|")
        for k in keys:
            for codec, r in rows[k].items():
                enc = r.get(f"encode{family}", 0)
                dec = r.get(f"decode{family}", 0)
                print(f"| {codec} | {k[1]:,} | {enc:.0%} | {dec:.0%} |")
    sel = [(n, b) for n, b in runs.items() if n.startswith("topk_select/")]
    if sel:
        print("\n| top-k select | nth_element / topk_select |")
        print("|---|---:|")
        for name, b in sel:
            nth = runs.get("nth_element/" + name.split("/", 1)[1])
            if nth:
                print(f"| `{name}` | {nth['real_time'] / b['real_time']:.1f}x |")


def cuda_table(path):
    """The GPU table of BENCHMARKS.md section 2: per codec and n (float32 and
    bfloat16 gradients), encode and decode time, GB/s moved and % of the same
    n's device copy."""
    _, runs = medians(path)
    print("| codec | n | encode us | encode GB/s | % copy | decode us | decode GB/s | % copy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")

    def us(b):
        return b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b["time_unit"]]

    sizes = sorted({int(n.split("/")[-1]) for n in runs if n.startswith("copy_cuda/")})
    for n in sizes:
        copy = runs[f"copy_cuda/{n}"]
        rate = copy.get("bytes_per_second", 0)
        print(f"| copy (cudaMemcpy D2D) | {n:,} | {us(copy):.1f} | {rate / 1e9:.0f} | 100% | | | |")
        # float32 gradients, then bfloat16 ones (gradient and output 2 bytes).
        for family, label in (("_cuda", ""), ("_bf16_cuda", " (bf16)")):
            codecs = dict.fromkeys(name.split("/")[1] for name in runs
                                   if name.startswith((f"encode{family}/", f"decode{family}/"))
                                   and name.endswith(f"/{n}"))
            for codec in codecs:
                cells = []
                for op in (f"encode{family}", f"decode{family}"):
                    b = runs.get(f"{op}/{codec}/{n}")
                    if b is None or "error_message" in b:
                        cells += ["", "", ""]
                        continue
                    r = b.get("bytes_per_second", 0)
                    cells += [f"{us(b):.1f}", f"{r / 1e9:.0f}", f"{r / rate:.0%}" if rate else ""]
                print(f"| {codec}{label} | {n:,} | " + " | ".join(cells) + " |")
        for name, b in runs.items():
            if name.startswith(f"topk_cuda/{n}/"):
                print(f"| top-k select (k = {name.split('/')[-1]}) | {n:,} | {us(b):.1f} | "
                      f"{b.get('bytes_per_second', 0) / 1e9:.0f} | | | | |")


if __name__ == "__main__":
    if sys.argv[1] == "--cuda":  # only the GPU table (scripts/gpu-check.sh's report)
        cuda_table(sys.argv[2])
    else:
        main(sys.argv[1])
