"""What test_resume.py runs on every rank (dist_util.run_ranks): the DDP
hook resumed from its own state, from another rank's, on some ranks only,
and through gradzip's per-rank files, whole or tampered with."""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip
from ddp_workers import SMALL_BUCKETS_MB, batch, digest, make_model, same_on_all_ranks
from gradzip.torch import CompressedSGD, CompressionState, checkpoint, compression_hook

CODEC = "onebit"  # residuals worth losing: the resumed run ends elsewhere without them


class Job:
    """One rank of a training job: a model, DDP with the hook, SGD."""

    def __init__(self, params: "torch.Tensor | None" = None, opt_state: Any = None) -> None:
        self.model = make_model()
        if params is not None:
            torch.nn.utils.vector_to_parameters(params, self.model.parameters())
        self.ddp = DDP(self.model, bucket_cap_mb=SMALL_BUCKETS_MB)
        self.state = CompressionState(codec=CODEC, warmup_steps=1)
        self.ddp.register_comm_hook(self.state, compression_hook)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.1, momentum=0.9)
        if opt_state is not None:
            self.opt.load_state_dict(opt_state)
        self.step = 0

    def train(self, steps: int) -> None:
        rank = dist.get_rank()
        for _ in range(steps):
            x, y = batch(self.step, rank)
            self.opt.zero_grad()
            torch.nn.functional.cross_entropy(self.ddp(x), y).backward()
            self.opt.step()
            self.step += 1

    def params(self) -> torch.Tensor:
        return torch.nn.utils.parameters_to_vector(self.model.parameters()).detach().clone()

    def restarted(self) -> "Job":
        """A new job at this one's parameters and optimizer state (not the hook's)."""
        job = Job(self.params(), copy.deepcopy(self.opt.state_dict()))  # the live buffers would be shared
        job.step = self.step
        return job


def _warnings_of(fn: Any) -> List[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning) and "gradzip" in str(w.message)]


def one_copy(rank: int, world: int) -> Dict[str, Any]:
    """Rank 0's hook state restored on every rank (what a one-copy
    checkpointer does): no rank raises; every rank warns once and drops its
    residuals; the ranks stay identical; the run differs from one resumed
    with each rank's own state (which equals the uninterrupted run)."""
    job = Job()
    job.train(3)
    own = job.state.state_dict()
    rank0 = [own]
    dist.broadcast_object_list(rank0, src=0)
    resumed_own, resumed_one = job.restarted(), job.restarted()
    job.train(3)
    resumed_own.state.load_state_dict(own)
    resumed_own.train(3)
    resumed_one.state.load_state_dict(rank0[0])
    warned = _warnings_of(lambda: resumed_one.train(3))
    return {"warned": warned, "own_equals_uninterrupted": torch.equal(resumed_own.params(), job.params()),
            "one_copy_equals_uninterrupted": torch.equal(resumed_one.params(), job.params()),
            "identical": same_on_all_ranks(resumed_one.params())}


def some_ranks_only(rank: int, world: int) -> str:
    """Only rank 0 restores: the first step must fail on every rank alike."""
    job = Job()
    job.train(2)
    saved = job.state.state_dict()
    resumed = job.restarted()
    if rank == 0:
        resumed.state.load_state_dict(saved)
    try:
        resumed.train(1)
    except gradzip.InvalidArgument as e:
        return str(e)
    return "no error"


def rank_files(rank: int, world: int, folder: str, case: str) -> Dict[str, Any]:
    """gradzip.torch.checkpoint round trip, and `case`'s tampering before the load."""
    job = Job()
    job.train(3)
    path = checkpoint.save(folder, job.state)
    resumed = job.restarted()
    job.train(3)
    dist.barrier()
    if case == "missing" and rank == 1:
        os.remove(path)
    elif case == "world":
        os.replace(path, checkpoint.path_of(folder, rank, 4))
    elif case == "forged" and rank == 1:  # rank 0's file under rank 1's name
        torch.save(torch.load(checkpoint.path_of(folder, 0, world), weights_only=True), path)
    elif case == "pickle" and rank == 1:  # a pickle that would run code
        torch.save({"format": "gradzip-rank-state", "evil": os.system}, path)
    elif case == "garbled" and rank == 1:  # a well-formed file whose residual bytes were changed
        body = torch.load(path, weights_only=True)
        for seg in body["objects"][0]["state"]["segments"]:
            ef = seg["ef"]
            for key, value in ef.items():
                if isinstance(value, bytes) and len(value) > 64:
                    ef[key] = value[:40] + bytes([value[40] ^ 1]) + value[41:]
        torch.save(body, path)
    dist.barrier()
    out: Dict[str, Any] = {}
    objects = [resumed.state] if case != "kinds" else [resumed.state, CompressedSGD(resumed.model.parameters())]
    try:
        out["warned"] = _warnings_of(lambda: out.__setitem__("restored", checkpoint.load(folder, *objects)))
    except gradzip.InvalidArgument as e:
        out["error"] = str(e)
        return out
    resumed.train(3)
    out["equals_uninterrupted"] = torch.equal(resumed.params(), job.params())
    out["identical"] = same_on_all_ranks(resumed.params())
    out["digest"] = digest(resumed.params())
    return out


def dcp_round_trip(rank: int, world: int, folder: str) -> Dict[str, Any]:
    """torch.distributed.checkpoint with checkpoint.Stateful: every rank's own
    residuals come back (DCP would otherwise keep one rank's copy of a key
    every rank holds)."""
    import torch.distributed.checkpoint as dcp

    job = Job()
    job.train(3)
    dcp.save({"gradzip": checkpoint.Stateful(job.state)}, checkpoint_id=folder)
    resumed = job.restarted()
    job.train(3)
    warned = _warnings_of(lambda: dcp.load({"gradzip": checkpoint.Stateful(resumed.state)}, checkpoint_id=folder))
    resumed.train(3)
    return {"warned": warned, "equals_uninterrupted": torch.equal(resumed.params(), job.params()),
            "identical": same_on_all_ranks(resumed.params())}


