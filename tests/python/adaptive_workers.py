"""What the adaptive-optimizer tests of the DDP hook run on every rank
(dist_util.run_ranks): a small model under the hook with its defaults,
trained by the optimizer each case names; per step, whether every rank
holds the same parameters, and the state's codec once it has decided."""

from __future__ import annotations

import io
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gradzip.torch import CompressionState, compression_hook


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.LayerNorm(40), torch.nn.Tanh(),
                               torch.nn.Linear(40, 3))


def _optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-3)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _identical(model: torch.nn.Module, world: int) -> bool:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    got = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(got, flat)
    return all(torch.equal(got[0], t) for t in got)


def checkpoint(step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, state: Any) -> Dict[str, Any]:
    """The model, optimizer and hook state after `step` steps, as bytes."""
    saved: Dict[str, Any] = {"step": step}
    for key, obj in (("model", model.state_dict()), ("opt", opt.state_dict()), ("hook", state.state_dict())):
        buf = io.BytesIO()
        torch.save(obj, buf)
        saved[key] = buf.getvalue()
    return saved


def load_checkpoint(resume: Optional[Dict[str, Any]], model: torch.nn.Module, opt: torch.optim.Optimizer,
                    state: Any) -> int:
    """Restores `checkpoint`'s output (None: nothing); the step to go on from."""
    if resume is None:
        return 0
    model.load_state_dict(torch.load(io.BytesIO(resume["model"])))
    opt.load_state_dict(torch.load(io.BytesIO(resume["opt"])))
    state.load_state_dict(torch.load(io.BytesIO(resume["hook"]), weights_only=False))
    return resume["step"]


def train(rank: int, world: int, kind: str, codec: str = "onebit", steps: int = 6, save_at: Optional[int] = None,
          resume: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """`steps` steps of the model under CompressionState(codec) with optimizer `kind`
    (a list: one kind per rank). save_at: the step after which the model, optimizer
    and hook state are saved (returned); resume: such a save to start from."""
    if isinstance(kind, list):
        kind = kind[rank]
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets
    state = CompressionState(codec=codec)
    opt = _optimizer(kind, ddp.parameters())
    start = load_checkpoint(resume, model, opt, state)
    ddp.register_comm_hook(state, compression_hook)
    identical: List[bool] = []
    specs: List[str] = []
    saved: Dict[str, Any] = {}
    for step in range(start, steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        identical.append(_identical(model, world))
        specs.append(state.codec.spec)
        if save_at is not None and step + 1 == save_at:
            saved = checkpoint(save_at, model, opt, state)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"identical": identical, "specs": specs, "server": state.server_codec, "repr": repr(state),
            "algorithm": state._algorithm_now(),
            "stats": state.compression_stats(), "final": flat.numpy().tobytes(), "saved": saved,
            "adaptive": state.state_dict()["adaptive"]}


def train_resumed(rank: int, world: int, saves: List[Dict[str, Any]]) -> Dict[str, Any]:
    """train() of AdamW with onebit, from this rank's save."""
    return train(rank, world, "adamw", "onebit", 6, None, saves[rank])
