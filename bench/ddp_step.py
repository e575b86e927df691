#!/usr/bin/env python3
"""DDP training-step time with gradzip's hook, against DDP fp32 and torch's fp16 hook in the same run.

Issue 16's setting (4 ranks on the emulated 1 Gbit/s cluster, a 25.6M-parameter
model of 4 Linear 2528x2528, batch 8, bucket_cap_mb=25, gloo):

    build/bin/gradzip-run -n 4 --link 1gbit -- build/venv/bin/python bench/ddp_step.py

Settings (--settings, comma-separated, run in this order, each on a fresh DDP model):
  fp32            DDP without a hook (its own gloo allreduce)
  torch-fp16      torch's fp16_compress_hook
  SPEC            gradzip's hook with that codec spec and its default transport
                  (torch's process group), e.g. fp16, onebit, topk:density=0.01
  SPEC@gradzip    the same over gradzip's own transport (UCX)
  SPEC/ALGORITHM  with the hook's algorithm set (allgather, scatter_reduce, ...)
  SPEC@backend    DDP without a hook, in a group of the gradzip process-group
                  backend whose policy compresses every float all_reduce with
                  SPEC (gradzip.torch.backend.Policy(SPEC, min_elements=0));
                  SPEC/ALGORITHM@backend sets the policy's algorithm;
                  --backend adds this twin right after each hook setting

A step is zero_grad, forward, backward (the hook's exchanges overlap it) and
SGD's update; its time is the slowest rank's. Each setting runs --warmup
untimed steps (DDP rebuilds its buckets after the first), then --steps timed
ones; the table shows the median step (and the fastest), the speedup over
fp32 and the ratio to torch's fp16 hook, both from this run, and the bytes
this rank sent per step (gradzip's own count; fp32 and torch-fp16 modelled
as a ring: 2(P-1)/P x the gradient in 4 or 2 bytes). --json writes the
records (rank 0).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

DEFAULT_SETTINGS = "fp32,torch-fp16,fp16,onebit,topk:density=0.01,onebit@gradzip,topk:density=0.01@gradzip"


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default=DEFAULT_SETTINGS, help="comma-separated (see above); "
                   "a comma inside a codec spec is written ';' (topk:density=0.01;ef=off)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=2528)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--steps", type=int, default=10, help="timed steps per setting")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--backend", action="store_true", help="after each SPEC (hook over torch's group) setting, "
                   "also run SPEC@backend (the same codec through the process-group backend)")
    p.add_argument("--json", help="write the records here (rank 0)")
    p.add_argument("--timeout", type=float, default=float(os.environ.get("GRADZIP_TIMEOUT_S", "300")))
    a = p.parse_args(argv)
    a.settings = [s.strip().replace(";", ",") for s in a.settings.split(",") if s.strip()]
    if a.backend:
        a.settings = [t for s in a.settings
                      for t in ([s, s + "@backend"] if s not in ("fp32", "torch-fp16") and "@" not in s
                                else [s])]
    if a.steps < 1 or a.warmup < 1 or not a.settings:
        p.error("need --steps >= 1, --warmup >= 1 (DDP rebuilds its buckets after step 1) and a setting")
    return a


def describe_machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__)), check=False).stdout.strip()
    except OSError:
        commit = ""
    return f"{cpu}, {os.cpu_count()} cores, commit {commit or '?'}"


def build(a: argparse.Namespace, setting: str) -> Dict[str, Any]:
    """A fresh model, its DDP wrapper and hook for one setting."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    group = None
    if setting.endswith("@backend"):  # the same DDP, no hook, in a group of the gradzip backend
        from gradzip.torch.backend import Policy

        spec, _, algorithm = setting[:-len("@backend")].partition("/")
        policy = Policy(spec, min_elements=0, algorithm=algorithm or "auto")
        group = dist.new_group(backend="gradzip", pg_options=policy)
    ddp = DDP(model, bucket_cap_mb=a.bucket_cap_mb, gradient_as_bucket_view=True, process_group=group)
    state = None
    if setting == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif setting != "fp32" and group is None:
        from gradzip.torch import CompressionState, compression_hook

        spec, transport = setting, "torch"
        if "@" in spec:
            spec, transport = spec.split("@", 1)
        algorithm = "auto"
        if "/" in spec:
            spec, algorithm = spec.split("/", 1)
        state = CompressionState(codec=spec, transport=transport, algorithm=algorithm)
        ddp.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    return {"ddp": ddp, "opt": opt, "state": state, "group": group,
            "params": sum(p.numel() for p in model.parameters())}


