"""What the issue 25 tests run on every rank (see dist_util.run_ranks): the
surfaces added after the trust work, each against the adversary it has to
stand: a rank whose transport sends the wrong bytes, a stranger writing to
torch's store, checkpoints tampered with on disk or restored differently on
different ranks, ranks whose settings differ and that leave as soon as
they raise."""

from __future__ import annotations

import copy
import os
import threading
import time
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import gradzip
from gradzip.torch import BlockMomentum, _torch_transport

TOKEN = "5f0c9e2a71d4b83e6a0f92c4d17b5e38"


def error_of(what: Callable[[], Any]) -> str:
    try:
        what()
    except Exception as e:  # what the test inspects
        return f"{type(e).__module__}.{type(e).__name__}: {e}"
    return "no error"


# -- the torch transport's framing ---------------------------------------------


def _damaging_start(how: str) -> Callable:
    """ProcessGroupTransport.start that sends every message 8 bytes short
    ("truncated") or 8 bytes long ("oversized"), as a damaged transport would."""
    original = _torch_transport.ProcessGroupTransport.start
    kept: List[torch.Tensor] = []

    def start(self: Any, sends: Any, recvs: Any, stream: int) -> Any:
        bad = []
        for p, t in sends:
            t = t[:-8] if how == "truncated" else torch.cat([t, torch.full((8,), 7, dtype=torch.uint8)])
            kept.append(t)
            bad.append((p, t))
        return original(self, bad, recvs, stream)

    return start


def framing(rank: int, world: int) -> Dict[str, Any]:
    """Rank 1's transport sends messages of the wrong size; rank 0 must say
    so (before: decoded stale slot bytes silently, or SIGABRT inside gloo).
    Each case on a gloo group of its own: after the error, the messages rank
    0 had posted are cancelled, rank 1 may time out waiting for them, and
    gloo then closes that group's connections."""
    out: Dict[str, Any] = {}
    x = torch.arange(4096, dtype=torch.float32) * (rank + 1)
    for how in ("good", "truncated", "oversized"):
        group = dist.new_group(backend="gloo")
        comm = gradzip.Communicator.from_torch(group, transport="torch", timeout=2)
        saved = _torch_transport.ProcessGroupTransport.start
        if rank == 1 and how != "good":
            _torch_transport.ProcessGroupTransport.start = _damaging_start(how)
        try:
            y = x.clone()
            out[how] = error_of(lambda: comm.allreduce(y, gradzip.Codec("none"), gradzip.ErrorFeedback(),
                                                       algorithm="allgather"))
        finally:
            _torch_transport.ProcessGroupTransport.start = saved
        comm.close()
    dist.barrier()  # the default group was never touched: still usable
    out["after"] = "ok"
    return out


# -- a stranger on torch's store ------------------------------------------------


def _forger(case: str, host: str, port: int, stop: threading.Event) -> None:
    """The stranger: as soon as rank 0's record appears, it writes rank 1's
    (rank 0's with the codec changed: "invent"; rank 0's as it is: "hide",
    so that rank 0 sees its own settings) and, to hide, rank 0's with rank
    1's warm-up. A sealed record it cannot edit: it replays it to the other
    key, or writes junk."""
    import datetime
    import json

    stranger = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))
    # Keys as torch's default store prefixes them; before and after the sealing.
    at = "default_pg/0//gradzip/hook-agree/0.1"
    keys = [(f"{at}/{i}/{{}}", f"{at}/{i}/agree/{i}/{{}}") for i in range(4)]
    done = set()
    while not stop.is_set():
        for pair in keys:
            for form in pair:
                k0, k1 = form.format(0), form.format(1)
                if k0 in done or not stranger.check([k0]):
                    continue
                value = stranger.get(k0)
                try:
                    record = json.loads(value)
                    edited = lambda name, v: json.dumps([[k, v if k == name else x] for k, x in record])  # noqa
                    theirs = edited("codec", "fp16") if case == "invent" else value
                    mine = edited("warmup_steps", "2")
                except ValueError:  # sealed: not readable, not editable
                    theirs, mine = value, b"forged"
                stranger.set(k1, theirs)
                if case == "hide":
                    stranger.set(k0, mine)
                done.add(k0)
        time.sleep(0.0005)


