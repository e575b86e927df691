"""Convergence on scikit-learn's digits: accuracy and bytes per step, per compression method.

A small MLP learns the 8x8 digit images (1797 samples that ship inside
scikit-learn: nothing is downloaded) on several CPU ranks over gloo. Every
method starts from the same weights and sees the same batches; what differs
is how the ranks exchange what they learned:

    fp32                     DDP without a hook (ring allreduce of fp32)
    torch-fp16               torch's fp16_compress_hook
    powersgd:rank=R          torch's PowerSGD hook (rank R, error feedback, warm start)
    <gradzip spec>           gradzip's hook, e.g. onebit, topk:density=0.01,ef=off
    <gradzip spec>@gradzip   the same over gradzip's own transport (transport="gradzip")
    <gradzip spec>/<algo>    with the hook's algorithm set (allgather, scatter_reduce);
                             without it, the hook's "auto"
    <spec>/<algo>/<server>   and scatter_reduce's chunk sums re-encoded with <server>
                             (e.g. onebit/scatter_reduce/onebit, the former default)
    <gradzip spec>@bmuf:h=H  no DDP: block momentum (gradzip.torch.BlockMomentum), the
                             model update sent compressed every H steps (_digits_bmuf.py)
    <DDP method>#bf16        the model kept in bfloat16 (#fp16: float16): parameters,
                             gradients, DDP's buckets and the optimizer in that dtype,
                             batches cast to it; e.g. fp32#bf16 (plain DDP), onebit#bf16
    backend                  DDP without a hook on a gradzip process-group backend group with the
                             default Policy() (<spec>@backend[:min=N]: Policy(<spec>, min_elements=N));
                             wire: the group's compression_stats() plus fp32 ring bytes for what it
                             kept exact; payload: the dense bucket (not counted by the group)
    fp32@fsdp                no DDP: FSDP2 (fully_shard per layer), torch's reduce-scatter
    <gradzip spec>@fsdp      the same with gradzip's compressed reduce-scatter
                             (gradzip.torch.fsdp; _digits_fsdp.py); compared with fp32@fsdp

    python -m gradzip.experiments.digits --ranks 4 --seeds 0,1,2 --json out.json --markdown out.md
    gradzip-run -n 4 --link 100mbit -- python -m gradzip.experiments.digits --launched ...

Bytes per step are this rank's: "payload" is the message a rank contributes
(what the codec produced; fp32 = 4 bytes per parameter, 2 for a #bf16 model), "wire" what it puts
on the network, modelled as a ring for torch's collectives (allreduce
2(P-1)/P x message, all_gather (P-1) x message) and counted by gradzip's
communicator for @gradzip and @bmuf. --eval-every records the accuracy of
the model every rank holds as training goes (time to accuracy).
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
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _backend_method, _tune
from ._digits_method import Method, Settings

DEFAULT_METHODS = [
    "fp32", "torch-fp16", "powersgd:rank=2", "fp16",
    "onebit", "onebit:ef=off", "topk:density=0.01", "topk:density=0.01,ef=off",
]
# Also run over gradzip's own communicator when the build has UCX.
GRADZIP_TRANSPORT_METHODS = ["fp16@gradzip", "onebit@gradzip", "topk:density=0.01@gradzip"]


def default_methods() -> List[str]:
    """DEFAULT_METHODS, then every other registered lossy codec with its default
    settings (by name: a new codec gets its row), then the gradzip-transport runs."""
    import gradzip

    named = {m.split(":")[0].split("@")[0] for m in DEFAULT_METHODS}
    codecs = [c["name"] for c in gradzip.codec_info() if not c["lossless"] and c["name"] not in named]
    return DEFAULT_METHODS + codecs + (GRADZIP_TRANSPORT_METHODS if gradzip.BUILD["ucx"] else [])


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
    lr: float = 0.0               # SGD's learning rate for this run


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


def _setup(method: str, model: Any, seed: int, settings: Settings) -> Method:
    """DDP on every step: fp32, torch's hooks, or gradzip's hook."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradzip.torch import CompressionState, compression_hook

    ranks = dist.get_world_size()
    ddp = DDP(model)
    fp32 = float(sum(p.numel() * p.element_size() for p in model.parameters()))  # the dense bucket bytes
    ring = 2.0 * (ranks - 1) / ranks
    opt = torch.optim.SGD(ddp.parameters(), lr=settings.lr, momentum=settings.momentum)
    extra: Dict[str, Any] = {}
    state: Any = None
    if method == "fp32":
        bytes_per_step: Callable[[int], Tuple[float, float]] = lambda steps: (fp32, ring * fp32)
    elif method == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        bytes_per_step = lambda steps: (fp32 / 2, ring * fp32 / 2)
    elif method.startswith("powersgd"):
        rank_r = int(method.partition("rank=")[2] or 1)
        # One bucket (the model is far below DDP's 25 MiB cap): PowerSGD issues
        # its second allreduce from a future's callback, which hangs with
        # several buckets on gloo (docs/python.md).
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank_r,
            start_powerSGD_iter=settings.powersgd_start, random_seed=seed)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        extra["powersgd_start"] = settings.powersgd_start

        def bytes_per_step(steps: int) -> Tuple[float, float]:
            _, before, after = state.compression_stats()
            warm = min(settings.powersgd_start, steps)
            payload = (warm * fp32 + 4.0 * after) / steps
            return payload, ring * payload  # three ring allreduces: Ps, Qs, uncompressed tensors
    else:
        spec, _, transport = method.partition("@")
        spec, _, algorithm = spec.partition("/")
        algorithm, _, server = algorithm.partition("/")
        state = CompressionState(codec=spec, transport=transport or "torch", algorithm=algorithm or "auto",
                                 server_codec=server or None)
        ddp.register_comm_hook(state, compression_hook)

        def bytes_per_step(steps: int) -> Tuple[float, float]:
            stats = state.compression_stats()
            return stats["payload_bytes_per_step"], stats["wire_bytes_per_step"]
    return Method(ddp, opt, bytes_per_step, extra=extra)


