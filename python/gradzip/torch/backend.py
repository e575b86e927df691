"""gradzip as a torch.distributed backend: ``init_process_group("cpu:gradzip")``.

Every collective of the group is torch's own (gloo for CPU tensors, NCCL for
CUDA ones), except ``all_reduce`` with SUM or AVG of a floating tensor that
the group's :class:`Policy` compresses: that one runs gradzip's compressed
allreduce (the engine of the DDP hook and :class:`gradzip.Communicator`:
pipelined encode, exchange and decode with error feedback; every rank ends
with the same bits), over the group's own gloo point-to-point calls (CPU) or
gradzip's NCCL transport (CUDA). So an unchanged training loop, DDP without a
hook, or a metrics all_reduce compress with only the init line changed::

    dist.init_process_group("cpu:gradzip,cuda:gradzip")                     # default Policy()
    dist.init_process_group("cpu:gradzip", pg_options=Policy("topk:density=0.01"))

The default policy compresses floating tensors of at least 16384 elements
with qsgd 4-bit (7.7x fewer bytes than fp32), which keeps AdamW's quality
(on the LM experiment -4.4% and -2.1% against fp32's validation loss at 4
and 8 ranks, worst seed +1.3%) and momentum SGD's (digits), where onebit,
the former default, left AdamW +8.4% above fp32: the backend cannot see the
optimizer, so it cannot adapt as the hook does (BENCHMARKS.md section 11,
"Defaults that keep AdamW's quality"). A high-ratio codec with Adam:
:class:`gradzip.torch.CompressedAdamW` instead.

The backend registers itself when ``gradzip.torch`` is imported, and through
the ``torch.distributed.backends`` entry point of the installed package, which
torch loads when it meets the name (so the init line is the only change).

How a call runs (and why):
- The group is a :class:`torch.distributed.ProcessGroup` whose CPU and CUDA
  backends are a gloo and an NCCL backend made for it: every collective
  gradzip does not compress is forwarded to them unchanged, with their
  semantics, errors and timeouts (broadcast, all_gather, reduce_scatter,
  all_to_all, send/recv, ..., integer tensors, MAX/MIN/PRODUCT/PREMUL_SUM,
  tensors below the policy's thresholds, float64); forwarded by Python
  methods, not torch's default dispatch, which would hold the GIL into
  gloo's queue lock (_FORWARDED below).
- A compressed all_reduce picks its error-feedback state on the calling
  thread (the identity rule: _backend_policy.py) and queues the reduction
  on the group's one worker thread, in call order, which is the same on every
  rank; it returns a :class:`Work` at once. Nothing is started from a
  future's callback (docs/ARCHITECTURE.md). ``barrier`` first waits for the
  queued reductions, as gloo's barrier waits for the group's earlier work.
- Exact all_reduces run on gloo at once, beside queued compressed ones: gloo
  keeps point-to-point messages (the engine's, under its own tag) apart from
  its collectives. On CUDA the engine has its own NCCL communicator, so the
  group's NCCL communicator sees only torch's collectives, in program order.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import datetime
import logging
import os
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .. import InvalidArgument, IoError, _core
from . import _resume, _stats
from ._agreement import agree_on_store
from ._backend_policy import ENGINE_DTYPES, Policy, States

__all__ = ["NAME", "Policy", "ProcessGroupGradzip", "Work", "compression_stats", "load_state_dict", "register",
           "set_default_policy", "state_dict"]

logger = logging.getLogger(__name__)

NAME = "gradzip"
# gradzip's own transport for the group's CUDA tensors: the one the registry
# names for NCCL groups (comm/transports/registry.h).
_CUDA_TRANSPORT = _core.transport_for_torch_backend("nccl")
_STATE_VERSION = 1
_default_policy: Optional[Policy] = None


def register() -> None:
    """Registers the ``gradzip`` backend with torch.distributed (idempotent).
    Importing ``gradzip.torch`` does it; so does torch itself through the
    package's ``torch.distributed.backends`` entry point."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def set_default_policy(policy: Optional[Policy]) -> None:
    """The policy of groups created without ``pg_options`` (None: ``GRADZIP_POLICY``
    from the environment if set, else ``Policy()``)."""
    global _default_policy
    if policy is not None and not isinstance(policy, Policy):
        raise ValueError(f"set_default_policy takes a gradzip.torch.backend.Policy, got {type(policy).__name__}")
    _default_policy = policy


