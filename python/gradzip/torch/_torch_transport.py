"""transport="torch" for the DDP hook, BlockMomentum and FSDP2: gradzip's
allreduce algorithms over torch's own process group (gloo on CPU, NCCL on GPU).

The algorithms are the C++ ones every entry point runs (comm/allreduce*);
they move bytes through a Transport. :class:`ProcessGroupTransport` is that
Transport over a process group: the C++ side (python/src/py_transport.h)
calls its start/test/wait/abort, taking the GIL for each call only, and the
algorithms run with the GIL released (on the hook's worker thread, or
BlockMomentum's with overlap), so the training thread keeps running.

The contract the algorithms need (comm/transport.h): between two ranks,
messages match in posting order. torch's point-to-point calls give that on
gloo (per pair and tag) and NCCL (per pair, in issue order), so every
exchange is a batch of isend/irecv of the slots the algorithms hand in.
Messages carry this communicator's own tag, so another user of the group's
point-to-point calls (or a second hook) never takes its messages on gloo;
on NCCL, which ignores tags, the hook's single worker thread and its
wait at each step's last bucket keep its calls apart from DDP's.
BlockMomentum with overlap keeps an exchange in flight for a whole block:
on gloo the training thread may run its own collectives on the group
meanwhile (they do not use these tags); on NCCL it must not, or give
BlockMomentum a group of its own (docs/python.md).
"""

import datetime
import time
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

# The tags of the hook's communicators: gloo matches point-to-point messages
# by (peer, tag), so each communicator keeps to its own.
_TAG_BASE = 0x475A0000  # "GZ"


class ProcessGroupTransport:
    """Exchanges of byte tensors over a torch process group, in the shape the
    C++ PyTransport drives (python/src/py_transport.h)."""

    def __init__(self, group: Optional[dist.ProcessGroup], tag: int) -> None:
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self.tag = _TAG_BASE + tag
        backend = str(dist.get_backend(self.group))
        self.name = f"torch-{backend}"
        # NCCL takes CUDA buffers in place; a gloo group takes host memory (the
        # algorithms stage CUDA gradients through pinned slots for it).
        self.device_memory = "nccl" in backend and torch.cuda.is_available()
        self.cuda_device = torch.cuda.current_device() if self.device_memory else -1
        backend_of = getattr(self.group, "_get_backend", None)
        # A backend that coalesces (NCCL) must see an exchange as one group of
        # calls, or its blocking point-to-point calls can deadlock each other.
        self._coalesce = self.device_memory and backend_of is not None and getattr(
            backend_of(torch.device("cuda", self.cuda_device)), "supports_coalescing", False)

    def start(self, sends: Sequence[Tuple[int, torch.Tensor]], recvs: Sequence[Tuple[int, torch.Tensor]],
              stream: int) -> List[Any]:
        with _on_stream(stream, self.cuda_device):
            if self._coalesce:
                ops = [dist.P2POp(dist.isend, t, group=self.group, group_peer=p, tag=self.tag) for p, t in sends]
                ops += [dist.P2POp(dist.irecv, t, group=self.group, group_peer=p, tag=self.tag) for p, t in recvs]
                return dist.batch_isend_irecv(ops) if ops else []
            # gloo: each call posts at once and its I/O thread moves the bytes.
            group, tag = self.group, self.tag
            works = [group.send([t], p, tag) for p, t in sends]
            works += [group.recv([t], p, tag) for p, t in recvs]
            return works

    def test(self, works: List[Any]) -> bool:
        # gloo reports completion only through wait(): False until then,
        # which costs nothing (its I/O thread progresses on its own).
        return all(w.is_completed() for w in works)

    def wait(self, works: List[Any], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        for w in works:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: an exchange did not complete within the timeout")
            # Releases the GIL while it blocks; on NCCL it only orders the
            # current stream (the C++ side passes the call's stream) after it.
            if not w.wait(datetime.timedelta(seconds=left)):
                raise RuntimeError(f"{self.name}: an exchange was aborted")

    def abort(self, handles: List[List[Any]], why: str) -> None:
        # Dropping the works cancels their receives: gloo holds a receive's
        # buffer weakly and its destructor waits for a write in progress, so
        # nothing is written after this returns. NCCL cannot cancel one
        # operation; abort its communicators (peers fail at their timeout).
        handles.clear()
        if self.device_memory and hasattr(self.group, "abort"):
            self.group.abort()

    def synchronize(self, stream: int, seconds: float) -> None:
        s = torch.cuda.ExternalStream(stream, device=self.cuda_device)
        deadline = time.monotonic() + seconds
        while not s.query():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: the exchange's stream did not finish within {seconds:g} s")
            time.sleep(0.0002)


class _on_stream:
    """Makes the CUDA stream `handle` current (device buffers); nothing for host ones."""

    __slots__ = ("_ctx",)

    def __init__(self, handle: int, device: int) -> None:
        self._ctx = torch.cuda.stream(torch.cuda.ExternalStream(handle, device=device)) if handle else None

    def __enter__(self) -> None:
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def connect(process_group: Optional[dist.ProcessGroup], communicator: Any, timeout: Optional[float]) -> Any:
    """A communicator over `process_group` itself."""
    import gradzip

    if communicator is not None:
        raise ValueError("a communicator is given only with transport='gradzip'")
    if not gradzip.BUILD["comm"]:
        raise ValueError("this gradzip build has no communicator (comm/), which gradzip's compressed collectives "
                         "run in")
    return gradzip.Communicator.from_torch(process_group, transport="torch", timeout=timeout)
