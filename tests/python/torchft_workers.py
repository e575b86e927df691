"""One torchft replica (1 CPU rank) with gradzip's process group, for
test_torchft.py and bench/torchft_recovery.py. The real torchft: a
Manager talking to the lighthouse the caller started, the replica's own
TCPStore, healing over HTTP on loopback.

    python torchft_workers.py faults|paths

Environment: GZ_FT_REPLICA (replica id), GZ_FT_LIGHTHOUSE (its address),
GZ_FT_DIR (a folder for the replicas' files: ready flags, results),
GZ_FT_REPLICAS (how many start together), GZ_FT_TIMEOUT_S (the Manager's
and the group's timeout), GZ_FT_POLICY (GRADZIP_POLICY's form; default
codec=qsgd:bits=4;min_elements=1024), GZ_FT_GROUP ("gradzip", or "gloo":
torchft's own ProcessGroupGloo, the benchmark's baseline).

faults: a training loop of manager.allreduce per gradient (as torchft's
PureDistributedDataParallel, waited) and should_commit. Events, by the
committed step they happen at: GZ_FT_ABORT_AT (replica 0 aborts its
group during its first compressed allreduce; the others enter theirs
1 s late), GZ_FT_KILL_AT (the replica GZ_FT_VICTIM starts its allreduce,
writes <dir>/dying and waits for the caller's SIGKILL). Every replica
stops once it committed at least GZ_FT_END steps and its last two
committed steps had all GZ_FT_REPLICAS replicas in them (a restarted
replica too, after healing). Writes <dir>/result-<replica>[-restarted].json.
GZ_FT_HOST: the replica's address (default 127.0.0.1); GZ_FT_WIDTH: the
model's width (64: 6K weights; 2048: 4.3M).

paths: torchft's DDP, LocalSGD and (Streaming) DiLoCo in turn, on a
synchronous quorum; after each, the replicas' parameters.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import pathlib
import socket
import sys
import threading
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torchft import Manager
from torchft.checkpointing.http_transport import HTTPTransport

from gradzip.integrations.torchft import ProcessGroupGradzip
from gradzip.torch.backend import Policy

REPLICA = int(os.environ["GZ_FT_REPLICA"])
DIR = pathlib.Path(os.environ["GZ_FT_DIR"])
REPLICAS = int(os.environ.get("GZ_FT_REPLICAS", "3"))
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("GZ_FT_TIMEOUT_S", "5")))
RESTARTED = os.environ.get("GZ_FT_RESTARTED") == "1"
HOST = os.environ.get("GZ_FT_HOST", "127.0.0.1")  # this replica's address (its namespace's, under gradzip-run --link)
WIDTH = int(os.environ.get("GZ_FT_WIDTH", "64"))  # the model: WIDTH^2 + 32 WIDTH weights


class LoopbackTransport(HTTPTransport):
    """torchft's checkpoint server, advertised at HOST (its own address names
    the machine, which need not resolve to 127.0.0.1, or to a namespace's)."""

    def address(self) -> str:
        url = super().address()
        return f"http://{HOST}:" + url.split("://", 1)[1].split(":", 1)[1]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(WIDTH, WIDTH)
        self.b = torch.nn.Linear(WIDTH, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def batch(step: int) -> Any:
    g = torch.Generator().manual_seed(1000 * step + REPLICA)
    return torch.randn(16, WIDTH, generator=g), torch.randn(16, 32, generator=g)


def fingerprint(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def make_group() -> Any:
    if os.environ.get("GZ_FT_GROUP", "gradzip") == "gloo":
        from torchft.process_group import ProcessGroupGloo

        return ProcessGroupGloo(timeout=TIMEOUT)
    policy = Policy.parse(os.environ.get("GZ_FT_POLICY", "codec=qsgd:bits=4;min_elements=1024"))
    return ProcessGroupGradzip(policy, timeout=TIMEOUT)


def make_manager(pg: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, async_quorum: bool) -> Manager:
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
    make_manager.store = store  # type: ignore[attr-defined]  # alive as long as the replica

    def load(sd: Dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])

    def save() -> Dict[str, Any]:
        return {"model": model.state_dict(), "opt": opt.state_dict()}

    manager = Manager(pg=pg, load_state_dict=load, state_dict=save, min_replica_size=1,
                      use_async_quorum=async_quorum, timeout=TIMEOUT, quorum_timeout=TIMEOUT * 4,
                      connect_timeout=TIMEOUT, rank=0, world_size=1, store_addr=HOST, store_port=store.port,
                      lighthouse_addr=os.environ["GZ_FT_LIGHTHOUSE"], replica_id=str(REPLICA), hostname=HOST,
                      checkpoint_transport=LoopbackTransport(timeout=TIMEOUT, num_chunks=0))
    if isinstance(pg, ProcessGroupGradzip):
        pg.attach(manager)
    return manager


def wait_for_everyone() -> None:
    """Starts training once every replica's Manager heartbeats, so the first
    quorum holds them all (the lighthouse waits for heartbeating stragglers)."""
    (DIR / f"ready-{REPLICA}").touch()
    deadline = time.monotonic() + 60
    while not all((DIR / f"ready-{r}").exists() for r in range(REPLICAS)):
        if time.monotonic() > deadline:
            raise TimeoutError("the other replicas did not start")
        time.sleep(0.02)


def residuals(pg: Any) -> List[bytes]:
    """This replica's worker residuals, one per state (the group's private
    States: what the test checks survives a quorum change)."""
    if not isinstance(pg, ProcessGroupGradzip):
        return []
    return [bytes(ef.residuals()[0]) for ef in pg._states.states() if ef.bound]


def faults() -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    pg = make_group()
    manager = make_manager(pg, model, opt, async_quorum=True)
    t_ready = time.time()
    if not RESTARTED:
        wait_for_everyone()
    abort_at = int(os.environ.get("GZ_FT_ABORT_AT", "-1"))
    kill_at = int(os.environ.get("GZ_FT_KILL_AT", "-1"))
    victim = int(os.environ.get("GZ_FT_VICTIM", "-1"))
    end = int(os.environ.get("GZ_FT_END", "10"))
    steps: List[Dict[str, Any]] = []
    full = 0  # consecutive committed steps with every replica in them
    aborted = False
    t_start = time.time()
    while True:
        if time.time() - t_start > 90:
            raise RuntimeError(f"replica {REPLICA}: no end in sight after {len(steps)} iterations")
        time.sleep(0.02)  # a step of a real model takes time: the restarted replica catches up meanwhile
        before = residuals(pg)
        quorum_before = getattr(pg, "_quorum_id", None)
        manager.start_quorum()
        manager.wait_quorum()
        rec: Dict[str, Any] = {"step": manager.current_step(), "t0": time.time(),
                               "quorum": getattr(pg, "_quorum_id", None)}
        if rec["quorum"] != quorum_before and before:
            rec["carried"] = residuals(pg) == before  # the survivor's residuals, as they were
        opt.zero_grad()
        x, y = batch(manager.current_step())
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        step = manager.current_step()
        if step == abort_at and not aborted and not RESTARTED:
            aborted = True
            if REPLICA == 0:
                work = manager.allreduce(grads[0])
                time.sleep(0.3)
                t = time.time()
                pg.abort()
                rec["abort_s"] = time.time() - t
                work.wait()
                rec["abort_to_error_s"] = time.time() - t
                rec["pg_errored"] = repr(pg.errored())
            else:
                time.sleep(1.0)
        if step == kill_at and REPLICA == victim and not RESTARTED:
            manager.allreduce(grads[0])  # in flight when the caller's SIGKILL lands
            (DIR / "dying").touch()
            time.sleep(3600)
        works = [manager.allreduce(g) for g in grads]
        for w in works:
            w.wait()
        del works, grads  # (the identity rule: last step's gradients are gone when the next step reduces)
        rec["t1"] = time.time()
        rec["errored"] = None if manager.errored() is None else repr(manager.errored().original_exception)[:300]
        rec["committed"] = manager.should_commit()
        rec["participants"] = manager.num_participants()
        rec["t2"] = time.time()
        if rec["committed"]:
            opt.step()
            full = full + 1 if rec["participants"] == REPLICAS else 0
        steps.append(rec)
        if rec["committed"] and manager.current_step() >= end and full >= 2:
            break
    out = {"replica": REPLICA, "restarted": RESTARTED, "params": fingerprint(model), "steps": steps,
           "final_step": manager.current_step(), "t_ready": t_ready}
    if isinstance(pg, ProcessGroupGradzip):
        out["stats"] = pg.compression_stats()
    name = f"result-{REPLICA}{'-restarted' if RESTARTED else ''}.json"
    (DIR / name).write_text(json.dumps(out))
    manager.shutdown(wait=False)
    pg.shutdown()
    print("DONE", flush=True)


class WaitingGroup(ProcessGroupGradzip):
    """Replica 1 of the stranger case: comes to the agreement of its first
    2-replica quorum once the stranger forged its record there (and 1 s
    later), so that replica 0 reads the forgery first."""

    waited = False

    def _create_pg(self, store: Any, rank: int, world_size: int) -> Any:
        flag = os.environ.get("GZ_FT_WAIT_FOR")
        if flag and world_size == 2 and not self.waited:
            self.waited = True
            (DIR / "waiting").touch()
            deadline = time.monotonic() + 20
            while not pathlib.Path(flag).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(1.0)
        return super()._create_pg(store, rank, world_size)


def paths() -> None:
    """torchft's DDP, LocalSGD and Streaming DiLoCo over gradzip's group, a
    replica with another policy (it leaves after its first step), and a
    stranger on the quorum's store (the test plays it)."""
    from torchft.ddp import DistributedDataParallel
    from torchft.local_sgd import DiLoCo, LocalSGD
    from torchft.optim import OptimizerWrapper

    torch.manual_seed(0)
    model = Net()
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    policy = Policy.parse(os.environ.get("GZ_FT_POLICY", "codec=qsgd:bits=4;min_elements=1024"))
    pg = WaitingGroup(policy, timeout=TIMEOUT)
    manager = make_manager(pg, model, inner, async_quorum=False)
    (DIR / f"store-{REPLICA}").write_text(str(make_manager.store.port))  # type: ignore[attr-defined]
    wait_for_everyone()
    out: Dict[str, Any] = {"replica": REPLICA, "errors": [], "phases": {}}

    def note(phase: str) -> None:
        out["phases"][phase] = {"params": fingerprint(model), "step": manager.current_step(),
                                "compressed_calls": pg.compression_stats()["compressed_calls"]}

    def loss(m: Any, step: int) -> torch.Tensor:
        x, y = batch(step)
        return torch.nn.functional.mse_loss(m(x), y)

    # The first quorums fail (the other policy, the stranger): steps of
    # manager.allreduce per gradient until one commits. (torchft 0.2.0's DDP
    # cannot take a failed quorum: its comm hook expects a managed future and
    # gets the plain one an errored Manager returns; meta-pytorch/torchft#304.)
    tries = 0
    while manager.current_step() < 1:
        tries += 1
        if tries > 20:
            raise RuntimeError(f"no step committed in 20 tries: {out['errors']}")
        manager.start_quorum()
        inner.zero_grad()
        loss(model, manager.current_step()).backward()
        works = [manager.allreduce(p.grad) for p in model.parameters()]
        for w in works:
            w.wait()
        del works
        if manager.errored() is not None:
            out["errors"].append(repr(manager.errored().original_exception))
        if manager.should_commit():
            inner.step()
        elif os.environ.get("GZ_FT_LEAVE_AFTER_FAILURE") == "1":
            (DIR / f"result-{REPLICA}.json").write_text(json.dumps(out))
            manager.shutdown(wait=False)
            pg.shutdown()
            print("LEFT", flush=True)
            return
    note("settled")
    # torchft's DDP: its comm hook calls manager.allreduce per bucket.
    ddp = DistributedDataParallel(manager, model)
    opt = OptimizerWrapper(manager, inner)
    for i in range(2):
        opt.zero_grad()
        loss(ddp, manager.current_step()).backward()
        opt.step()
    note("ddp")
    # LocalSGD: parameters averaged every 2 local steps.
    with LocalSGD(manager, model, inner, sync_every=2):
        for i in range(4):
            inner.zero_grad()
            loss(model, 100 + i).backward()
            inner.step()
    note("local_sgd")
    # Streaming DiLoCo (torchft's DiLoCo with two fragments): each fragment's
    # delta since its last sync exchanged in turn (one per inner step here),
    # outer Nesterov per fragment; the fragment synced last is the same on
    # every replica.
    outer = [torch.optim.SGD(f.parameters(), lr=0.7, momentum=0.9, nesterov=True) for f in (model.a, model.b)]
    with DiLoCo(manager, [model.a, model.b], inner, outer, sync_every=2):
        for i in range(4):
            inner.zero_grad()
            loss(model, 300 + i).backward()
            inner.step()
    note("diloco")
    last = (model.a, model.b)[(manager.current_step() - 1) % 2]
    out["phases"]["diloco"]["params"] = fingerprint(last)
    out["stats"] = pg.compression_stats()
    (DIR / f"result-{REPLICA}.json").write_text(json.dumps(out))
    manager.shutdown(wait=False)
    pg.shutdown()
    print("DONE", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"replica {REPLICA}: %(name)s: %(message)s")
    {"faults": faults, "paths": paths}[sys.argv[1]]()