def _bmuf_setup(method: str, model: Any, seed: int, settings: Settings) -> Method:
    from ._digits_bmuf import setup

    return setup(method, model, seed, settings)


def _backend_setup(method: str, model: Any, seed: int, settings: Settings) -> Method:
    import torch

    ddp, wire, extra = _backend_method.setup(method, model)
    opt = torch.optim.SGD(ddp.parameters(), lr=settings.lr, momentum=settings.momentum)
    dense = float(sum(p.numel() * p.element_size() for p in model.parameters()))
    # payload: the dense bucket (the group counts wire bytes, not the codec's payloads)
    m = Method(ddp, opt, lambda steps: (dense, wire(steps) / steps))
    m.finish = lambda: m.extra.update(extra())
    return m


def _fsdp_setup(method: str, model: Any, seed: int, settings: Settings) -> Method:
    from ._digits_fsdp import setup

    return setup(method, model, seed, settings)


#: Method families beyond DDP: (does this method belong to it, its setup).
#: A setup takes (method, model, seed, settings) and returns a Method.
FAMILIES: List[Tuple[Callable[[str], bool], Callable[..., Method]]] = [
    (lambda method: "@bmuf" in method, _bmuf_setup),  # <codec>@bmuf:h=H,...: block momentum, no DDP
    (lambda method: method.endswith("@fsdp"), _fsdp_setup),  # fp32@fsdp, <codec>@fsdp: FSDP2, no DDP
    (_backend_method.belongs, _backend_setup),  # backend, <spec>@backend[:min=N]: DDP on a gradzip backend group
]


def baseline(method: str) -> str:
    """The method a row is compared with: fp32@fsdp for FSDP rows, else fp32 (DDP)."""
    return "fp32@fsdp" if method.endswith("@fsdp") else "fp32"


def _family_setup(method: str) -> Callable[..., Method]:
    for belongs, setup in FAMILIES:
        if belongs(method):
            return setup
    return _setup


