#!/usr/bin/env python3
"""torch.distributed's gloo allreduce, timed like gradzip-bench, as an outside baseline.

A speedup over gradzip's own fp32 allreduce only means something if that
baseline is itself fast; this measures the allreduce most PyTorch CPU users
have (gloo, ring) on the same ranks and links. gradzip-sweep runs it for
every (ranks, link); by hand, under a launcher:

    gradzip-run -n 4 --link 1gbit -- python -m gradzip.baselines.gloo_allreduce \\
        --sizes 25600000,100000000 --iters 3 --json gloo.json

It needs torch and nothing of gradzip: the sweep runs this file by its path,
so it also runs from a checkout whose extension is not built (the file's own
folder, first on sys.path then, holds nothing that shadows torch).

Each rank's input is the constant rank + 1, so the sum P(P+1)/2 is exact in
float32 and checked on every element. Times are the mean per call, max over
ranks, each call started after a barrier (as gradzip-bench does). The JSON
records use gradzip-bench's keys (codec "gloo").
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time


def parse_size(text: str) -> int:
    """A whole element count (the sweep passes counts gradzip's parser made
    of 16M or 25.6e6; this script parses no suffixes, so it cannot read
    them another way)."""
    t = text.strip()
    if not t.isdigit() or int(t) < 1:
        raise argparse.ArgumentTypeError(f"size '{text}' is not a whole element count like 1048576")
    return int(t)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1048576,4194304,16777216", help="comma-separated element counts")
    p.add_argument("--iters", type=int, default=5, help="timed calls per size")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    p.add_argument("--json", help="write the records here (rank 0)")
    p.add_argument("--jsonl", help="append each record here as it finishes (rank 0)")
    p.add_argument("--timeout", type=float, default=float(os.environ.get("GRADZIP_TIMEOUT_S", "300")),
                   help="seconds before a silent peer is an error")
    a = p.parse_args(argv)
    a.sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    if a.iters < 1 or a.warmup < 0 or not a.sizes:
        p.error("need --iters >= 1, --warmup >= 0 and at least one size")
    return a


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    import torch
    import torch.distributed as dist

    # Plain local runs: gloo would otherwise pick the interface of the
    # hostname; under --link the launcher names the rank's veth.
    if "GLOO_SOCKET_IFNAME" not in os.environ and os.environ.get("MASTER_ADDR", "").startswith("127."):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)  # one rank per core share, as gradzip-bench runs
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank, P = dist.get_rank(), dist.get_world_size()
    expected = P * (P + 1) / 2
    records = []
    ok_all = True
    if rank == 0:
        print(f"# gloo allreduce (torch {torch.__version__}), {P} ranks, iters {a.iters}, warmup {a.warmup}, "
              f"link {os.environ.get('GRADZIP_LINK', 'local')}")
        print(f"# {'elements':>11}  {'total(ms)':>10}  {'wire(B)':>12}  check")
    for n in a.sizes:
        x = torch.empty(n, dtype=torch.float32)
        for _ in range(a.warmup):
            x.fill_(rank + 1)
            dist.all_reduce(x)
        total = 0.0
        for _ in range(a.iters):
            x.fill_(rank + 1)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            total += time.perf_counter() - t0
        ok = bool(torch.all(x == expected).item()) if n else True
        stats = torch.tensor([total / a.iters * 1e3, 0.0 if ok else 1.0], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        ok = stats[1].item() == 0.0
        ok_all &= ok
        rec = {
            "codec": "gloo", "algorithm": "gloo", "transport": "gloo", "ranks": P, "elements": n,
            "wire_bytes_per_rank": 2 * (P - 1) * 4 * n // P, "ratio": 1.0, "encode_ms": 0.0,
            "comm_ms": stats[0].item(), "decode_ms": 0.0, "total_ms": stats[0].item(),
            "rel_error": 0.0 if ok else float("nan"), "ok": ok,
        }
        records.append(rec)
        if rank == 0:
            print(f"  {n:>11}  {rec['total_ms']:>10.3f}  {rec['wire_bytes_per_rank']:>12}  {'OK' if ok else 'FAILED'}",
                  flush=True)
            if a.jsonl:
                with open(a.jsonl, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
        del x
    if rank == 0 and a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)
            f.write("\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
