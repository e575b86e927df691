"""What the measured warm-up tests of the DDP hook run on every rank
(dist_util.run_ranks): a small model under CompressionState(warmup_until=...)
with AdamW; per step, whether it was a warm-up step, the averaged gradient's
norm (from the parameters' .grad, for the reference), whether every rank
holds the same parameters, and a checkpoint to resume from."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from adaptive_workers import load_checkpoint, make_model, run_steps
from gradzip.torch import CompressionState, compression_hook


def train(rank: int, world: int, kw: Dict[str, Any], steps: int = 14, save_at: Optional[int] = None,
          resume: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets
    state = CompressionState(codec="onebit", **kw)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    start = load_checkpoint(resume, model, opt, state)
    ddp.register_comm_hook(state, compression_hook)
    warm: List[bool] = []
    norms: List[float] = []
    before = [state.compression_stats()["uncompressed_steps"]]  # warm-up steps counted before this step

    def after_backward(step: int) -> None:
        now = state.compression_stats()["uncompressed_steps"]
        warm.append(now > before[0])
        before[0] = now
        norms.append(math.sqrt(sum(float(torch.sum(p.grad.double() ** 2)) for p in model.parameters())))

    identical, saved = run_steps(ddp, model, opt, state, rank, world, start, steps, save_at, lambda step: None,
                                 after_backward)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"identical": identical, "warm": warm, "norms": norms, "stats": state.compression_stats(),
            "final": flat.numpy().tobytes(), "saved": saved, "hook": state.state_dict()}


def train_resumed(rank: int, world: int, kw: Dict[str, Any], saves: List[Dict[str, Any]]) -> Dict[str, Any]:
    return train(rank, world, kw, 14, None, saves[rank])