def _group(group: Any) -> "ProcessGroupGradzip":
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, ProcessGroupGradzip):
        raise ValueError(f"the process group is not a gradzip one (backend {dist.get_backend(pg)!r}); "
                         f"init_process_group('cpu:gradzip,cuda:gradzip') makes one")
    return pg


def state_dict(group: Any = None) -> Dict[str, Any]:
    """This rank's backend state (error feedback of every compressed buffer,
    byte counts) for a checkpoint: save one per rank."""
    return _group(group).state_dict()


def load_state_dict(state: Dict[str, Any], group: Any = None) -> None:
    """Restores :func:`state_dict`'s output (before the first compressed call)."""
    _group(group).load_state_dict(state)


def compression_stats(group: Any = None) -> Dict[str, Any]:
    """Counts of this rank's all_reduce calls and bytes (see ProcessGroupGradzip.compression_stats)."""
    return _group(group).compression_stats()


class Work(dist._Work):
    """The Work of a compressed all_reduce: ``wait(timeout)``, ``is_completed``,
    ``get_future`` (its value: the reduced tensors, as torch's)."""

    def __init__(self, tensors: List[torch.Tensor]) -> None:
        super().__init__()
        self._tensors = tensors
        self._done = threading.Event()
        self._error: Optional[BaseException] = None
        cuda = tensors[0].is_cuda
        self._fut: torch.futures.Future = torch.futures.Future(devices=[tensors[0].device] if cuda else None)
        # A future holding an exception object reaches C++ (DDP) as a value it
        # cannot read; raising inside then() stores a real error instead.
        self._chained = self._fut.then(lambda f: f.wait())

    def _finish(self, error: Optional[BaseException]) -> None:
        self._error = error
        if error is None:
            self._fut.set_result(self._tensors)
        else:
            self._fut.set_exception(error)
        self._done.set()

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout or 0)
        if not self._done.wait(seconds if seconds > 0 else None):
            raise dist.DistBackendError(f"gradzip: a compressed all_reduce did not complete within {seconds:g} s "
                                        f"(Work.wait timeout)")
        if self._error is not None:
            raise self._error
        if self._tensors[0].is_cuda:
            self._fut.wait()  # the current stream waits for the reduction's stream
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def get_future(self) -> torch.futures.Future:
        return self._chained

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._tensors


class _ThenWork(dist._Work):
    """A backend's Work followed by a step of gradzip's on success (gloo's SUM,
    then the division that makes it an AVG). ``wait()`` raises whatever the
    backend's work raised (its timeout, a peer's failure), and the step runs
    only after a success, once: a failed reduction is never divided and
    returned as if it were a result. (torch's ``_create_work_from_future``
    gives a Work whose wait() returns True while its future holds the error.)"""

    def __init__(self, inner: Any, step: Any, tensors: List[torch.Tensor]) -> None:
        super().__init__()
        self._inner = inner
        self._tensors = tensors

        def then(f: torch.futures.Future) -> List[torch.Tensor]:
            f.value()  # raises the backend's error before the step
            step()
            return tensors

        self._fut = inner.get_future().then(then)

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        self._inner.wait(timeout)  # raises the backend's error (or its timeout)
        self._fut.wait()  # the step has run (or raises what it raised)
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self._fut.done() and self.exception() is None

    def exception(self) -> Optional[BaseException]:
        if not self._fut.done():
            return None
        try:
            self._fut.value()
        except BaseException as e:  # the error is the answer
            return e
        return None

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._tensors


