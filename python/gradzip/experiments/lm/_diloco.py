"""The LM experiment's DiLoCo methods: torchft's own DiLoCo (inner AdamW,
H local steps, then the model's delta averaged and an outer SGD step with
Nesterov momentum), its exchange through gradzip's torchft process group
(gradzip.integrations.torchft) or, for ``fp32@diloco``, torchft's own gloo
group (uncompressed DiLoCo: the baseline). Each rank is a torchft replica
of one rank with a Manager of its own; rank 0 runs the lighthouse.

    <spec>@diloco[:h=H,outer=LR,mom=M,min=N]

h: local steps per sync (default 50; must divide the run's steps, so that
the final model is the synced one); outer, mom: the outer SGD's learning
rate and Nesterov momentum (DiLoCo's 0.7 and 0.9; mom=0 is plain SGD on
the averaged delta, no Nesterov); min: the policy's
min_elements (default 0: every tensor of the delta compressed, so the wire
bytes are the group's own count). The inner AdamW's learning rate is the
run's (--lr, tuned by --tune like every method's).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import sys
from typing import Any

FAMILY = "diloco"


def setup(method: str, net: Any, settings: Any) -> Any:
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Manager logs every quorum at info
    import torch
    import torch.distributed as dist
    from torchft import Manager
    from torchft.local_sgd import DiLoCo
    from torchft.process_group import ProcessGroupGloo

    from gradzip.integrations.torchft import ProcessGroupGradzip
    from gradzip.torch.backend import Policy

    from ._core import Method, _adamw, _options

    spec, opts = _options(method, FAMILY)
    unknown = set(opts) - {"h", "outer", "mom", "min"}
    if unknown:
        raise ValueError(f"method {method!r}: unknown DiLoCo option(s) {sorted(unknown)} (h, outer, mom, min)")
    h = int(opts.get("h", 50))
    if h < 1 or settings.steps % h:
        raise ValueError(f"method {method!r}: h={h} must divide the run's {settings.steps} steps")
    rank, replicas = dist.get_rank(), dist.get_world_size()
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    timeout = datetime.timedelta(seconds=float(os.environ.get("GRADZIP_TIMEOUT_S", "60") or 60))

    lighthouse = None
    port = [0]
    if rank == 0:
        lighthouse, port[0] = _start_lighthouse(replicas, host)
    dist.broadcast_object_list(port, src=0)
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    if spec in ("fp32", "none"):
        pg: Any = ProcessGroupGloo(timeout=timeout)
    else:
        pg = ProcessGroupGradzip(Policy(spec, min_elements=int(opts.get("min", 0))), timeout=timeout)
    inner = _adamw(net.parameters(), settings)

    def load(sd: Any) -> None:
        net.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])

    manager = Manager(pg=pg, load_state_dict=load, state_dict=lambda: {"model": net.state_dict(),
                                                                       "inner": inner.state_dict()},
                      min_replica_size=replicas, use_async_quorum=False, init_sync=False, timeout=timeout,
                      quorum_timeout=timeout * 2, connect_timeout=timeout, rank=0, world_size=1, store_addr=host,
                      store_port=store.port, lighthouse_addr=f"http://{host}:{port[0]}", replica_id=str(rank),
                      hostname=host)
    if isinstance(pg, ProcessGroupGradzip):
        pg.attach(manager)
    momentum = float(opts.get("mom", 0.9))
    # mom=0 is plain averaging (torch refuses Nesterov without a momentum).
    outer = torch.optim.SGD(net.parameters(), lr=float(opts.get("outer", 0.7)), momentum=momentum,
                            nesterov=momentum > 0)
    diloco = DiLoCo(manager, [net], inner, outer, sync_every=h)
    diloco.__enter__()
    dense = 4.0 * sum(q.numel() for q in net.parameters())
    ring = 2.0 * (replicas - 1) / replicas

    def wire(steps: int) -> float:
        if isinstance(pg, ProcessGroupGradzip):
            return float(pg.compression_stats()["wire_bytes"])
        return ring * dense * manager.current_step()  # torchft's gloo: one fp32 ring allreduce per sync

    m = Method(net, inner, wire)

    def finish() -> None:
        m.extra.update({"h": h, "syncs": manager.current_step(), "outer_lr": outer.param_groups[0]["lr"],
                        "outer_momentum": outer.param_groups[0]["momentum"], "store": store.port})
        if isinstance(pg, ProcessGroupGradzip):
            s = pg.compression_stats()
            m.extra.update({"group_wire_ratio": s["wire_ratio"], "quorums": s["quorums"]})
        wire_now = wire(settings.steps)
        m.wire_bytes = lambda steps: wire_now  # the group is closed below
        diloco.__exit__(None, None, None)
        dist.barrier()  # every replica's last sync is done before any manager goes
        manager.shutdown(wait=False)
        pg.shutdown()
        dist.barrier()
        if lighthouse is not None:
            with contextlib.suppress(Exception):
                lighthouse.kill()
                lighthouse.wait(10)

    m.finish = finish
    return m


def _start_lighthouse(replicas: int, host: str) -> Any:
    """torchft's lighthouse (the program its wheel installs) for `replicas`
    replicas on a free port of `host`; killed with this process (its
    parent-death signal) if the run does not end it."""
    import ctypes
    import signal
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    exe = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-c", "import sys; from torchft._torchft import "
                                             "lighthouse_main; sys.exit(lighthouse_main())"]
    libc = ctypes.CDLL(None, use_errno=True)

    def die_with_parent() -> None:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    proc = subprocess.Popen(cmd + ["--min_replicas", str(replicas), "--quorum_tick_ms", "20", "--join_timeout_ms",
                                   "60000", "--bind", f"{host}:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
    return proc, port