def shared_stats(rank: int, world: int) -> Dict[str, Any]:
    """compression_stats() of the hook, CompressedAdamW and BlockMomentum after
    a few steps: the keys every entry point reports (_stats.py)."""
    from gradzip.torch import BlockMomentum, CompressedAdamW

    out: Dict[str, Any] = {}
    job = Job()
    job.train(3)
    out["hook"] = job.state.compression_stats()
    model = make_model()
    ddp = DDP(model)
    opt = CompressedAdamW(model.parameters(), codec="onebit", min_warmup_steps=1, max_warmup_steps=2)
    opt.register_ddp(ddp)
    bm_model = make_model()
    local = torch.optim.SGD(bm_model.parameters(), lr=0.1)
    bm = BlockMomentum(bm_model, local, block_steps=2, codec="onebit")
    for step in range(4):
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        bm.zero_grad()
        torch.nn.functional.cross_entropy(bm_model(x), y).backward()
        bm.step()
    out["CompressedAdamW"] = opt.compression_stats()
    out["BlockMomentum"] = bm.compression_stats()
    out["elements"] = sum(p.numel() for p in model.parameters())
    return out


def fsdp_one_copy(rank: int, world: int) -> Dict[str, Any]:
    """FSDP2's gradzip state from rank 0 restored on every rank: no rank
    raises; every rank warns once and drops its residuals; with each rank's
    own state the run is bit-identical to the uninterrupted one."""
    from fsdp_workers import sharded, train
    from gradzip.torch import fsdp as gz_fsdp

    def fresh() -> Any:
        model = sharded()
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), \
            gz_fsdp.register(model, codec="onebit")

    model, opt, state = fresh()
    train(model, opt, rank, range(3))
    ckpt = copy.deepcopy({"model": model.state_dict(), "optim": opt.state_dict(), "gradzip": state.state_dict()})
    rank0 = [ckpt["gradzip"]]
    dist.broadcast_object_list(rank0, src=0)
    train(model, opt, rank, range(3, 6))
    straight = [p.to_local().clone() for p in model.parameters()]
    out: Dict[str, Any] = {}
    for name, gz_state in (("own", ckpt["gradzip"]), ("one_copy", rank0[0])):
        m, o, s = fresh()
        m.load_state_dict(ckpt["model"])
        o.load_state_dict(copy.deepcopy(ckpt["optim"]))
        s.load_state_dict(copy.deepcopy(gz_state))
        out[f"{name}_warned"] = _warnings_of(lambda: train(m, o, rank, range(3, 6)))
        params = [p.to_local() for p in m.parameters()]
        out[f"{name}_equal"] = all(torch.equal(a, b) for a, b in zip(straight, params))
        out[f"{name}_identical"] = same_on_all_ranks(torch.cat([p.full_tensor().reshape(-1) for p in m.parameters()]))
    return out


def bmuf_one_copy(rank: int, world: int) -> Dict[str, Any]:
    """BlockMomentum restored from rank 0's state on every rank (W, Delta and
    the counters are every rank's; the residuals are rank 0's): no rank
    raises; every rank warns once and starts its residuals fresh; each rank's
    own state resumes bit-identically."""
    from gradzip.torch import BlockMomentum

    def fresh() -> Any:
        model = make_model()
        local = torch.optim.SGD(model.parameters(), lr=0.1)
        return model, BlockMomentum(model, local, block_steps=2, codec="onebit")

    def train(model: Any, bm: Any, steps: range) -> None:
        for step in steps:
            x, y = batch(step, rank)
            bm.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            bm.step()

    model, bm = fresh()
    train(model, bm, range(4))
    saved = copy.deepcopy({"model": model.state_dict(), "bm": bm.state_dict()})
    rank0 = [saved["bm"]]
    dist.broadcast_object_list(rank0, src=0)
    train(model, bm, range(4, 8))
    bm.sync()
    straight = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    out: Dict[str, Any] = {}
    for name, state in (("own", saved["bm"]), ("one_copy", rank0[0])):
        m, b = fresh()
        m.load_state_dict(saved["model"])
        out[f"{name}_warned"] = _warnings_of(lambda: b.load_state_dict(copy.deepcopy(state)))
        train(m, b, range(4, 8))
        b.sync()
        params = torch.nn.utils.parameters_to_vector(m.parameters()).detach()
        out[f"{name}_equal"] = torch.equal(params, straight)
        with b.global_model():
            out[f"{name}_identical"] = same_on_all_ranks(
                torch.nn.utils.parameters_to_vector(m.parameters()).detach().clone())
    return out


def dcp_partial(rank: int, world: int, folder: str) -> Dict[str, Any]:
    """A DCP checkpoint that lacks gradzip's entries (saved without them, or
    by another world size), loaded with a partial-load planner: every rank
    warns and continues fresh; nothing raises."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    job = Job()
    job.train(2)
    dcp.save({"model": job.model.state_dict()}, checkpoint_id=folder)
    resumed = job.restarted()
    sd = {"model": resumed.model.state_dict(), "gradzip": checkpoint.Stateful(resumed.state)}
    warned = _warnings_of(lambda: dcp.load(sd, checkpoint_id=folder,
                                           planner=DefaultLoadPlanner(allow_partial_load=True)))
    resumed.train(2)
    return {"warned": warned, "identical": same_on_all_ranks(resumed.params())}