class ProcessGroupGradzip(dist.ProcessGroup):
    """The ``gradzip`` backend's process group (made by ``init_process_group``
    and ``new_group``; see the module's docstring).

    Beyond torch's ProcessGroup: :attr:`policy`, :meth:`state_dict`,
    :meth:`load_state_dict`, :meth:`compression_stats`.
    """

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta, policy: Policy) -> None:
        super().__init__(store, rank, size)
        self.policy = policy
        self._rank, self._size = rank, size
        self._timeout_s = timeout.total_seconds()
        self._backends: Dict[str, Any] = {}
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout=timeout)
        self._register(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
        if torch.cuda.is_available() and dist.is_nccl_available():
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, size, opts)
            self._register(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, nccl)
        self._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        self._states = States()
        self._comms: Dict[str, Any] = {}
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pending: List[Tuple[concurrent.futures.Future, threading.Event]] = []  # each job, its Work's completion
        self._submit = threading.Lock()  # DDP calls all_reduce from autograd's thread, barrier comes from ours
        self._streams: Dict[torch.device, Any] = {}
        self._lock = threading.Lock()  # the byte counts
        self._stats = _new_stats()
        self._store = store
        self._resume = _resume.Resume()  # whose error feedback a load restored (_resume.py)
        self._resume_rounds = 0
        self._aborted = False
        # A script that exits without destroy_process_group: release at exit
        # what torch would keep alive into teardown (see shutdown).
        atexit.register(_release_at_exit, weakref.ref(self))

    def _register(self, device: torch.device, kind: Any, backend: Any) -> None:
        self._register_backend(device, kind, backend)
        self._backends[device.type] = backend

    # -- torch's ProcessGroup interface ---------------------------------------

    def getBackendName(self) -> str:
        return NAME

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceOptions()
        codec = self._codec_for(tensors, opts)
        if codec is None:
            return self._exact_allreduce(tensors, opts)
        return self._compressed_allreduce(tensors[0], codec, opts)

    def barrier(self, opts: Any = None) -> Any:
        self._drain()  # as gloo's barrier, after the group's earlier work
        return self._backends["cpu"].barrier(opts if opts is not None else dist.BarrierOptions())

    def shutdown(self) -> None:
        self._close()
        # torch keeps the group object (its functions' defaults hold the world
        # group) past destroy_process_group and into interpreter teardown:
        # let go of the error-feedback states and codecs now, so nothing of
        # gradzip's native module is alive when it unloads.
        self._release()

    def _release(self) -> None:
        with self._submit, self._lock:
            self._states = States()
            self._comms.clear()  # closed by _close, or dropped at exit: no collective here
        self.policy.release_codecs()
        for b in self._backends.values():
            if hasattr(b, "shutdown"):
                b.shutdown()

    def abort(self) -> None:
        """Ends the calls in flight now: each pending Work raises, and so do
        the peers' calls with this rank; the group is unusable afterwards
        (torchft makes a new one at its next quorum). gloo's own abort()
        leaves a posted receive waiting (torch 2.15), but a receive that
        times out closes every pair of the gloo context: the group times one
        out on purpose, so the engine's exchanges and gloo's collectives fail
        at once rather than at their timeout. Returns once the compressed
        calls in flight have ended (at the latest, their timeout)."""
        self._aborted = True
        for b in self._backends.values():
            if hasattr(b, "abort"):
                b.abort()
        _break_pairs(self._backends["cpu"], self._rank, self._size)
        self._drain()

    def _backend_of(self, args: Any) -> Any:
        """The backend for the first tensor among a call's arguments (CPU: gloo)."""
        todo = list(args)
        while todo:
            a = todo.pop(0)
            if isinstance(a, torch.Tensor):
                backend = self._backends.get(a.device.type)
                if backend is None:
                    raise RuntimeError(f"gradzip backend: no backend for {a.device.type} tensors")
                return backend
            if isinstance(a, (list, tuple)):
                todo[:0] = a
        return self._backends["cpu"]

    # -- gradzip's additions --------------------------------------------------

    def compression_stats(self) -> Dict[str, Any]:
        """This rank's counts since the group was made (or the restored checkpoint):
        ``compressed_calls``, ``exact_calls`` (all_reduces kept exact by the
        policy, SUM/AVG of floating tensors), ``compressed_bytes`` (the dense
        size of the compressed tensors), ``wire_bytes`` (what the engine sent),
        ``baseline_wire_bytes`` (a ring allreduce's 2(P-1)/P x compressed_bytes),
        ``wire_ratio`` (their quotient; the keys every entry point reports:
        ``_stats.py``), ``states`` and ``state_bytes`` (error feedback held)."""
        with self._lock:
            s = dict(self._stats)
        s.update(_stats.core(s["wire_bytes"], _stats.ring(s["compressed_bytes"], self._size)))
        s["states"] = len(self._states)
        s["state_bytes"] = self._states.bytes()
        return s

    def state_dict(self) -> Dict[str, Any]:
        """This rank's error-feedback states, in the order of their first use,
        and the byte counts (waits for queued reductions first)."""
        self._drain()
        with self._submit, self._lock:
            stats = dict(self._stats)
            states = self._states.state_dict()
        return {"version": _STATE_VERSION, "policy": self.policy.fields(), "world_size": self._size,
                "saved_by": _resume.saved_by(self._rank, self._size), "states": states, "stats": stats}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output, saved with the same policy.
        This rank's own state (same rank and world size) restores every
        error-feedback state, orphaned: the first compressed calls take them
        over in order, by signature (docs/python.md). Another rank's or world
        size's (a stack that saved rank 0's copy) restores the counts only:
        at the next compressed call the ranks agree on what each restored,
        and all of them continue with fresh error feedback and warn once, or
        raise the same InvalidArgument when some restored and others did not
        (torch/_resume.py).

        All or nothing: every field is checked (types exactly, each state
        against the policy, its residuals in C++) before anything is replaced;
        a refused state dict raises InvalidArgument (a ValueError) and leaves
        the group's states and counts as they were."""
        def refuse(why: str) -> InvalidArgument:
            return InvalidArgument(f"gradzip backend state_dict: {why}")

        if not isinstance(state, dict):
            raise refuse(f"not a dict: {type(state).__name__}")
        keys = {"version", "policy", "world_size", "states", "stats"}
        if set(state) - {"saved_by"} != keys:
            raise refuse(f"keys {sorted(map(str, state))}, not version, policy, world_size, states, stats "
                         "(and saved_by)")
        version, policy, world = state["version"], state["policy"], state["world_size"]
        if type(version) is not int or version != _STATE_VERSION:
            raise refuse(f"version {version!r}; this release reads version {_STATE_VERSION}")
        saved = [tuple(f) for f in policy] if isinstance(policy, (list, tuple)) and all(
            isinstance(f, (list, tuple)) for f in policy) else policy
        if not isinstance(saved, list) or saved != self.policy.fields():  # (a list first: numpy's != is no bool)
            raise refuse(f"saved under another policy: {saved!r} (this group: {self.policy.fields()})")
        if type(world) is not int or world < 1:
            raise refuse(f"world_size must be an integer >= 1, got {world!r}")
        try:
            stamp = _resume.checked_stamp(state)
        except ValueError as e:
            raise refuse(str(e)) from None
        if stamp is not None and stamp[1] != world:
            raise refuse(f"saved_by {state['saved_by']!r} disagrees with world_size={world}")
        stats = state["stats"]
        if not isinstance(stats, dict) or set(stats) != set(_new_stats()) or any(
                type(v) is not int or v < 0 for v in stats.values()):
            raise refuse(f"stats must map {', '.join(_new_stats())} to integers >= 0, got {stats!r}")
        resume = _resume.Resume()
        resume.loaded(stamp, world, self._rank, self._size)
        if resume.status == _resume.OWN:
            restored = States.restored(state["states"], self.policy, self._rank, self._size)
        elif isinstance(state["states"], (list, tuple)):
            restored = States()  # another rank's residuals: never applied here (the agreement drops them everywhere)
        else:
            raise refuse(f"'states' must be a list, got {type(state['states']).__name__}")
        self._drain()
        with self._submit, self._lock:
            self._states = restored
            self._stats = dict(stats)
            self._resume = resume

    # -- internals --------------------------------------------------------------

    def _settle(self) -> None:
        """The first compressed call after the group was made or a state
        loaded: the ranks agree whose error feedback each restored
        (torch/_resume.py), through the group's store, sealed. Anything but
        every rank's own: every rank drops its states and warns once."""
        def agree(fields: Any, round: str, mismatch: str) -> None:
            if self._size > 1:
                self._resume_rounds += 1
                agree_on_store(self._store, "gradzip/backend-resume", self._resume_rounds - 1, self._rank,
                               self._size, fields, self._timeout_s, round, mismatch)

        if self._resume.settle(agree, "backend"):
            self._states = States()

    def _codec_for(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        if len(tensors) != 1 or self._size == 1:
            return None
        op = getattr(opts.reduceOp, "op", opts.reduceOp)
        t = tensors[0]
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG) or t.dtype not in ENGINE_DTYPES:
            return None
        if not t.is_contiguous() or t.device.type not in ("cpu", "cuda"):
            return None
        codec = self.policy.codec_for(t)
        if codec is not None and t.is_cuda and not _core.transport_available(_CUDA_TRANSPORT):
            _warn_once(f"gradzip backend: this build has no {_CUDA_TRANSPORT} transport; CUDA all_reduces stay exact "
                       "(NCCL)")
            return None
        return codec

    def _exact_allreduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        if not tensors:
            return self._backends["cpu"].allreduce(tensors, opts)
        backend = self._backends.get(tensors[0].device.type)
        if backend is None:
            raise RuntimeError(f"gradzip backend: no backend for {tensors[0].device.type} tensors")
        op = getattr(opts.reduceOp, "op", opts.reduceOp)
        floating = tensors[0].is_floating_point()
        if floating and len(tensors) == 1 and op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            with self._lock:
                self._stats["exact_calls"] += 1
        if op == dist.ReduceOp.AVG and tensors[0].device.type == "cpu" and floating:
            # gloo has no AVG: a SUM, then the division, as the engine's "avg".
            sum_opts = dist.AllreduceOptions()
            sum_opts.reduceOp = dist.ReduceOp.SUM
            sum_opts.timeout = opts.timeout
            size = self._size

            def divide() -> None:
                for t in tensors:
                    t.div_(size)

            return _ThenWork(backend.allreduce(tensors, sum_opts), divide, tensors)
        return backend.allreduce(tensors, opts)

    def _compressed_allreduce(self, t: torch.Tensor, codec: Any, opts: Any) -> Work:
        with self._submit:
            return self._submit_compressed(t, codec, opts)

    def _submit_compressed(self, t: torch.Tensor, codec: Any, opts: Any) -> Work:
        op = "avg" if getattr(opts.reduceOp, "op", opts.reduceOp) == dist.ReduceOp.AVG else "sum"
        kind = t.device.type
        comm = self._comms.get(kind)
        if comm is None:  # the first compressed call on this device type: every rank makes it here
            comm = self._comms[kind] = self._connect(kind)
        if not self._resume.settled:  # on the calling thread, in call order: the same round on every rank
            self._settle()
        self._await_finished_jobs()  # before the identity rule asks which earlier buffers are still alive
        ef = self._states.get(t, codec)
        policy = self.policy
        work = Work([t])
        ready = None
        if t.is_cuda:  # the engine's stream waits for what the caller's stream computed so far
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(t.device))
        nbytes = t.numel() * t.element_size()
        # The job takes the tensor and the Work out of `call`: once it has
        # returned, the worker thread holds nothing of the call (_await_finished_jobs).
        call = [t, work]

        def run(t: torch.Tensor, work: Work) -> None:
            stats = comm.allreduce(t, codec, ef, op=op, algorithm=policy.algorithm,
                                   server_codec=policy.server_codec)
            with self._lock:  # counted before the Work completes: whoever waited sees it
                s = self._stats
                s["compressed_calls"] += 1
                s["compressed_bytes"] += nbytes
                s["wire_bytes"] += stats["wire_bytes"]
            work._finish(None)  # on CUDA, inside the engine's stream: the future records it

        def job() -> None:
            t, work = call
            call.clear()
            try:
                if ready is None:
                    run(t, work)
                    return
                stream = self._streams.get(t.device)
                if stream is None:
                    stream = self._streams[t.device] = torch.cuda.Stream(t.device)
                stream.wait_event(ready)
                with torch.cuda.stream(stream):
                    run(t, work)
                return
            except BaseException as e:  # the Work raises it from wait(), typed (gradzip.IoError ...)
                self._call_failed(e)
                if not self._aborted:
                    # Without this thread's frames: they hold the communicator, codec
                    # and error feedback, which the error would keep alive to exit.
                    work._finish(e.with_traceback(None))
                    return
                why = str(e)
            # Outside the except block: the Work's future raises the new error
            # in its callback, which inside it would take the original (and its
            # frames) as its __context__.
            work._finish(IoError(f"gradzip backend: the group was aborted during a compressed all_reduce ({why})"))

        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradzip-pg")
        self._pending = [p for p in self._pending if not p[0].done()]
        self._pending.append((self._pool.submit(job), work._done))
        return work

    def _connect(self, kind: str) -> Any:
        import gradzip

        if not gradzip.BUILD["comm"]:
            raise ValueError("this gradzip build has no communicator (comm/), which the backend's compressed "
                             "all_reduce runs in")
        # CPU: the engine's exchanges are this group's gloo point-to-point
        # calls (tagged). CUDA: gradzip's own NCCL communicator, so that the
        # group's NCCL communicator only sees torch's calls in program order.
        transport = "torch" if kind == "cpu" else _CUDA_TRANSPORT
        return gradzip.Communicator.from_torch(self, transport=transport, timeout=self._timeout_s)

    def _call_failed(self, error: BaseException) -> None:
        """A compressed call failed (on the group's worker thread): nothing
        more here; torchft's group ends its whole group then."""

    def _drain(self) -> None:
        with self._submit:
            pending, self._pending = self._pending, []
        for f, _ in pending:
            f.result()  # jobs never raise: errors go to their Work

    def _await_finished_jobs(self) -> None:
        """Waits for the jobs whose Work has completed to return: a job
        completes its Work last, and until it returns its thread holds the
        call's tensor. The identity rule asks which buffers of earlier calls
        are still alive; a buffer the program freed after its call's Work
        completed must count as freed on every rank, not as alive on a rank
        whose worker thread was descheduled in that moment (a loaded
        machine). Otherwise that rank alone takes a fresh error-feedback
        state, whose first call runs the engine's agreement round through
        the store, while the others take the freed buffer's state and start
        its exchange: every rank waits until the timeout (DDP's bucket
        rebuild after its first step hung so). Under self._submit."""
        for f, done in self._pending:
            if done.is_set():
                f.result()  # at most the job's last lines; jobs never raise

    def _close(self) -> None:
        if self._pool is not None:
            self._drain()
            self._pool.shutdown(wait=True)
            self._pool = None
        for comm in self._comms.values():
            try:
                comm.close()
            except Exception:  # a broken communicator: nothing left to release
                pass
        self._comms.clear()

    def __repr__(self) -> str:
        return f"ProcessGroupGradzip(rank={self._rank}, size={self._size}, policy={self.policy!r})"


