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


def run_steps(ddp: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, state: Any, rank: int, world: int,
              start: int, steps: int, save_at: Optional[int], record: Any,
              after_backward: Any = None) -> "tuple[List[bool], Dict[str, Any]]":
    """The hook tests' training loop, steps `start` to `steps`: a batch keyed by
    (step, rank), backward, after_backward(step) (the averaged gradients are
    in .grad), opt.step(), then record(step) for what the caller keeps.
    Returns whether every rank held the same parameters after each step, and
    the checkpoint taken after `save_at` steps ({} if none)."""
    identical: List[bool] = []
    saved: Dict[str, Any] = {}
    for step in range(start, steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        if after_backward is not None:
            after_backward(step)
        opt.step()
        identical.append(_identical(model, world))
        record(step)
        if save_at is not None and step + 1 == save_at:
            saved = checkpoint(save_at, model, opt, state)
    return identical, saved


def train(rank: int, world: int, kind: str, codec: str = "onebit", steps: int = 6, save_at: Optional[int] = None,
          resume: Optional[Dict[str, Any]] = None, precondition: Any = "auto") -> Dict[str, Any]:
    """`steps` steps of the model under CompressionState(codec, precondition=...) with
    optimizer `kind` (kind, precondition: a list: one per rank). save_at: the step
    after which the model, optimizer and hook state are saved (returned); resume:
    such a save to start from."""
    if isinstance(kind, list):
        kind = kind[rank]
    if isinstance(precondition, list):
        precondition = precondition[rank]
    model = make_model()
    ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets
    state = CompressionState(codec=codec, precondition=precondition)
    opt = _optimizer(kind, ddp.parameters())
    start = load_checkpoint(resume, model, opt, state)
    ddp.register_comm_hook(state, compression_hook)
    specs: List[str] = []
    identical, saved = run_steps(ddp, model, opt, state, rank, world, start, steps, save_at,
                                 lambda step: specs.append(state.codec.spec))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"identical": identical, "specs": specs, "server": state.server_codec, "repr": repr(state),
            "algorithm": state.compression_stats()["algorithm"],
            "stats": state.compression_stats(), "final": flat.numpy().tobytes(), "saved": saved,
            "adaptive": state.state_dict()["adaptive"]}


def train_resumed(rank: int, world: int, saves: List[Dict[str, Any]], kind: str = "adamw",
                  codec: str = "onebit") -> Dict[str, Any]:
    """train() of `codec` (AdamW unless `kind` says otherwise), from this rank's save."""
    return train(rank, world, kind, codec, 6, None, saves[rank])


def preconditioned_average(rank: int, world: int, codec: str, steps: int = 4) -> Dict[str, Any]:
    """The hook's averaged gradient, and its plain reference, at each step of
    AdamW on a one-parameter model (DDP's bucket is that parameter): the
    reference is mean_r(D(C(g_r / d))) * d, with g_r each rank's own gradient
    (backward under no_sync), d = max(sqrt(v / (1 - beta2^t)), 0.01 mean) and v
    the EMA of the squared averaged gradients, computed here from the hook's
    outputs, C and D gradzip.Codec's encode and decode."""
    import numpy as np

    import gradzip

    torch.manual_seed(0)
    model = torch.nn.Linear(24, 40, bias=False)  # 960 elements: one full onebit block and a partial one
    ddp = DDP(model)
    # exact_below=None: under AdamW the default filter would average these 960 elements exactly (< 1024)
    state = CompressionState(codec=codec, precondition=True, exact_below=None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, betas=(0.9, 0.99))
    ddp.register_comm_hook(state, compression_hook)
    v = np.zeros(model.weight.numel(), dtype=np.float64)
    got, want = [], []
    for step in range(steps):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(8, 24, generator=g), torch.randn(8, 40, generator=g)
        opt.zero_grad()
        with ddp.no_sync():  # this rank's own gradient, no exchange
            torch.nn.functional.mse_loss(ddp(x), y).backward()
        own = model.weight.grad.detach().reshape(-1).clone()
        mine = [torch.empty_like(own) for _ in range(world)]
        dist.all_gather(mine, own)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        out = model.weight.grad.detach().reshape(-1).double().numpy()
        if step >= 2:  # step 1 decides (AdamW seen at step 0's end) and preconditions already: v exists
            c = gradzip.Codec(state.codec.spec)  # the codec as the hook runs it for AdamW (no error feedback)
            assert not c.error_feedback
            d = np.sqrt(v / (1 - 0.99 ** step))
            d = np.maximum(d, 0.01 * d.mean()).astype(np.float32)
            dec = [c.decode(c.encode((m.numpy() / d).astype(np.float32)), n=d.size) for m in mine]
            ref = (np.sum([np.asarray(x_, dtype=np.float64) for x_ in dec], axis=0) / world) * d
            got.append(out.tolist())
            want.append(ref.tolist())
        v = 0.99 * v + 0.01 * out ** 2
        opt.step()
    return {"got": got, "want": want, "stats": state.compression_stats(), "repr": repr(state)}


def warnings_seen(rank: int, world: int) -> Dict[str, List[str]]:
    """The hook's quality warnings (gradzip.torch.hook's WARNING records) that
    3 steps of each case log on this rank: (codec, optimizer); None: the
    default codec. "again" repeats the first case in the same process without
    resetting the once-per-process flag."""
    import logging

    from gradzip.torch import _quality

    cases = {"onebit/adamw": ("onebit", "adamw"), "onebit/adamw again": ("onebit", "adamw"),
             "onebit/sgd": ("onebit", "sgd"), "topk/rmsprop": ("topk:density=0.05", "rmsprop"),
             "default/adamw": (None, "adamw")}
    seen: List[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                seen.append(record.getMessage())

    handler = Keep()
    logging.getLogger("gradzip.torch.hook").addHandler(handler)
    out: Dict[str, List[str]] = {}
    for name, (codec, kind) in cases.items():
        if not name.endswith("again"):
            _quality._warned = False
        del seen[:]
        model = make_model()
        ddp = DDP(model)
        state = CompressionState() if codec is None else CompressionState(codec=codec)
        opt = _optimizer(kind, ddp.parameters())
        ddp.register_comm_hook(state, compression_hook)
        run_steps(ddp, model, opt, state, rank, world, 0, 3, None, lambda step: None)
        out[name] = list(seen)
    logging.getLogger("gradzip.torch.hook").removeHandler(handler)
    return out