def run_setting(a: argparse.Namespace, setting: str, x: Any, y: Any) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    m = build(a, setting)
    ddp, opt = m["ddp"], m["opt"]
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    # The slowest rank's time of each step.
    everyone: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, times)
    slowest = [max(col) for col in zip(*everyone)]
    P = dist.get_world_size()
    if m["state"] is not None:
        stats = m["state"].compression_stats()
        wire = stats["wire_bytes_per_step"]
    elif m["group"] is not None:  # every step's bytes, warm-up included: the same each step
        wire = m["group"].compression_stats()["wire_bytes"] / (a.warmup + a.steps)
    else:
        elem = 2 if setting == "torch-fp16" else 4
        wire = 2 * (P - 1) / P * elem * m["params"]
    params = m["params"]
    del m, ddp, opt
    return {"setting": setting, "median_s": statistics.median(slowest), "min_s": min(slowest),
            "steps_s": slowest, "wire_bytes_per_step": wire, "params": params}


def main(argv: List[str]) -> int:
    a = parse_args(argv)
    import torch
    import torch.distributed as dist

    if "GLOO_SOCKET_IFNAME" not in os.environ and os.environ.get("MASTER_ADDR", "").startswith("127."):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank, P = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(a.batch, a.width, generator=g)
    y = torch.randn(a.batch, a.width, generator=g)

    if rank == 0:
        print(f"# DDP step, {P} ranks, link {os.environ.get('GRADZIP_LINK', 'local')}, {a.layers} x Linear "
              f"{a.width}x{a.width}, batch {a.batch}, bucket_cap_mb {a.bucket_cap_mb:g}, gloo, torch "
              f"{torch.__version__}, {a.threads} thread(s) per rank, {a.steps} timed steps after {a.warmup}")
        print(f"# {describe_machine()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
        sys.stdout.flush()
    records = []
    for setting in a.settings:
        r = run_setting(a, setting, x, y)
        records.append(r)
        if rank == 0:
            print(f"#   {setting}: median {r['median_s']:.3f} s", flush=True)

    if rank == 0:
        base = {r["setting"]: r["median_s"] for r in records}
        fp32, fp16 = base.get("fp32"), base.get("torch-fp16")
        print(f"{'setting':<34} {'step(s)':>8} {'min(s)':>8} {'vs fp32':>8} {'vs torch-fp16':>14} "
              f"{'sent/step(MB)':>14}")
        for r in records:
            vs32 = f"{fp32 / r['median_s']:.2f}x" if fp32 else "-"
            vs16 = f"{r['median_s'] / fp16:.2f}" if fp16 else "-"
            r["speedup_vs_fp32"] = fp32 / r["median_s"] if fp32 else None
            r["ratio_to_torch_fp16"] = r["median_s"] / fp16 if fp16 else None
            print(f"{r['setting']:<34} {r['median_s']:>8.3f} {r['min_s']:>8.3f} {vs32:>8} {vs16:>14} "
                  f"{r['wire_bytes_per_step'] / 1e6:>14.2f}")
        print("# vs fp32: fp32's median step / this one's; vs torch-fp16: this one's / torch fp16 hook's "
              "(<= 1: no slower)")
        if a.json:
            meta = {"ranks": P, "link": os.environ.get("GRADZIP_LINK", "local"), "machine": describe_machine(),
                    "layers": a.layers, "width": a.width, "batch": a.batch, "bucket_cap_mb": a.bucket_cap_mb,
                    "torch": torch.__version__, "threads": a.threads}
            with open(a.json, "w") as f:
                json.dump({"meta": meta, "records": records}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