# The collectives gradzip leaves exact, forwarded to the device's backend from
# Python. Not left to torch's default dispatch: for a process group written in
# Python, that dispatch calls the backend while it holds the GIL (PyProcessGroup's
# WORK_OVERRIDE), so gloo's enqueue waits for its queue lock holding the GIL,
# while a gloo worker can hold that lock as it frees an earlier call's tensors,
# which needs the GIL: both stop for good. DDP met it in its bucket rebuild (a
# broadcast) right after an all_reduce of a metric, about 1 run in 10 under
# load. The backends' own bindings release the GIL. Arguments pass through
# unchanged, so every overload of each call is kept.
_FORWARDED = ("allgather", "all_gather_single", "all_gather_single_coalesced", "allgather_coalesced",
              "allreduce_coalesced", "reduce", "alltoall", "all_to_all_single", "broadcast", "gather", "scatter",
              "reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced", "send", "recv")


def _forwarder(name: str) -> Any:
    def forward(self: ProcessGroupGradzip, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._backend_of(args), name)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"torch's {name} on the group's backend for the tensors' device (gloo or NCCL), exact."
    return forward


for _name in _FORWARDED:
    setattr(ProcessGroupGradzip, _name, _forwarder(_name))
setattr(ProcessGroupGradzip, "recvAnysource",  # torch's C++ name; the bindings call it recv_anysource
        lambda self, tensors, tag: self._backend_of((tensors,)).recv_anysource(tensors, tag))


