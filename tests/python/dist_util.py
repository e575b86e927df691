"""Run a function on N local ranks (gloo over loopback), with a hard time limit.

Each rank is a fresh process with torch.distributed initialised; the
function's return values come back to the test, its exceptions come back as a
failure naming the rank. A rank that hangs or dies fails the test within the
timeout and every rank is killed: a test never hangs CI.

Ranks are forked from a forkserver that imported torch, torch._dynamo and
gradzip once (rank_context): a spawned rank spent about 3 s of CPU importing
them, and the suite starts hundreds. Each rank still starts from a process
that has run nothing but imports, and gets the test's environment as it is
at run_ranks (a forkserver child would otherwise inherit the server's, from
when it started).
"""

from __future__ import annotations

import datetime
import gc
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from typing import Any, Callable, List, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_context() -> Any:
    """The multiprocessing context ranks start from: a forkserver with torch,
    its distributed package, torch._dynamo (DDP's constructor imports it, with
    sympy: about 1 s of CPU) and gradzip imported. Pass os.environ to the rank
    and restore it there (_entry does): gradzip reads its settings from the
    environment when used, not at import. A module that fails to import is
    skipped (multiprocessing's rule): the ranks then import it themselves."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "torch", "torch.distributed", "torch.nn", "torch._dynamo", "gradzip.torch"])
    return ctx


def _entry(fn: Callable, rank: int, world_size: int, port: int, results: Any, args: tuple,
           environ: Any = None, backend: str = "gloo", env: Optional[dict] = None) -> None:
    # What the forkserver imported is never garbage: kept out of this rank's
    # collections (gc.collect below, the hook's walk of the heap for the
    # optimizer), which otherwise scan its million objects each time. A
    # splice of lists, so no page of the inherited heap is touched.
    gc.freeze()
    if environ is not None:  # the test's environment, not the forkserver's
        os.environ.clear()
        os.environ.update(environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), **(env or {}))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:  # reported to the test, which fails
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            gc.collect()  # DDP objects left in cycles hold the group; gloo's threads must stop before exit
            dist.destroy_process_group()


def run_ranks(fn: Callable, world_size: int, *args: Any, timeout: float = 180.0, backend: str = "gloo",
              env: Optional[dict] = None) -> List[Any]:
    """Runs fn(rank, world_size, *args) on world_size processes, in a group of
    `backend` with `env` added to their environment; returns the values by
    rank. fn must be importable (defined at module level)."""
    ctx = rank_context()
    results = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [ctx.Process(target=_entry, args=(fn, r, world_size, port, results, args, environ, backend, env or {}),
                         daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    values: dict = {}
    errors: List[str] = []
    try:
        while len(values) + len(errors) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                if errors:  # the others are stuck waiting for the rank that failed
                    break
                raise TimeoutError(f"{fn.__name__} on {world_size} ranks: no result within {timeout:.0f} s "
                                   f"from ranks {sorted(set(range(world_size)) - set(values))}")
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in values]
                if dead and len(values) + len(errors) < world_size:
                    # Give a crashed rank's peers a moment to report, then stop.
                    time.sleep(0.5)
                    if results.empty():
                        raise RuntimeError(f"{fn.__name__}: ranks {dead} died (exit codes "
                                           f"{[procs[r].exitcode for r in dead]}) without a result")
                continue
            if ok:
                values[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
                deadline = min(deadline, time.monotonic() + 5.0)
        if errors:
            raise RuntimeError(f"{fn.__name__} failed on {len(errors)} rank(s):\n" + "\n".join(errors))
        return [values[r] for r in range(world_size)]
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)


# torch's own teardown race (pytorch/pytorch#190489): a gloo worker thread that
# still holds a Work captured during backward takes the GIL after Py_Finalize
# began and aborts with this line, after the script has finished. The examples
# narrow the window (they free DDP and collect before destroying the group); a
# run that ends this way, with every rank's result printed, is run again.
TORCH_EXIT_RACE = "terminate called without an active exception"


def torchrun(script: Any, *args: str, ranks: int = 2, finished: Callable[[str], bool] = lambda out: True,
             cwd: Any = None, timeout: float = 240.0, python: Any = None,
             env: "dict[str, str] | None" = None) -> "subprocess.CompletedProcess[str]":
    """Runs `script` under torchrun on `ranks` local ranks (retrying torch's
    exit race only when `finished(stdout)` says every rank got through), with
    `python` (default: this interpreter) in `env` (default: this one's)."""
    import os
    import subprocess
    import sys

    for _ in range(3):
        run_env = dict(os.environ if env is None else env, OMP_NUM_THREADS="1")
        r = subprocess.run([str(python or sys.executable), "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={ranks}",
                            "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(script), *args],
                           capture_output=True, text=True, timeout=timeout, env=run_env, cwd=cwd)
        if r.returncode == 0 or not (finished(r.stdout) and TORCH_EXIT_RACE in r.stderr):
            return r
    return r

