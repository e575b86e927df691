"""What the layer-filter tests run on every rank (dist_util.run_ranks): a
model with biases and a LayerNorm beside its matrices, under the hook with
exact_below set; the exact parameters' gradients are compared with the true
average of the ranks' gradients (all_gather), step by step."""

from __future__ import annotations

from typing import Any, Dict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gradzip.torch import CompressionState, compression_hook


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.LayerNorm(40), torch.nn.Tanh(),
                               torch.nn.Linear(40, 40, bias=False), torch.nn.Linear(40, 3))


def step_errors(model: torch.nn.Module, forward: Any, zero_grad: Any, rank: int, world: int,
                step: int) -> Any:
    """One step's batch through `forward` (the hooked model) after
    `zero_grad`; yields (parameter, the largest error of its averaged gradient
    against the true average of the ranks' gradients, from a copy of the
    model's own backward)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
    ref = make_model()
    ref.load_state_dict(model.state_dict())
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    zero_grad()
    torch.nn.functional.cross_entropy(forward(x), y).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        everyone = [torch.empty_like(q.grad) for _ in range(world)]
        dist.all_gather(everyone, q.grad)
        yield p, float((p.grad - torch.stack(everyone).mean(0)).abs().max())


def suite(rank: int, world: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name, kwargs in (("filtered", {"exact_below": 100, "warmup_steps": 2}), ("unfiltered", {})):
        model = make_model()
        ddp = DDP(model, bucket_cap_mb=0.002)  # several buckets, mixed kinds in each
        state = CompressionState(codec="onebit", **kwargs)
        ddp.register_comm_hook(state, compression_hook)
        exact_err = lossy_err = 0.0
        identical = True
        for step in range(6):
            for p, err in step_errors(model, ddp, ddp.zero_grad, rank, world, step):
                if p.dim() <= 1:
                    exact_err = max(exact_err, err)
                elif step >= 2:
                    lossy_err = max(lossy_err, err)
                got = [torch.empty_like(p.grad) for _ in range(world)]
                dist.all_gather(got, p.grad)
                identical &= all(torch.equal(got[0], t) for t in got)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.1)
        stats = state.compression_stats()
        out[name] = {"exact_err": exact_err, "lossy_err": lossy_err, "identical": identical, "stats": stats}
    return out


def adaptive_suite(rank: int, world: int, kind: str, codec: str = "topk:density=0.05",
                   exact_below: Any = "auto") -> Dict[str, Any]:
    """The hook's defaults (exact_below="auto") under an optimizer (`kind`:
    adamw or sgd) stepping the model: per step from the third (the decision
    is taken at the second), the largest error of the parameters under 1024
    elements or of at most one dimension against the true average, and of
    the 40 x 40 matrix; whether the ranks hold the same parameters."""
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.002)
    state = CompressionState(codec=codec, exact_below=exact_below)
    ddp.register_comm_hook(state, compression_hook)
    opt = (torch.optim.AdamW(ddp.parameters(), lr=1e-2) if kind == "adamw"
           else torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9))
    small_err = big_err = 0.0
    identical = True
    for step in range(5):
        for p, err in step_errors(model, ddp, opt.zero_grad, rank, world, step):
            if step >= 2:
                if p.dim() <= 1 or p.numel() < 1024:
                    small_err = max(small_err, err)
                else:
                    big_err = max(big_err, err)
        opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        got = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(got, flat)
        identical &= all(torch.equal(got[0], t) for t in got)
    return {"small_err": small_err, "big_err": big_err, "identical": identical,
            "stats": state.compression_stats(), "exact": state._exact, "codec": state.codec.spec}