# The tag of the receive abort() times out on purpose (no message carries it).
_ABORT_TAG = 0x475AFFFF


def _break_pairs(gloo: Any, rank: int, size: int) -> None:
    """Closes every pair of `gloo`'s context: a receive that times out does
    (gloo: "Application timeout caused pair closure"), and every call in
    flight on the context raises at once."""
    if size < 2:
        return
    try:
        gloo.recv([torch.empty(1, dtype=torch.uint8)], (rank + 1) % size, _ABORT_TAG).wait(
            datetime.timedelta(milliseconds=1))
    except Exception:  # the timeout that closes the pairs (or they were closed already)
        pass


def _release_at_exit(ref: "weakref.ReferenceType[ProcessGroupGradzip]") -> None:
    pg = ref()
    if pg is not None:
        pg._release()


def _new_stats() -> Dict[str, Any]:
    return {"compressed_calls": 0, "exact_calls": 0, "compressed_bytes": 0, "wire_bytes": 0}


_warned: set = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        logger.warning(msg)


def _policy_of(backend_options: Any) -> Policy:
    if isinstance(backend_options, Policy):
        return backend_options
    if backend_options is not None:
        raise ValueError(f"the gradzip backend takes a gradzip.torch.backend.Policy as pg_options, got "
                         f"{type(backend_options).__name__}")
    if _default_policy is not None:
        return _default_policy
    text = os.environ.get("GRADZIP_POLICY")
    if not text:
        return Policy()
    try:
        return Policy.parse(text)
    except ValueError as e:  # (an unknown codec spec: InvalidArgument, one too)
        raise InvalidArgument(f"GRADZIP_POLICY={text!r} is not a usable gradzip backend policy: "
                              f"{e}") from None


