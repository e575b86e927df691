"""Convergence on scikit-learn's digits: accuracy and bytes per step, per compression method.

A small MLP learns the 8x8 digit images (1797 samples that ship inside
scikit-learn: nothing is downloaded) with DDP on several CPU ranks over gloo.
Every method starts from the same weights and sees the same batches; what
differs is how the gradient buckets are exchanged:

    fp32                     DDP without a hook (ring allreduce of fp32)
    torch-fp16               torch's fp16_compress_hook
    powersgd:rank=R          torch's PowerSGD hook (rank R, error feedback, warm start)
    <gradzip spec>           gradzip's hook, e.g. onebit, topk:density=0.01,ef=off
    <gradzip spec>@gradzip   the same over gradzip's own transport (transport="gradzip")
    <gradzip spec>/<algo>    with the hook's algorithm set (allgather, scatter_reduce);
                             without it, the hook's "auto"
    <spec>/<algo>/<server>   and scatter_reduce's chunk sums re-encoded with <server>
                             (e.g. onebit/scatter_reduce/onebit, the former default)

    python -m gradzip.experiments.digits --ranks 4 --seeds 0,1,2 --json out.json --markdown out.md

Bytes per step are this rank's: "payload" is the message a rank contributes
(what the codec produced; fp32 = 4 bytes per parameter), "wire" what it puts
on the network, modelled as a ring for torch's collectives (allreduce
2(P-1)/P x message, all_gather (P-1) x message) and counted by gradzip's
communicator for @gradzip.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

DEFAULT_METHODS = [
    "fp32", "torch-fp16", "powersgd:rank=2", "fp16",
    "onebit", "onebit:ef=off", "topk:density=0.01", "topk:density=0.01,ef=off",
]
# Also run over gradzip's own communicator when the build has UCX.
GRADZIP_TRANSPORT_METHODS = ["fp16@gradzip", "onebit@gradzip", "topk:density=0.01@gradzip"]


def default_methods() -> List[str]:
    import gradzip

    return DEFAULT_METHODS + (GRADZIP_TRANSPORT_METHODS if gradzip.BUILD["ucx"] else [])


@dataclass
class Settings:
    """Training settings; the defaults are the ones BENCHMARKS.md reports."""

    epochs: int = 40
    batch_per_rank: int = 32
    lr: float = 0.1
    # 0.8, not 0.9: with 0.9 (an effective step of 1.0) onebit with blocks of
    # 512 diverged on this model while fp32 did not (docs/python.md).
    momentum: float = 0.8
    hidden: int = 128
    powersgd_start: int = 2  # the smallest PowerSGD allows with error feedback
    threads_per_rank: int = 1


@dataclass
class Result:
    method: str
    seed: int
    ranks: int
    steps: int
    test_accuracy: float
    train_loss: float
    payload_bytes_per_step: float
    wire_bytes_per_step: float
    fp32_bytes_per_step: float
    seconds: float
    extra: Dict[str, Any] = field(default_factory=dict)


def _data(seed_split: int = 0):
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=0.2, random_state=seed_split, stratify=y)


def _model(hidden: int, seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10))


def _train_one(method: str, seed: int, settings: Settings, data) -> Result:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradzip.torch import CompressionState, compression_hook

    rank, ranks = dist.get_rank(), dist.get_world_size()
    x_train, x_test, y_train, y_test = data
    x_train_t, y_train_t = torch.from_numpy(x_train), torch.from_numpy(y_train)
    model = _model(settings.hidden, seed)
    ddp = DDP(model)
    n_params = sum(p.numel() for p in model.parameters())
    fp32 = 4.0 * n_params
    ring = 2.0 * (ranks - 1) / ranks

    state: Any = None
    if method == "fp32":
        pass
    elif method == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif method.startswith("powersgd"):
        rank_r = int(method.partition("rank=")[2] or 1)
        # One bucket (the model is far below DDP's 25 MiB cap): PowerSGD issues
        # its second allreduce from a future's callback, which hangs with
        # several buckets on gloo (docs/python.md).
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank_r,
            start_powerSGD_iter=settings.powersgd_start, random_seed=seed)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        spec, _, transport = method.partition("@")
        spec, _, algorithm = spec.partition("/")
        algorithm, _, server = algorithm.partition("/")
        state = CompressionState(codec=spec, transport=transport or "torch", algorithm=algorithm or "auto",
                                 server_codec=server or None)
        ddp.register_comm_hook(state, compression_hook)

    opt = torch.optim.SGD(ddp.parameters(), lr=settings.lr, momentum=settings.momentum)
    per_step = settings.batch_per_rank * ranks
    steps_per_epoch = len(x_train) // per_step
    t0 = time.perf_counter()
    step, loss_sum, loss_n = 0, 0.0, 0
    for epoch in range(settings.epochs):
        order = np.random.default_rng(seed * 1000 + epoch).permutation(len(x_train))
        for i in range(steps_per_epoch):
            idx = order[i * per_step + rank * settings.batch_per_rank:][:settings.batch_per_rank]
            xb, yb = x_train_t[idx], y_train_t[idx]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
            loss.backward()
            opt.step()
            step += 1
            if epoch == settings.epochs - 1:
                loss_sum += loss.item()
                loss_n += 1
    seconds = time.perf_counter() - t0

    with torch.no_grad():
        pred = model(torch.from_numpy(x_test)).argmax(1).numpy()
    accuracy = float((pred == y_test).mean())

    extra: Dict[str, Any] = {}
    if method == "fp32":
        payload = fp32
        wire = ring * fp32
    elif method == "torch-fp16":
        payload = fp32 / 2
        wire = ring * payload
    elif method.startswith("powersgd"):
        _, before, after = state.compression_stats()
        warm = min(settings.powersgd_start, step)
        payload = (warm * fp32 + 4.0 * after) / step
        wire = ring * payload  # three ring allreduces: Ps, Qs, uncompressed tensors
        extra["powersgd_start"] = settings.powersgd_start
    else:
        stats = state.compression_stats()
        payload = stats["payload_bytes_per_step"]
        wire = stats["wire_bytes_per_step"]

    # Every rank must hold the same model; a cheap check that stays in the table.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(ranks)]
    dist.all_gather(everyone, flat)
    extra["identical_on_all_ranks"] = all(torch.equal(everyone[0], e) for e in everyone)
    return Result(method, seed, ranks, step, accuracy, loss_sum / max(loss_n, 1), payload, wire, fp32,
                  seconds, extra)


def _worker(rank: int, ranks: int, port: int, methods: Sequence[str], seeds: Sequence[int],
            settings: Settings, out_path: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ranks))
    torch.set_num_threads(settings.threads_per_rank)
    dist.init_process_group("gloo", rank=rank, world_size=ranks, timeout=datetime.timedelta(seconds=120))
    try:
        data = _data()
        results = []
        for seed in seeds:
            for method in methods:
                results.append(asdict(_train_one(method, seed, settings, data)))
                if rank == 0:
                    r = results[-1]
                    print(f"  seed {seed} {method:<28} acc {r['test_accuracy']:.4f} "
                          f"payload {r['payload_bytes_per_step']:.0f} B/step ({r['seconds']:.1f} s)",
                          file=sys.stderr, flush=True)
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(results, f)
    finally:
        gc.collect()  # DDP objects left in cycles hold the group; gloo's threads must stop before exit
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(methods: Optional[Sequence[str]] = None, seeds: Sequence[int] = (0,), ranks: int = 4,
        settings: Optional[Settings] = None, timeout: float = 1800.0) -> List[Dict[str, Any]]:
    """Trains every method with every seed on `ranks` local CPU processes.

    Returns one dict per (seed, method) (the fields of :class:`Result`). Raises
    RuntimeError if a rank fails and TimeoutError after `timeout` seconds
    (the ranks are killed).
    """
    import torch.multiprocessing as mp

    settings = settings or Settings()
    methods = default_methods() if methods is None else list(methods)
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "results.json")
        ctx = mp.start_processes(_worker, args=(ranks, _free_port(), list(methods), list(seeds), settings, out_path),
                                 nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"digits experiment: not done after {timeout:.0f} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        with open(out_path) as f:
            return json.load(f)


def summarize(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per method: accuracy per seed and mean, difference to fp32 (points), bytes and ratios."""
    methods = list(dict.fromkeys(r["method"] for r in results))
    fp32_acc = {r["seed"]: r["test_accuracy"] for r in results if r["method"] == "fp32"}
    rows = []
    for m in methods:
        rs = [r for r in results if r["method"] == m]
        accs = [r["test_accuracy"] for r in rs]
        deltas = [100 * (r["test_accuracy"] - fp32_acc[r["seed"]]) for r in rs if r["seed"] in fp32_acc]
        payload = statistics.mean(r["payload_bytes_per_step"] for r in rs)
        wire = statistics.mean(r["wire_bytes_per_step"] for r in rs)
        fp32 = rs[0]["fp32_bytes_per_step"]
        fp32_wire = fp32 * 2 * (rs[0]["ranks"] - 1) / rs[0]["ranks"]
        rows.append({
            "method": m,
            "seeds": [r["seed"] for r in rs],
            "accuracy": accs,
            "accuracy_mean": statistics.mean(accs),
            "delta_points": deltas,
            "delta_points_worst": min(deltas) if deltas else math.nan,
            "payload_bytes_per_step": payload,
            "payload_ratio": fp32 / payload,
            "wire_bytes_per_step": wire,
            "wire_ratio": fp32_wire / wire,
            "identical_on_all_ranks": all(r["extra"].get("identical_on_all_ranks", False) for r in rs),
            "seconds": statistics.mean(r["seconds"] for r in rs),
        })
    return rows


