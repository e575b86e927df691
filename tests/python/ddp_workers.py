"""Training loops that the DDP tests run on every rank (see dist_util.run_ranks).

Each returns plain data (lists, bytes) so results cross process boundaries
without torch's shared-memory machinery.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip
from gradzip.torch import CompressionState, compression_hook

# Small buckets (about 1300 floats) so the model spans several of them.
SMALL_BUCKETS_MB = 0.005


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 48), torch.nn.ReLU(),
        torch.nn.Linear(48, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 10))


def batch(step: int, rank: int) -> tuple:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 64, generator=g)
    y = torch.randint(0, 10, (16,), generator=g)
    return x, y


class Run:
    """A model, its DDP wrapper, optimizer and (optionally) a gradzip hook."""

    def __init__(self, codec: Optional[str], bucket_mb: Optional[float] = SMALL_BUCKETS_MB,
                 dtype: torch.dtype = torch.float32, **state_kwargs: Any):
        self.dtype = dtype
        self.model = make_model().to(dtype)  # a 16-bit model gives DDP buckets of its dtype
        kwargs = {} if bucket_mb is None else {"bucket_cap_mb": bucket_mb}
        self.ddp = DDP(self.model, **kwargs)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.1, momentum=0.9)
        self.state = None
        if codec is not None:
            self.state = CompressionState(codec=codec, **state_kwargs)
            self.ddp.register_comm_hook(self.state, compression_hook)
        self.step = 0

    def train(self, steps: int) -> None:
        rank = dist.get_rank()
        for _ in range(steps):
            x, y = batch(self.step, rank)
            x = x.to(self.dtype)
            self.opt.zero_grad()
            torch.nn.functional.cross_entropy(self.ddp(x), y).backward()
            self.opt.step()
            self.step += 1

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])

    def checkpoint(self) -> bytes:
        buf = io.BytesIO()
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "hook": None if self.state is None else self.state.state_dict()}, buf)
        return buf.getvalue()

    def restore(self, blob: bytes) -> None:
        ck = torch.load(io.BytesIO(blob), weights_only=True)
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.step = ck["step"]
        if self.state is not None:
            self.state.load_state_dict(ck["hook"])


def sixteen_bit_suite(rank: int, world: int, steps: int = 6) -> Dict[str, Any]:
    """The hook on models kept in bfloat16 and float16 (buckets of that dtype)."""
    out: Dict[str, Any] = {}
    for dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).replace("torch.", "")
        plain = Run(None, dtype=dtype)
        plain.train(steps)
        reference = plain.flat().float()
        hooked = Run("none", dtype=dtype)  # the dense path: torch's allreduce in the bucket's dtype, as DDP
        hooked.train(steps)
        out[f"none_equal/{name}"] = torch.equal(plain.flat(), hooked.flat())
        out[f"none_stats/{name}"] = hooked.state.compression_stats()
        for codec in ("onebit", "topk:density=0.01", "fp8", "onebit:ef=off"):
            run = Run(codec, dtype=dtype)
            run.train(steps)
            flat = run.flat()
            out[f"dtype/{name}/{codec}"] = str(flat.dtype)
            out[f"identical/{name}/{codec}"] = same_on_all_ranks(flat)
            out[f"finite/{name}/{codec}"] = bool(torch.isfinite(flat).all())
            out[f"drift/{name}/{codec}"] = float((flat.float() - reference).norm() / reference.norm())
            out[f"stats/{name}/{codec}"] = run.state.compression_stats()
        # A checkpoint of a 16-bit model resumes bit-identically.
        whole = Run("onebit", dtype=dtype)
        whole.train(2 * steps)
        first = Run("onebit", dtype=dtype)
        first.train(steps)
        blob = first.checkpoint()
        resumed = Run("onebit", dtype=dtype)
        resumed.restore(blob)
        resumed.train(steps)
        out[f"resume/{name}"] = torch.equal(whole.flat(), resumed.flat())
        if gradzip.BUILD["ucx"]:
            run = Run("onebit", dtype=dtype, transport="gradzip", algorithm="scatter_reduce")
            run.train(steps)
            out[f"gz/identical/{name}"] = same_on_all_ranks(run.flat())
            out[f"gz/drift/{name}"] = float((run.flat().float() - reference).norm() / reference.norm())
    # Ranks whose models differ in dtype fail on every rank, naming it.
    try:
        Run("onebit", dtype=torch.bfloat16 if rank == 0 else torch.float32).train(1)
        out["mixed"] = "no error"
    except gradzip.InvalidArgument as e:
        out["mixed"] = str(e)
    return out


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def same_on_all_ranks(t: torch.Tensor) -> bool:
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t)
    return all(torch.equal(everyone[0], e) for e in everyone)


CODECS = ["fp16", "bf16", "onebit", "onebit:ef=off", "onebit:block=64", "topk:density=0.01",
          "topk:density=0.01,ef=off", "topk:density=0.05,select=sample"]


def hook_suite(rank: int, world: int, steps: int = 6) -> Dict[str, Any]:
    """Everything the DDP hook tests check, in one set of processes."""
    out: Dict[str, Any] = {}

    # The none codec equals DDP without a hook, bit for bit (one bucket and
    # several; the reference is the same layout, as gloo's summation order
    # depends on where an element sits in its bucket).
    for bucket_mb in (None, SMALL_BUCKETS_MB):
        plain = Run(None, bucket_mb)
        plain.train(steps)
        hooked = Run("none", bucket_mb)
        hooked.train(steps)
        out[f"none_equal/{bucket_mb}"] = torch.equal(plain.flat(), hooked.flat())
    out["none_stats"] = hooked.state.compression_stats()

    # Every codec: identical parameters on every rank, and close to plain training.
    reference = plain.flat()
    for codec in CODECS:
        run = Run(codec)
        run.train(steps)
        flat = run.flat()
        out[f"identical/{codec}"] = same_on_all_ranks(flat)
        out[f"finite/{codec}"] = bool(torch.isfinite(flat).all())
        out[f"drift/{codec}"] = float((flat - reference).norm() / reference.norm())
        out[f"stats/{codec}"] = run.state.compression_stats()
        out[f"events/{codec}"] = list(run.state._tracker.events)

    # Warm-up: the first steps are plain allreduce.
    warm = Run("onebit", warmup_steps=steps)
    warm.train(steps)
    out["warmup_equal"] = torch.equal(warm.flat(), reference)
    out["warmup_stats"] = warm.state.compression_stats()

    # Checkpoints: resume in a fresh DDP (whose first step buckets differ)
    # and in the same one; both must continue bit-identically.
    for codec in ("onebit", "topk:density=0.05,select=sample", "fp16", "onebit:ef=off"):
        whole = Run(codec)
        whole.train(2 * steps)
        first = Run(codec)
        first.train(steps)
        blob = first.checkpoint()
        first.train(steps)
        resumed = Run(codec)
        resumed.restore(blob)
        resumed.train(steps)
        out[f"resume_fresh/{codec}"] = torch.equal(whole.flat(), resumed.flat())
        out[f"resume_events/{codec}"] = list(resumed.state._tracker.events)
        first.restore(blob)
        first.train(steps)
        out[f"resume_same/{codec}"] = torch.equal(whole.flat(), first.flat())

    # transport="gradzip": gradzip's communicator (UCX) instead of torch's all_gather.
    if gradzip.BUILD["ucx"]:
        for codec, algorithm in (("onebit", "scatter_reduce"), ("topk:density=0.01", "auto"), ("fp16", "allgather")):
            run = Run(codec, transport="gradzip", algorithm=algorithm)
            run.train(steps)
            flat = run.flat()
            out[f"gz/identical/{codec}"] = same_on_all_ranks(flat)
            out[f"gz/drift/{codec}"] = float((flat - reference).norm() / reference.norm())
            out[f"gz/stats/{codec}"] = run.state.compression_stats()
        whole = Run("onebit", transport="gradzip")
        whole.train(2 * steps)
        first = Run("onebit", transport="gradzip")
        first.train(steps)
        blob = first.checkpoint()
        resumed = Run("onebit", transport="gradzip")
        resumed.restore(blob)
        resumed.train(steps)
        out["gz/resume_fresh"] = torch.equal(whole.flat(), resumed.flat())

    # The check has teeth: resuming without the hook's state (residuals from
    # zero) does not give the same parameters.
    whole = Run("onebit")
    whole.train(2 * steps)
    first = Run("onebit")
    first.train(steps)
    blob = first.checkpoint()
    careless = Run("onebit")
    careless.restore(blob)
    careless.state.load_state_dict(CompressionState(codec="onebit").state_dict())
    careless.train(steps)
    out["resume_without_residuals_differs"] = not torch.equal(whole.flat(), careless.flat())
    return out