def _train_one(method: str, seed: int, settings: Settings, data) -> Result:
    import numpy as np
    import torch
    import torch.distributed as dist

    rank, ranks = dist.get_rank(), dist.get_world_size()
    x_train, x_test, y_train, y_test = data
    trained, _, model_dtype = method.partition("#")
    if model_dtype not in ("", "bf16", "fp16"):
        raise ValueError(f"method {method!r}: the model dtype suffix is #bf16 or #fp16, got #{model_dtype}")
    dtype = {"": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[model_dtype]
    x_train_t, y_train_t = torch.from_numpy(x_train).to(dtype), torch.from_numpy(y_train)
    x_test_t = torch.from_numpy(x_test).to(dtype)
    model = _model(settings.hidden, seed)  # initialised in float32, then rounded: the same start
    fp32 = 4.0 * sum(p.numel() for p in model.parameters())
    model.to(dtype)
    m = _family_setup(trained)(trained, model, seed, settings)

    def accuracy() -> float:
        with torch.no_grad(), m.shared_model():
            pred = model(x_test_t).argmax(1).numpy()
        return float((pred == y_test).mean())

    per_step = settings.batch_per_rank * ranks
    steps_per_epoch = len(x_train) // per_step
    curve: List[Tuple[float, int, float]] = []  # (training seconds, step, test accuracy) of the shared model
    step, loss_sum, loss_n = 0, 0.0, 0
    version = m.version or (lambda: step)
    seen = version()
    paused = 0.0  # time spent evaluating, left out of the training time
    t0 = time.perf_counter()
    for epoch in range(settings.epochs):
        order = np.random.default_rng(seed * 1000 + epoch).permutation(len(x_train))
        for i in range(steps_per_epoch):
            idx = order[i * per_step + rank * settings.batch_per_rank:][:settings.batch_per_rank]
            xb, yb = x_train_t[idx], y_train_t[idx]
            m.optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(m.forward(xb), yb)
            loss.backward()
            m.optimizer.step()
            step += 1
            if epoch == settings.epochs - 1:
                loss_sum += loss.item()
                loss_n += 1
            if settings.eval_every and step % settings.eval_every == 0 and version() != seen:
                t_eval = time.perf_counter()
                curve.append((t_eval - t0 - paused, step, accuracy()))
                seen = version()
                paused += time.perf_counter() - t_eval
    m.finish()
    seconds = time.perf_counter() - t0 - paused
    final = accuracy()
    if settings.eval_every and (not curve or curve[-1][1] != step or curve[-1][2] != final):
        curve.append((seconds, step, final))

    payload, wire = m.bytes_per_step(step)
    extra = dict(m.extra)
    if settings.eval_every:
        extra["curve"] = curve
    # Every rank must hold the same model; a cheap check that stays in the table.
    # (Sharded parameters, FSDP's DTensors, are gathered whole first.)
    with torch.no_grad(), m.shared_model():
        flat = torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1).float()
                          for p in model.parameters()])  # exact for 16-bit
    everyone = [torch.empty_like(flat) for _ in range(ranks)]
    dist.all_gather(everyone, flat)
    extra["identical_on_all_ranks"] = all(torch.equal(everyone[0], e) for e in everyone)
    return Result(method, seed, ranks, step, final, loss_sum / max(loss_n, 1), payload, wire, fp32,
                  seconds, extra, settings.lr)