def stranger_on_the_store(rank: int, world: int) -> Dict[str, Any]:
    """A client of torch's TCPStore that is no member writes the DDP hook's
    agreement records, to invent a mismatch (the ranks' hooks are the same)
    or hide one (warm-up 0 and 2). Every value gradzip puts in the store is
    sealed with the job's token: each attempt is an error naming the key on
    the rank that read it, never an invented or a hidden mismatch. Rank 1's
    hook runs late, so the stranger's records are the ones rank 0 reads."""
    from ddp_workers import Run

    os.environ["GRADZIP_JOB_TOKEN"] = TOKEN
    os.environ["GRADZIP_TIMEOUT_S"] = "2"
    out: Dict[str, Any] = {}
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    for case, mine in (("invent", {"codec": "onebit"}),
                       ("hide", {"codec": "onebit", "warmup_steps": 0 if rank == 0 else 2})):
        stop = threading.Event()
        thread = threading.Thread(target=_forger, args=(case, host, port, stop), daemon=True)
        if rank == 0:
            thread.start()
        dist.barrier()
        t0 = time.monotonic()

        def late_rank_1() -> None:
            run = Run(**mine)  # (DDP's construction is collective)
            if rank == 1:
                time.sleep(1.0)
            run.train(3)

        out[case] = (error_of(late_rank_1), time.monotonic() - t0)
        stop.set()
        if rank == 0:
            thread.join()
        dist.barrier()
    return out


# -- every rank reports the mismatch, even when the others leave at once --------