def _create(opts: Any, backend_options: Any) -> ProcessGroupGradzip:
    """torch's factory call (extended API), on every rank of a new group."""
    try:
        policy, problem = _policy_of(backend_options), None
    except ValueError as e:  # (InvalidArgument is one): the other ranks hear of it in the agreement
        policy, problem = None, e
    _agree(opts.store, opts.group_rank, opts.group_size, policy, problem, opts.timeout)
    if problem is not None:  # every rank has the same one (else the agreement raised)
        raise problem
    pg = ProcessGroupGradzip(opts.store, opts.group_rank, opts.group_size, opts.timeout, policy)
    logger.info("gradzip backend: rank %d of %d, %r", opts.group_rank, opts.group_size, policy)
    return pg


def _agree(store: Any, rank: int, size: int, policy: Optional[Policy], problem: Optional[BaseException],
           timeout: datetime.timedelta) -> None:
    """The ranks compare their policies in init_process_group: ranks that
    would compress different calls would hang (one in gloo's allreduce, the
    other in the engine's exchange), so a mismatch raises the same
    InvalidArgument on every rank. A rank whose policy could not be made
    (a malformed GRADZIP_POLICY) takes part with that error as its policy, so
    that every rank raises at once rather than waiting out the timeout.

    gradzip's agreement through the group's store (torch's, which has no
    authentication), every record sealed with the job's key: a stranger on
    the store can neither hide a mismatch nor invent one (_agreement.py)."""
    if size == 1:
        return
    if problem is None:
        fields = policy.fields()
    else:
        fields = [(name, f"unusable ({type(problem).__name__}: {problem})") for name, _ in Policy().fields()]
    agree_on_store(store, "gradzip/backend-agree", 0, rank, size, fields, timeout.total_seconds(),
                   "the gradzip backend's policy agreement (init_process_group)",
                   "gradzip backend: the ranks' policies differ (give init_process_group the same Policy, or the "
                   "same GRADZIP_POLICY, on every rank):")