def markdown(rows: List[Dict[str, Any]], ranks: int, settings: Settings) -> str:
    lines = [
        f"Digits MLP (64-{settings.hidden}-{settings.hidden}-10), DDP on {ranks} CPU ranks (gloo), "
        f"{settings.epochs} epochs, batch {settings.batch_per_rank}/rank, SGD lr {settings.lr} "
        f"momentum {settings.momentum}; seeds {', '.join(map(str, rows[0]['seeds']))}.",
        "",
        "| method | test accuracy (per seed) | mean | vs fp32, worst seed (points) "
        "| payload B/step | payload ratio | wire B/step | wire ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        accs = " / ".join(f"{100 * a:.2f}" for a in r["accuracy"])
        delta = "" if r["method"] == "fp32" else f"{r['delta_points_worst']:+.2f}"
        lines.append(
            f"| {r['method']} | {accs} | {100 * r['accuracy_mean']:.2f} | {delta} | "
            f"{r['payload_bytes_per_step']:,.0f} | {r['payload_ratio']:.1f}x | "
            f"{r['wire_bytes_per_step']:,.0f} | {r['wire_ratio']:.1f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seeds", default="0", help="comma-separated, e.g. 0,1,2")
    ap.add_argument("--methods", default=None,
                    help="comma-separated methods (a part with '=' and no ':' continues a gradzip spec, "
                         "as in topk:density=0.01,ef=off); default: " + ",".join(DEFAULT_METHODS + GRADZIP_TRANSPORT_METHODS))
    ap.add_argument("--epochs", type=int, default=Settings.epochs)
    ap.add_argument("--batch", type=int, default=Settings.batch_per_rank,
                    help="samples per rank per step (8 ranks at 16 take the steps 4 ranks take at 32)")
    ap.add_argument("--json", help="write the per-run results and the summary here")
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--timeout", type=float, default=3600.0)
    args = ap.parse_args(argv)

    methods = default_methods() if args.methods is None else _split_methods(args.methods)
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = Settings(epochs=args.epochs, batch_per_rank=args.batch)
    results = run(methods, seeds, args.ranks, settings, args.timeout)
    rows = summarize(results)
    table = markdown(rows, args.ranks, settings)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": asdict(settings), "ranks": args.ranks, "results": results, "summary": rows},
                      f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    return 0


def _split_methods(text: str) -> List[str]:
    """Splits a comma-separated method list where gradzip specs may hold commas:
    an element with '=' and no ':' continues the previous method."""
    out: List[str] = []
    for part in text.split(","):
        if out and "=" in part and ":" not in part.split("@")[0]:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


if __name__ == "__main__":
    sys.exit(main())
