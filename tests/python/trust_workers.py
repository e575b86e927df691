"""What the trust tests run on every rank (see dist_util.run_ranks): DDP hooks
built differently on different ranks, and a gradzip-transport hook whose
peer stops taking part."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Tuple

import torch.distributed as dist

import gradzip
from ddp_workers import Run

# (name, rank 0's settings, rank 1's settings): every row of the issue, and a
# checkpoint restored on one rank only.
MISMATCHES: List[Tuple[str, Dict[str, Any], Dict[str, Any]]] = [
    ("onebit_vs_fp16", {"codec": "onebit"}, {"codec": "fp16"}),
    ("topk_densities", {"codec": "topk:density=0.01"}, {"codec": "topk:density=0.05"}),
    ("onebit_blocks", {"codec": "onebit:block=256"}, {"codec": "onebit"}),
    ("none_vs_onebit", {"codec": "none"}, {"codec": "onebit"}),
    ("warmup", {"codec": "onebit", "warmup_steps": 0}, {"codec": "onebit", "warmup_steps": 2}),
    ("ef_off", {"codec": "onebit"}, {"codec": "onebit:ef=off"}),
]


def hook_mismatch_suite(rank: int, world: int, transports: List[str]) -> Dict[str, Any]:
    """Each mismatch, on fresh models in the same processes (a mismatch is
    raised before any collective, so the process group stays usable)."""
    out: Dict[str, Any] = {}
    for transport in transports:
        for name, mine0, mine1 in MISMATCHES:
            kwargs = dict(mine0 if rank == 0 else mine1)
            kwargs.setdefault("transport", transport)
            t0 = time.monotonic()
            try:
                Run(**kwargs).train(3)
                out[f"{transport}/{name}"] = ("no error", 0.0)
            except Exception as e:  # what the test inspects
                out[f"{transport}/{name}"] = (f"{type(e).__module__}.{type(e).__name__}: {e}", time.monotonic() - t0)
        # A checkpoint restored on rank 1 only: the steps differ.
        trained = Run("onebit", transport=transport)
        trained.train(2)
        blob = trained.checkpoint()
        fresh = Run("onebit", transport=transport)
        if rank == 1:
            fresh.restore(blob)
        try:
            fresh.train(1)
            out[f"{transport}/restored_on_one_rank"] = ("no error", 0.0)
        except Exception as e:
            out[f"{transport}/restored_on_one_rank"] = (f"{type(e).__module__}.{type(e).__name__}: {e}", 0.0)
        dist.barrier()
    return out


def silent_peer(rank: int, world: int) -> str:
    """transport="gradzip": rank 1 stops calling the hook; rank 0's backward
    raises gradzip.IoError (its own type) within GRADZIP_TIMEOUT_S."""
    os.environ["GRADZIP_TIMEOUT_S"] = "3"
    run = Run("onebit", transport="gradzip")
    run.train(2)
    if rank == 1:
        time.sleep(8)  # alive, silent
        return "silent"
    t0 = time.monotonic()
    try:
        run.train(1)
        return "no error"
    except Exception as e:
        return f"{type(e).__module__}.{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"