class _SlowStore:
    """torch's store, read slowly: this rank reads the agreement after the
    others are done with it (and the store's host may have left)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def get(self, key: str) -> bytes:
        if "agree/" in key:  # the agreement's records (not the rest of the rendezvous)
            time.sleep(3.0)
        return self._store.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _slow_reader_on(rank: int) -> None:
    # The DDP hook's agreement and from_torch's communicators (FSDP) read
    # through c10d._get_default_store.
    if rank == 1:
        store = c10d._get_default_store()
        c10d._get_default_store = lambda: _SlowStore(store)


def hook_mismatch_then_leave(rank: int, world: int) -> str:
    """Ranks whose hooks differ; the rank returns (and its process exits,
    rank 0's with torch's store) as soon as it has its error."""
    from ddp_workers import Run

    _slow_reader_on(rank)
    return error_of(lambda: Run(codec="onebit" if rank == 0 else "fp16").train(1))


def fsdp_factor_then_leave(rank: int, world: int) -> str:
    _slow_reader_on(rank)
    return fsdp_factor(rank, world)


def fsdp_factor(rank: int, world: int) -> str:
    """FSDP2 with gradient divide factors 1 and 3 (both PREMUL_SUM): a mismatch
    named on every rank (before: both finished, with different semantics)."""
    from fsdp_workers import backward, sharded
    from gradzip.torch import fsdp as gz_fsdp

    model = sharded()
    gz_fsdp.register(model, codec="onebit")
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():  # each FSDP module reduces its own parameters with its own factor
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0 if rank == 0 else 3.0)
    return error_of(lambda: backward(model, rank, 0))


def fsdp_codec_then_leave(rank: int, world: int) -> str:
    """FSDP2 with different codecs on the ranks (the C++ agreement), leaving at once."""
    from fsdp_workers import backward, sharded
    from gradzip.torch import fsdp as gz_fsdp

    _slow_reader_on(rank)
    model = sharded()
    gz_fsdp.register(model, codec="onebit" if rank == 0 else "fp16")
    return error_of(lambda: backward(model, rank, 0))


# -- BlockMomentum checkpoints ---------------------------------------------------


def _bmuf(rank: int, group: Any = None) -> Any:
    from bmuf_workers import local_optimizer, make_model

    model = make_model(rank)
    opt = BlockMomentum(model, local_optimizer(model), block_steps=2, codec="onebit", process_group=group)
    return model, opt


def _train(opt: Any, model: Any, rank: int, first: int, steps: int) -> None:
    from bmuf_workers import local_step

    for s in range(first, first + steps):
        local_step(model, opt.local_optimizer, rank, s)
        opt.step()


def _tampered(state: Dict[str, Any], edit: Callable[[Dict[str, Any]], None], path: str) -> Dict[str, Any]:
    """The state as a file on disk that someone edited, read back."""
    torch.save(state, path)
    on_disk = torch.load(path, weights_only=True)
    edit(on_disk)
    torch.save(on_disk, path)
    return torch.load(path, weights_only=True)


def _digest(opt: Any) -> str:
    import hashlib

    return hashlib.sha256(opt.state_dict()["global"].numpy().tobytes()).hexdigest()


def bmuf_checkpoints(rank: int, world: int, tmp: str) -> Dict[str, Any]:
    """Each bad restore on rank 1 (or on both, differently): refused on every
    rank with the state left as it was (before: exit 0, with non-finite or
    different weights on the ranks)."""
    out: Dict[str, Any] = {}
    model, opt = _bmuf(rank)
    _train(opt, model, rank, 0, 4)
    # (deep copies: the local optimizer's state_dict holds its live momentum buffers)
    first, model_first = copy.deepcopy(opt.state_dict()), copy.deepcopy(model.state_dict())
    _train(opt, model, rank, 4, 2)
    later = copy.deepcopy(opt.state_dict())
    path = os.path.join(tmp, f"bmuf-{rank}.pt")

    def nan_global(s: Dict[str, Any]) -> None:
        s["global"][3] = float("nan")

    def inf_delta(s: Dict[str, Any]) -> None:
        s["delta"][0] = float("inf")

    def one_element(s: Dict[str, Any]) -> None:
        s["global"] = s["global"][:1].clone()

    def float64(s: Dict[str, Any]) -> None:
        s["delta"] = s["delta"].double()

    for name, edit in (("nan_global", nan_global), ("inf_delta", inf_delta), ("one_element_global", one_element),
                       ("float64_delta", float64)):
        before = _digest(opt)
        state = _tampered(first, edit, path) if rank == 1 else first
        out[name] = error_of(lambda: opt.load_state_dict(state))
        out[name + "/unchanged"] = _digest(opt) == before
    # Different checkpoints on the ranks: both valid, not the same state.
    out["different_steps"] = error_of(lambda: opt.load_state_dict(later if rank == 1 else first))
    # The same checkpoint everywhere restores, and training goes on.
    out["same"] = error_of(lambda: opt.load_state_dict(first))
    model.load_state_dict(model_first)  # this rank's local model, restored beside it
    _train(opt, model, rank, 4, 2)
    out["continues"] = bool(torch.equal(opt.state_dict()["global"], later["global"]))
    # Restored on rank 1 only: both ranks fail within the timeout (on a group
    # of their own: gloo closes a group's connections after a timeout).
    os.environ["GRADZIP_TIMEOUT_S"] = "2"
    model, opt = _bmuf(rank, dist.new_group(backend="gloo"))
    _train(opt, model, rank, 0, 2)
    saved = opt.state_dict()
    t0 = time.monotonic()
    out["one_rank"] = error_of(lambda: opt.load_state_dict(saved) if rank == 1 else _train(opt, model, rank, 2, 2))
    out["one_rank_s"] = time.monotonic() - t0
    del os.environ["GRADZIP_TIMEOUT_S"]
    return out


def suite(rank: int, world: int, tmp: str) -> Dict[str, Any]:
    """The multi-rank cases that keep the default group usable, in one launch."""
    return {"framing": framing(rank, world), "bmuf": bmuf_checkpoints(rank, world, tmp),
            "fsdp_factor": fsdp_factor(rank, world), "stranger": stranger_on_the_store(rank, world)}
