"""transport="torch" for the DDP hook, BlockMomentum and FSDP2: gradzip's
allreduce algorithms over torch's own process group (gloo on CPU, NCCL on GPU).

The algorithms are the C++ ones every entry point runs (comm/allreduce*);
they move bytes through a Transport. :class:`ProcessGroupTransport` is that
Transport over a process group: the C++ side (python/src/py_transport.h)
calls its start/test/wait/abort, taking the GIL for each call only, and the
algorithms run with the GIL released (on the hook's worker thread, or
BlockMomentum's with overlap), so the training thread keeps running.

The contract the algorithms need (comm/transports/transport.h): between two ranks,
messages match in posting order. torch's point-to-point calls give that on
gloo (per pair and tag) and NCCL (per pair, in issue order), so every
exchange is a batch of isend/irecv of the slots the algorithms hand in.
Messages carry this communicator's own tag, so another user of the group's
point-to-point calls (or a second hook) never takes its messages on gloo;
on NCCL, which ignores tags, the hook's single worker thread and its
wait at each step's last bucket keep its calls apart from DDP's.
Framing (gloo): torch reports no received size, and gloo aborts the process
when a message is larger than the receive posted for it, and silently leaves
the rest of a larger receive as it was when a message is shorter. So each
message travels as two: a 16-byte header (magic, the message's number on
this pair, its length) under the communicator's tag, then the bytes under a
tag of their own. A receive posts only the header; once it arrives and the
length is exactly the receive's size (the algorithms send exactly what
the receive posts: the codec's size for the segment, comm/transports/transport.h), the body is posted, in header order per peer. gloo moves
a message's bytes only once its receive is posted, and reports a header's
arrival only to a wait() on it, so one thread per transport (the poster)
waits for the headers in the order they were posted and posts each body at
once: the bodies move while the caller encodes the next segment, as the
unframed bytes did (waiting for the headers in the caller's wait() cost
1.5-3x on 2 loopback ranks: BENCHMARKS section 6). Any other
length, a damaged header or one out of order is an IoError naming the peer,
and nothing is written into the slot. (NCCL, which takes device buffers
in place, moves them as they are: its own checks apply.)

BlockMomentum with overlap keeps an exchange in flight for a whole block:
on gloo the training thread may run its own collectives on the group
meanwhile (they do not use these tags); on NCCL it must not, or give
BlockMomentum a group of its own (docs/python.md).
"""

import atexit
import collections
import datetime
import os
import struct
import threading
import time
import weakref
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

# The tags of the hook's communicators: gloo matches point-to-point messages
# by (peer, tag), so each communicator keeps to its own.
_TAG_BASE = 0x475A0000  # "GZ"
_BODY_TAG_BASE = 0x475B0000  # the bodies of framed messages (gloo), one tag per communicator too

# A framed message's header: u32 magic "GZF1", u32 its number on this
# (sender, receiver) pair, u64 the body's length; little-endian.
_FRAME = struct.Struct("<IIQ")
_FRAME_MAGIC = 0x31465A47
# A message of the wrong size is still received (into scratch, then
# dropped) up to twice its receive's size or this, so the pair stays usable.
_DRAIN_BYTES = 64 << 20


