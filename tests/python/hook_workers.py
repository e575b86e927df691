"""What the hook's integration tests run on every rank (see dist_util.run_ranks):
the way frameworks build and register the state, many small buckets over
both transports, and a rank killed mid-step."""

from __future__ import annotations

import os
import pickle
import signal
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip
from ddp_workers import SMALL_BUCKETS_MB, batch, digest, make_model, same_on_all_ranks
from gradzip.torch import CompressionState, compression_hook


def train(ddp: DDP, model: torch.nn.Module, steps: int, first_step: int = 0) -> None:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    rank = dist.get_rank()
    for step in range(first_step, first_step + steps):
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()


def lightning_sequence(rank: int, world: int, state: CompressionState, pickled: bytes,
                       settings: Dict[str, Any]) -> Dict[str, Any]:
    """Lightning's order: the user's script builds the state before any
    process group exists; the spawn launcher pickles it into each rank (here:
    run_ranks pickles `state` as Lightning's launcher pickles the strategy,
    and `pickled` was made by pickle.dumps in the test process); the process
    group starts; the strategy wraps the model in DDP and only then registers
    the hook. The result must equal a state built inside the rank from the
    same `settings`."""
    out: Dict[str, Any] = {"world_before_first_step": state._world_size}
    spawned = pickle.loads(pickled)
    runs: Dict[str, torch.Tensor] = {}
    for name, st in (("launcher", state), ("pickled", spawned),
                     ("in_rank", CompressionState(**settings))):
        model = make_model()
        ddp = DDP(model, bucket_cap_mb=SMALL_BUCKETS_MB)  # wrapped first ...
        ddp.register_comm_hook(st, compression_hook)  # ... registered after, as DDPStrategy does
        train(ddp, model, 6)
        runs[name] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        out[f"step/{name}"] = st.step
        out[f"world/{name}"] = st._world_size
    out["launcher_equals_in_rank"] = torch.equal(runs["launcher"], runs["in_rank"])
    out["pickled_equals_in_rank"] = torch.equal(runs["pickled"], runs["in_rank"])
    out["identical"] = same_on_all_ranks(runs["in_rank"])
    out["digest"] = digest(runs["in_rank"])
    return out


# Settings the stress runs cycle through: codec, transport, algorithm, warm-up.
STRESS = [
    ("onebit", "torch", "auto", 0),
    ("topk:density=0.05", "torch", "auto", 1),
    ("fp16", "torch", "scatter_reduce", 0),
    ("onebit", "gradzip", "auto", 2),
    ("topk:density=0.01", "torch", "allgather", 0),
    ("none", "gradzip", "auto", 0),
    ("onebit:block=64", "torch", "scatter_reduce", 1),
]


def deep_model(seed: int, layers: int = 30) -> torch.nn.Module:
    """30 small layers: with a tiny bucket cap, a bucket each."""
    torch.manual_seed(seed)
    mods: List[torch.nn.Module] = [torch.nn.Linear(64, 16)]
    for _ in range(layers - 2):
        mods += [torch.nn.Tanh(), torch.nn.Linear(16, 16)]
    mods += [torch.nn.Tanh(), torch.nn.Linear(16, 10)]
    return torch.nn.Sequential(*mods)


def many_small_buckets(rank: int, world: int, runs: int, steps: int) -> Dict[str, Any]:
    """`runs` fresh DDP models with 30 tiny buckets each, cycling
    through codecs, both transports, algorithms and warm-up switches; every
    run must end with the same parameters on every rank. A hang anywhere
    fails the test at run_ranks' deadline."""
    out: Dict[str, Any] = {"identical": [], "steps": [], "buckets": []}
    for i in range(runs):
        codec, transport, algorithm, warmup = STRESS[i % len(STRESS)]
        if transport == "gradzip" and not gradzip.BUILD["ucx"]:
            transport = "torch"
        model = deep_model(seed=i)
        ddp = DDP(model, bucket_cap_mb=0.0005)  # 131 floats: a bucket per parameter
        state = CompressionState(codec=codec, transport=transport, algorithm=algorithm, warmup_steps=warmup)
        ddp.register_comm_hook(state, compression_hook)
        train(ddp, model, steps)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        out["identical"].append(same_on_all_ranks(flat))
        out["steps"].append(state.step)
        out["buckets"].append(len(state._tracker._plans))
        del ddp, state
    return out


def victim_dies_mid_step(rank: int, world: int, victim: int, transport: str, timeout_s: float) -> Dict[str, Any]:
    """Trains with the hook; in step 3 the victim kills itself (SIGKILL) from
    inside its hook's worker thread, in the middle of the step's exchanges.
    The others must raise from backward() (not hang) within the timeout."""
    os.environ["GRADZIP_TIMEOUT_S"] = str(timeout_s)
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=SMALL_BUCKETS_MB)
    state = CompressionState(codec="onebit", transport=transport)
    ddp.register_comm_hook(state, compression_hook)
    if rank == victim:
        calls: List[int] = []
        real = gradzip.Communicator.allreduce

        def allreduce_then_die(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if state.step >= 3 and len(calls) % 3 == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, *args, **kwargs)

        gradzip.Communicator.allreduce = allreduce_then_die  # type: ignore[method-assign]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    start = None
    try:
        for step in range(50):
            x, y = batch(step, rank)
            opt.zero_grad()
            start = time.monotonic()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
    except Exception as e:  # what the survivors must see
        return {"failed_after_s": time.monotonic() - start, "error": f"{type(e).__name__}: {e}",
                "step": state.step}
    return {"failed_after_s": None, "error": None, "step": state.step}
