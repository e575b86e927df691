"""The hook's compressed path, the same for both transports: each bucket's
segments go through gradzip's compressed allreduce (a
:class:`gradzip.Communicator`, whichever transport carries its bytes), on
one worker thread per hook state.

Ordering: the hook submits the buckets to the worker in DDP's bucket order,
so every rank runs its collectives in the same order; the hook returns at
once (the exchange overlaps the rest of the backward pass), and nothing is
ever started from a future's callback (torch's PowerSGD hook, which does,
hangs on gloo: docs/ARCHITECTURE.md). The hook call of the last bucket waits
for the step's exchanges (DDP would wait for them next anyway), so a failure
is raised there, with its gradzip type. One communicator per hook state, so
two models' hooks never interleave on one transport.
"""

import concurrent.futures
import contextlib
import threading
from typing import Any, List

import torch

from . import _filters, _layout


class Worker:
    """One thread running submitted jobs in submission order."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradzip-hook")
        self.lock = threading.Lock()  # guards the state's byte counts
        self._streams: dict = {}
        self._step_jobs: List[concurrent.futures.Future] = []

    def stream(self, device: torch.device) -> "torch.cuda.Stream":
        """The worker's CUDA stream on `device` (used from the worker thread only)."""
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = torch.cuda.Stream(device)
        return s

    def submit(self, job: Any) -> None:
        self._step_jobs.append(self._pool.submit(job))

    def finish_step(self) -> None:
        """Waits for this step's jobs; re-raises the first failure with its
        own type (a gradzip.IoError stays one)."""
        jobs, self._step_jobs = self._step_jobs, []
        for j in jobs:
            j.result()


def exchange(state: Any, plan: _layout.Plan, buffer: torch.Tensor, last: bool,
             scale: Any = None) -> torch.futures.Future:
    """Queues the bucket's allreduce (average) on the state's worker; returns
    DDP's future. `scale`: the preconditioner d (_precondition.py): the
    bucket is divided by it before it is encoded, the average multiplied."""
    if scale is not None:
        buffer.div_(scale)
    inputs = plan.inputs(buffer)
    cuda = buffer.is_cuda
    fut: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if cuda else None)
    ready = None
    if cuda:  # the worker's stream waits for the gradients computed so far
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(buffer.device))
    comm, codec, algorithm, worker = state._comm, state.codec, state.algorithm, state._worker
    server_codec = state.server_codec
    parts: List[Any] = list(plan.parts)
    splits = [state._split(seg) for seg, _ in parts]

    def job() -> None:
        try:
            if cuda:
                stream = worker.stream(buffer.device)
                stream.wait_event(ready)
                ctx: Any = torch.cuda.stream(stream)
            else:
                ctx = contextlib.nullcontext()
            with ctx:
                sent = exact = 0.0
                ran = None
                for (seg, _), x, split in zip(parts, inputs, splits):
                    if split is None:
                        stats = comm.allreduce(x, codec, seg.ef, op="avg", algorithm=algorithm,
                                               server_codec=server_codec)
                        sent += stats["wire_bytes"]  # every byte sent, node-local included
                        ran = stats["algorithm"]
                    else:  # layer filters: the exact parameters apart (_filters.py)
                        both, alone = _filters.allreduce(comm, codec, seg, split, x, algorithm, server_codec)
                        sent += both
                        exact += alone
                plan.scatter(inputs, buffer)
                if scale is not None:
                    buffer.mul_(scale)
                with worker.lock:
                    state._count(buffer.numel() * buffer.element_size(),
                                 _payload_bytes(codec, parts, splits, buffer.element_size()), sent)
                    state._stats["exact_wire_bytes"] += exact
                    if ran is not None:
                        state._ran = ran
                fut.set_result(buffer)
        except BaseException as e:  # the future carries it to DDP, and finish_step to the last hook call
            fut.set_exception(e)
            raise

    worker.submit(job)
    if last:
        # DDP waits for every bucket right after the last one is handed in, so
        # waiting here costs no overlap; and an error raised here, in the
        # hook, reaches backward() with its gradzip type (through the future
        # DDP would turn it into a RuntimeError).
        worker.finish_step()
    # DDP reads the value of the future it gets in C++ as a tensor: a future
    # holding an exception object (set_exception) would surface as "Unable to
    # cast ... to Tensor". Waiting on it inside then() raises the exception
    # there, which torch stores as the chained future's error, and DDP's
    # backward re-raises it with its gradzip type.
    return fut.then(lambda f: f.wait())


def _payload_bytes(codec: Any, parts: List[Any], splits: List[Any], element_size: int) -> int:
    total = 0
    for (seg, _), split in zip(parts, splits):
        if split is None:
            total += codec.max_payload_bytes(seg.n)
        else:
            total += split.n_exact * element_size
            total += codec.max_payload_bytes(split.n_compressed) if split.n_compressed else 0
    return total