class ProcessGroupTransport:
    """Exchanges of byte tensors over a torch process group, in the shape the
    C++ PyTransport drives (python/src/py_transport.h)."""

    def __init__(self, group: Optional[dist.ProcessGroup], tag: int, *, rank: Optional[int] = None,
                 size: Optional[int] = None, backend: Optional[str] = None) -> None:
        # rank, size, backend: for a group torch's registry does not hold
        # (torchft's, reconfigured at every quorum); else looked up there.
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group) if rank is None else rank
        self.size = dist.get_world_size(self.group) if size is None else size
        self.tag = _TAG_BASE + tag
        backend = str(dist.get_backend(self.group) if backend is None else backend)
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
        # Framing (host buffers): the next message number per peer each way,
        # and per peer the receives whose header is posted and body is not.
        self._framed = not self.device_memory
        self.body_tag = _BODY_TAG_BASE + tag
        self._sent: Dict[int, int] = collections.defaultdict(int)
        self._received: Dict[int, int] = collections.defaultdict(int)
        self._waiting: Dict[int, Deque["_FramedRecv"]] = collections.defaultdict(collections.deque)
        self._drains: List[Tuple[torch.Tensor, Any]] = []  # wrong-size bodies being received, kept alive
        # The poster: its queue (every framed receive, in posting order), the
        # condition the callers' waits sleep on, the first error it met (every
        # receive not yet posted fails with it), and how long it waits for one
        # header (the longest timeout a wait() was given; a gloo wait that
        # times out breaks every pair of the group, so never shorter).
        self._cv = threading.Condition()
        self._posting: Deque["_FramedRecv"] = collections.deque()
        self._poster: Optional[threading.Thread] = None
        self._poster_error: Optional[BaseException] = None
        self._header_timeout = float(os.environ.get("GRADZIP_TIMEOUT_S", "60") or 60)
        self._closed = False
        _live.add(self)

    def start(self, sends: Sequence[Tuple[int, torch.Tensor]], recvs: Sequence[Tuple[int, torch.Tensor]],
              stream: int) -> List[Any]:
        with _on_stream(stream, self.cuda_device):
            if self._coalesce:
                ops = [dist.P2POp(dist.isend, t, group=self.group, group_peer=p, tag=self.tag) for p, t in sends]
                ops += [dist.P2POp(dist.irecv, t, group=self.group, group_peer=p, tag=self.tag) for p, t in recvs]
                return dist.batch_isend_irecv(ops) if ops else []
            if not self._framed:
                group, tag = self.group, self.tag
                works = [group.send([t], p, tag) for p, t in sends]
                works += [group.recv([t], p, tag) for p, t in recvs]
                return works
            # gloo: each call posts at once and its I/O thread moves the bytes.
            return self._start_framed(sends, recvs)

    def _start_framed(self, sends: Sequence[Tuple[int, torch.Tensor]],
                      recvs: Sequence[Tuple[int, torch.Tensor]]) -> "_FramedExchange":
        group = self.group
        x = _FramedExchange()
        for p, t in sends:
            header = torch.tensor(list(_FRAME.pack(_FRAME_MAGIC, self._sent[p], t.numel())), dtype=torch.uint8)
            self._sent[p] = (self._sent[p] + 1) & 0xFFFFFFFF
            x.keep.append(header)
            x.works.append(group.send([header], p, self.tag))
            if t.numel():
                x.works.append(group.send([t], p, self.body_tag))
        with self._cv:
            for p, t in recvs:
                header = torch.empty(_FRAME.size, dtype=torch.uint8)
                r = _FramedRecv(p, t, header, group.recv([header], p, self.tag))
                self._waiting[p].append(r)
                self._posting.append(r)
                x.recvs.append(r)
            if x.recvs:
                if self._poster is None:
                    self._poster = threading.Thread(target=self._post_loop, name=f"gradzip-{self.name}-poster",
                                                    daemon=True)
                    self._poster.start()
                self._cv.notify_all()
        return x

    def _post_loop(self) -> None:
        """The poster thread: waits for each framed receive's header in posting
        order (the GIL released) and posts the bodies whose headers arrived."""
        while True:
            with self._cv:
                while not self._posting and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                r = self._posting[0]
            error: Optional[BaseException] = None
            try:
                if not r.posted and not r.header_work.wait(datetime.timedelta(seconds=self._header_timeout)):
                    error = RuntimeError(f"{self.name}: an exchange was aborted")
            except Exception as e:  # a timeout or a broken pair: every receive behind it fails too
                error = e
            with self._cv:
                if self._posting and self._posting[0] is r:
                    self._posting.popleft()
                if error is None and not r.posted:
                    try:
                        self._post_bodies(r.peer)
                    except Exception as e:
                        error = e
                if error is not None and self._poster_error is None:
                    self._poster_error = error
                self._cv.notify_all()

    def _post_bodies(self, peer: int) -> None:
        """Posts, in order, the bodies of `peer`'s receives whose header arrived
        (the poster waited for it); IoError for a bad header. Under self._cv."""
        queue = self._waiting[peer]
        while queue:
            r = queue[0]
            if not r.header_work.is_completed():
                return
            magic, number, length = _FRAME.unpack(r.header.numpy().tobytes())
            expected = self._received[peer]
            if magic != _FRAME_MAGIC or number != expected:
                raise _FramingError(f"rank {self.rank}: {self.name}: the message from rank {peer} is not a gradzip "
                                    f"frame (message {number} of magic {magic:#x}, expected message {expected}): "
                                    f"ranks of another gradzip version, or a damaged transport")
            if length != r.slot.numel():
                if length <= max(2 * r.slot.numel(), _DRAIN_BYTES):
                    # Take the body anyway, into scratch that is kept: a send
                    # gloo never matches would close the pair at its timeout,
                    # and the whole process group with it.
                    scratch = torch.empty(length, dtype=torch.uint8)
                    self._drains.append((scratch, self.group.recv([scratch], peer, self.body_tag)))
                raise _FramingError(
                    f"rank {self.rank}: {self.name}: rank {peer} sent {length} bytes where this rank receives "
                    f"{r.slot.numel()} (message {number}); the slot was left as it was: the ranks run different "
                    f"gradzip versions or settings, or a rank's transport is damaged")
            self._received[peer] = (expected + 1) & 0xFFFFFFFF
            queue.popleft()
            r.body_work = self.group.recv([r.slot], peer, self.body_tag) if length else None
            r.posted = True

    def test(self, works: Any) -> bool:
        # gloo reports completion only through wait(): False until then,
        # which costs nothing (its I/O thread progresses on its own).
        if isinstance(works, _FramedExchange):
            with self._cv:
                if not all(r.posted for r in works.recvs):
                    return False
            return all(w.is_completed() for w in works.all_works())
        return all(w.is_completed() for w in works)

    def wait(self, works: Any, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        if isinstance(works, _FramedExchange):
            with self._cv:
                self._header_timeout = max(self._header_timeout, seconds)
                for r in works.recvs:
                    while not r.posted:
                        if self._poster_error is not None:
                            raise _fresh(self._poster_error)
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise TimeoutError(f"{self.name}: an exchange did not complete within the timeout")
                        self._cv.wait(left)
            works = works.all_works()
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
        with self._cv:
            self._waiting.clear()
            self._posting.clear()
        if self.device_memory and hasattr(self.group, "abort"):
            self.group.abort()

    def close(self) -> None:
        """Stops the poster thread and waits for it: at most the header wait
        it is in (bounded by the timeout). At interpreter exit (_close_all),
        so that no thread is inside a gloo wait when Python finalizes: a
        daemon thread that comes back from one then is stopped while it
        retakes the GIL inside C++ (pybind11's GIL release guard, noexcept),
        and the process ends in std::terminate (SIGABRT) after the script's
        own error."""
        with self._cv:
            self._closed = True
            self._posting.clear()
            self._cv.notify_all()
            poster = self._poster
        if poster is not None and poster is not threading.current_thread():
            poster.join(self._header_timeout + 5)

    def synchronize(self, stream: int, seconds: float) -> None:
        s = torch.cuda.ExternalStream(stream, device=self.cuda_device)
        deadline = time.monotonic() + seconds
        while not s.query():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: the exchange's stream did not finish within {seconds:g} s")
            time.sleep(0.0002)


def _fresh(error: BaseException) -> BaseException:
    """A new exception of `error`'s type and message, caused by it, to raise
    in the caller's thread. Raising the stored one itself would add the
    caller's frame to its traceback for good, and that frame's f_back chain
    (the engine's thread: the communicator, the codec and the error
    feedback of the call) would live as long as the transport keeps the
    error: through the C++ communicator that holds the transport, to exit
    (nanobind then reports them leaked)."""
    try:
        fresh = type(error)(str(error))
    except Exception:  # a type that takes other arguments
        fresh = RuntimeError(str(error))
    fresh.__cause__ = error
    return fresh


# Every transport of this process that may have a poster thread (see close).
_live: "weakref.WeakSet[ProcessGroupTransport]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for transport in list(_live):
        transport.close()


class _FramingError(RuntimeError):
    """A framed message that is not what its receive expects (the C++ side makes it an IoError)."""


class _FramedRecv:
    """A receive of the framed protocol: its header's work, then its body's
    (posted: the header was checked and the body, if any, posted)."""

    __slots__ = ("peer", "slot", "header", "header_work", "body_work", "posted")

    def __init__(self, peer: int, slot: torch.Tensor, header: torch.Tensor, header_work: Any) -> None:
        self.peer, self.slot, self.header, self.header_work = peer, slot, header, header_work
        self.body_work: Any = None
        self.posted = False


class _FramedExchange:
    """What start() returns on the framed path: the send works, the receives."""

    __slots__ = ("works", "recvs", "keep")

    def __init__(self) -> None:
        self.works: List[Any] = []
        self.recvs: List[_FramedRecv] = []
        self.keep: List[torch.Tensor] = []  # header bytes being sent

    def all_works(self) -> List[Any]:
        return self.works + [r.body_work for r in self.recvs if r.body_work is not None]


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