def _train_all(methods: Sequence[str], seeds: Sequence[int], settings: Settings,
               runs: Optional[Sequence[Tuple[str, int, float]]] = None,
               records: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every (seed, method), or every (method, seed, learning rate) of `runs`, in the
    initialised process group; progress on rank 0's stderr, and each run's record
    (with its settings) appended to `records` (JSON lines) as it ends."""
    import torch.distributed as dist

    data = _data()
    results = []
    for method, seed, lr in runs if runs is not None else [(m, s, settings.lr) for s in seeds for m in methods]:
        run_settings = replace(settings, lr=lr)
        results.append(asdict(_train_one(method, seed, run_settings, data)))
        if dist.get_rank() == 0:
            r = results[-1]
            print(f"  seed {seed} lr {lr:.4g} {method:<28} acc {r['test_accuracy']:.4f} "
                  f"payload {r['payload_bytes_per_step']:.0f} B/step ({r['seconds']:.1f} s)",
                  file=sys.stderr, flush=True)
            if records:
                with open(records, "a") as f:
                    f.write(json.dumps({**r, "settings": asdict(run_settings)}) + "\n")
    return results


def _in_group(rank: int, ranks: int, settings: Settings, body: Callable[[], Any]) -> Any:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(settings.threads_per_rank)
    dist.init_process_group("gloo", rank=rank, world_size=ranks, timeout=datetime.timedelta(seconds=120))
    try:
        return body()
    finally:
        gc.collect()  # DDP objects left in cycles hold the group; gloo's threads must stop before exit
        dist.destroy_process_group()


def _worker(rank: int, ranks: int, port: int, methods: Sequence[str], seeds: Sequence[int],
            settings: Settings, runs: Optional[Sequence[Tuple[str, int, float]]], records: Optional[str],
            out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ranks))
    results = _in_group(rank, ranks, settings, lambda: _train_all(methods, seeds, settings, runs, records))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def run_launched(methods: Sequence[str], seeds: Sequence[int] = (0,), settings: Optional[Settings] = None,
                 runs: Optional[Sequence[Tuple[str, int, float]]] = None) -> Optional[List[Dict[str, Any]]]:
    """Like :func:`run`, as one rank of a job that a launcher started
    (torchrun, gradzip-run: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the
    environment), e.g. on gradzip-run's emulated links. Returns the records on
    rank 0, None on the others."""
    settings = settings or Settings()
    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = _in_group(rank, ranks, settings, lambda: _train_all(methods, seeds, settings, runs))
    return results if rank == 0 else None


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
    settings = settings or Settings()
    methods = default_methods() if methods is None else list(methods)
    return _run_ranks(_worker, "digits", ranks, (list(methods), list(seeds), settings, None, None), timeout)


def run_list(runs: Sequence[Tuple[str, int, float]], ranks: int = 4, settings: Optional[Settings] = None,
             timeout: float = 3600.0, records: Optional[str] = None) -> List[Dict[str, Any]]:
    """Trains each (method, seed, learning rate) in one launch of `ranks` local CPU
    processes; `records`: see _train_all."""
    return _run_ranks(_worker, "digits", ranks, ([], [], settings or Settings(), list(runs), records), timeout)


def _run_ranks(worker: Any, name: str, ranks: int, args: Sequence[Any], timeout: float) -> List[Dict[str, Any]]:
    """Runs ``worker(rank, ranks, port, *args, out_path)`` on `ranks` spawned
    processes (an experiment's ranks) and returns the JSON list they leave in
    out_path; TimeoutError after `timeout` s (the ranks are killed)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "results.json")
        ctx = mp.start_processes(worker, args=(ranks, _free_port(), *args, out_path),
                                 nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} experiment: not done after {timeout:.0f} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        with open(out_path) as f:
            return json.load(f)


def summarize(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per method: accuracy per seed and mean, difference to fp32 (points), bytes and ratios."""
    keys = list(dict.fromkeys((r["method"], r.get("lr")) for r in results))
    base_acc = {(r["method"], r["seed"], r.get("lr")): r["test_accuracy"] for r in results}
    rows = []
    for m, lr in keys:
        rs = [r for r in results if r["method"] == m and r.get("lr") == lr]
        accs = [r["test_accuracy"] for r in rs]
        deltas = [100 * (r["test_accuracy"] - base_acc[baseline(m), r["seed"], lr]) for r in rs
                  if (baseline(m), r["seed"], lr) in base_acc]
        payload = statistics.mean(r["payload_bytes_per_step"] for r in rs)
        wire = statistics.mean(r["wire_bytes_per_step"] for r in rs)
        fp32 = rs[0]["fp32_bytes_per_step"]
        # The uncompressed collective's bytes: a ring allreduce, or what the
        # method names (FSDP: torch's reduce-scatter).
        fp32_wire = rs[0]["extra"].get("fp32_wire_bytes_per_step", fp32 * 2 * (rs[0]["ranks"] - 1) / rs[0]["ranks"])
        rows.append({
            "method": m,
            "lr": lr,
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


def describe(settings: Settings, ranks: int, seeds: Sequence[int]) -> str:
    """The experiment's settings in one sentence (above its tables)."""
    return (f"Digits MLP (64-{settings.hidden}-{settings.hidden}-10), {ranks} CPU ranks (gloo), "
            f"{settings.epochs} epochs, batch {settings.batch_per_rank}/rank, SGD "
            f"momentum {settings.momentum}; seeds {', '.join(map(str, seeds))}.")


def per_seed(accuracies: Sequence[float]) -> str:
    return " / ".join(f"{100 * a:.2f}" for a in accuracies)


def markdown(rows: List[Dict[str, Any]], ranks: int, settings: Settings) -> str:
    several = len({r.get("lr") for r in rows}) > 1
    lines = [
        describe(settings, ranks, rows[0]["seeds"]) + (" With several learning rates, each row is against fp32 at "
                                                       "the same rate, not tuned (--tune compares with fp32 at its "
                                                       "best)." if several else ""),
        "",
        "| method | lr | test accuracy (per seed) | mean | vs fp32 (DDP or FSDP), worst seed (points) "
        "| payload B/step | payload ratio | wire B/step | wire ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        accs = per_seed(r["accuracy"])
        delta = "" if r["method"] == baseline(r["method"]) else f"{r['delta_points_worst']:+.2f}"
        lines.append(
            f"| {r['method']} | {r.get('lr') or settings.lr:g} | {accs} | {100 * r['accuracy_mean']:.2f} | {delta} | "
            f"{r['payload_bytes_per_step']:,.0f} | {r['payload_ratio']:.1f}x | "
            f"{r['wire_bytes_per_step']:,.0f} | {r['wire_ratio']:.1f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seeds", default="0", help="comma-separated, e.g. 0,1,2")
    ap.add_argument("--methods", default=None,
                    help="comma-separated methods (a part that does not start with a method or codec name "
                         "continues the previous one, as in topk:density=0.01,ef=off); default: " + ",".join(DEFAULT_METHODS)
                         + ", then every other registered lossy codec by name, then "
                         + ",".join(GRADZIP_TRANSPORT_METHODS) + " when the build has UCX")
    ap.add_argument("--epochs", type=int, default=Settings.epochs)
    ap.add_argument("--batch", type=int, default=Settings.batch_per_rank,
                    help="samples per rank per step (8 ranks at 16 take the steps 4 ranks take at 32)")
    ap.add_argument("--json", help="write the per-run results and the summary here")
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="record the test accuracy of the shared model every N steps when it changed "
                         "(extra.curve in the JSON); 0: only at the end")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--lr", default=f"{Settings.lr:g}",
                    help="SGD's learning rate; a comma-separated list (every method at every rate) or "
                         "grid:CENTER[:POINTS] (POINTS rates a factor 2 apart, default 5)")
    ap.add_argument("--tune", action="store_true",
                    help="every method over the --lr grid on the first seed (a best at the grid's edge widens it), "
                         "then every seed at each method's best and at fp32's best; tables against fp32 at its "
                         "best learning rate (gradzip.experiments._tune)")
    ap.add_argument("--records", help="with --tune: every finished run, one JSON line each; a rerun with the same "
                                      "file trains only what it lacks")
    ap.add_argument("--max-widen", type=int, default=3, help="with --tune: most points added past an edge")
    ap.add_argument("--launched", action="store_true",
                    help="be one rank of a job a launcher started (torchrun, gradzip-run): ranks and rendezvous "
                         "from the environment, --ranks ignored; rank 0 writes the outputs")
    args = ap.parse_args(argv)

    methods = default_methods() if args.methods is None else _split_methods(args.methods)
    seeds = [int(s) for s in args.seeds.split(",")]
    try:
        lrs = _tune.parse_lrs(args.lr)
    except ValueError as e:
        raise SystemExit(f"digits: {e}") from None
    settings = Settings(epochs=args.epochs, eval_every=args.eval_every, batch_per_rank=args.batch, lr=lrs[0])
    if args.tune:
        if args.launched:
            raise SystemExit("digits: --tune starts its own ranks; it does not run --launched")
        return _tune_main(args, methods, lrs, seeds, settings)
    runs = [(m, s, lr) for s in seeds for m in methods for lr in lrs]
    if args.launched:
        launched = run_launched(methods, seeds, settings, runs)
        if launched is None:
            return 0
        results, args.ranks = launched, launched[0]["ranks"]
    else:
        results = run_list(runs, args.ranks, settings, args.timeout)
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


def _tune_main(args: argparse.Namespace, methods: List[str], lrs: List[float], seeds: List[int],
               settings: Settings) -> int:
    """--tune: the protocol of gradzip.experiments._tune against fp32, then its tables."""
    if "fp32" not in methods:
        raise SystemExit("digits --tune: the methods need fp32 (every comparison is against it at its best rate)")

    def train(runs: List[Tuple[str, int, float]]) -> List[Dict[str, Any]]:
        return run_list(runs, args.ranks, settings, args.timeout, records=args.records)

    tuned = _tune.tune(methods, lrs, seeds, train, _tune.ACCURACY, asdict(settings), args.records,
                       max_widen=args.max_widen, log=lambda line: print(line, file=sys.stderr, flush=True))

    def ratio(r: _tune.Row) -> str:
        return f"{summarize([r.record])[0]['wire_ratio']:.1f}x"

    text = describe(settings, args.ranks, seeds) + "\n\n" + tuned.markdown([("wire ratio vs fp32 DDP", ratio)])
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": asdict(settings), "ranks": args.ranks, "methods": methods, **tuned.summary(),
                       "records": tuned.t.records.all()}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


def _split_methods(text: str) -> List[str]:
    """Splits a comma-separated method list where methods may hold commas
    (topk:density=0.01,ef=off; onebit@bmuf:h=16,mu=0.5): an element that does
    not start with a method's name (fp32, torch-fp16, powersgd or a codec)
    continues the previous method."""
    import gradzip

    names = {"fp32", "torch-fp16", "powersgd", "backend", *gradzip.codec_names()}
    out: List[str] = []
    for part in text.split(","):
        name = part.split("@")[0].split("#")[0].split("/")[0].split(":")[0].split("=")[0]
        if out and name not in names:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


if __name__ == "__main__":
    sys.exit(main())
