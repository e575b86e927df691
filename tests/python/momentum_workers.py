"""What the momentum-correction tests of the DDP hook run on every rank
(dist_util.run_ranks): a small model under CompressionState with momentum
SGD; the hook's own correction, a plain reference of the rule wrapped around
the uncorrected hook, and checkpoints to resume from."""

# No "from __future__ import annotations": DDP checks the reference hook's annotations.
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from adaptive_workers import load_checkpoint, make_model, run_steps
from gradzip.torch import CompressionState, compression_hook

BETA = 0.8


def reference_hook(beta: float, start: int) -> Any:
    """The rule, plainly, around the uncorrected hook (per bucket index; from
    step `start` on): u = beta u + g goes into the hook; the hook's average
    S_t comes back as S_t - beta S_{t-1}."""
    u: Dict[int, torch.Tensor] = {}
    prev: Dict[int, torch.Tensor] = {}

    def hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if state.step < start:
            return compression_hook(state, bucket)
        buf, k = bucket.buffer(), bucket.index()
        if k not in u:
            u[k], prev[k] = torch.zeros_like(buf), torch.zeros_like(buf)
        u[k] = beta * u[k] + buf
        buf.copy_(u[k])

        def after(f: Any) -> torch.Tensor:
            s = f.value()
            out = s - beta * prev[k]
            prev[k] = s.clone()
            s.copy_(out)
            return s

        return compression_hook(state, bucket).then(after)

    return hook


def train(rank: int, world: int, codec: str, mode: str = "auto", steps: int = 8, save_at: Optional[int] = None,
          resume: Optional[Dict[str, Any]] = None, optimizer: str = "sgd") -> Dict[str, Any]:
    """mode: "auto" (the default correction), "off" (momentum_correction=None),
    "reference" (off, with reference_hook around it from step 1, where "auto"
    decides), "beta" (momentum_correction=BETA with adaptive=False: from step 0)."""
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets
    kw: Dict[str, Any] = {"off": {"momentum_correction": None}, "reference": {"momentum_correction": None},
                          "beta": {"momentum_correction": BETA, "adaptive": False}}.get(mode, {})
    state = CompressionState(codec=codec, **kw)
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=BETA)
    elif optimizer == "nesterov":
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=BETA, nesterov=True)
    elif optimizer == "plain":
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    else:
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    start = load_checkpoint(resume, model, opt, state)
    ddp.register_comm_hook(state, reference_hook(BETA, 1) if mode == "reference" else compression_hook)
    params: List[bytes] = []
    identical, saved = run_steps(ddp, model, opt, state, rank, world, start, steps, save_at, lambda step: params.append(
        torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes()))
    return {"identical": identical, "params": params, "saved": saved, "final": params[-1],
            "beta": None if state._mc is None else state._mc.beta, "spec": state.codec.spec,
            "stats": state.compression_stats()}


def train_resumed(rank: int, world: int, codec: str, mode: str, steps: int,
                  saves: List[Dict[str, Any]]) -> Dict[str, Any]:
    return train(rank, world, codec, mode, steps, None, saves[rank])
