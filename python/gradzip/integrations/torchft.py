"""gradzip inside torchft: a process group its ``Manager`` reconfigures.

    pg = gradzip.integrations.torchft.ProcessGroupGradzip(Policy("qsgd:bits=4"), timeout=timedelta(seconds=30))
    manager = torchft.Manager(pg=pg, min_replica_size=1, load_state_dict=..., state_dict=..., ...)
    pg.attach(manager)                  # a healed replica then starts with fresh error feedback

Every ``manager.allreduce`` then runs gradzip's compressed allreduce where
the :class:`~gradzip.torch.backend.Policy` says so (the backend's rule:
floating tensors of at least ``min_elements``), so torchft's DDP, LocalSGD,
DiLoCo and Streaming DiLoCo fragments send compressed without a change to
torchft. Everything else (broadcasts, small or integer tensors) is gloo's.

What torchft's contract asks (``torchft.process_group.ProcessGroup``) and
what this group does:

- ``configure(store_addr, replica_id, rank, world_size, ...)`` at every
  quorum change: the group of the last quorum is aborted and a new one made
  for the new store prefix, rank and world size; it is the gradzip backend's
  group (:class:`gradzip.torch.backend.ProcessGroupGradzip`: gloo for the
  exact calls, the engine for the compressed ones), meeting through
  torchft's store instead of torch's registry.
- Before it is made, the members agree (sealed, through that store) on the
  policy, and on where each came from: a policy that differs raises the
  same :class:`gradzip.InvalidArgument` on every replica (torchft reports
  it and no step commits); any other difference decides what happens to
  the error feedback, alike on every member (below).
- ``abort()`` ends the calls in flight at once (the group closes its gloo
  pairs: the Works raise now, not at their timeout), ``errored()`` returns
  the first failed call's error since the last ``configure``, and
  ``shutdown()`` closes the group.

Error feedback follows position: the k-th compressed call of a tensor
signature in a step continues the k-th state of it (:class:`StepStates`;
torchft reduces the same tensors in the same order every step).

Error feedback across quorums. A replica that stays keeps its own
residuals (what its codec has not yet sent of its own buffers); they are
its own whatever the world size. What depends on the group (scatter_reduce's
and the ring's server residual of the chunk a rank owns, hierarchical's
shards) is kept only when every member comes from the same last quorum at
the same rank of the same world size; otherwise every member starts it
from zeros (``ErrorFeedback.regroup``), decided by the agreement, so no
member continues one world size's chunk in another's. A replica that joins
(a new process) starts fresh and says so once; one that heals
(``attach``: torchft's state transfer calls it) drops its residuals, keeps
what torchft recovered for it, and says so. torchft discards a step that
failed (``should_commit`` is False), so a compressed step lands on every
replica or on none; the residuals of a failed step are what its encode left
(the unsent part of a discarded gradient joins the next one).
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch
from torchft.process_group import ProcessGroupWrapper

from .. import InvalidArgument, IoError, _core
from ..comm import Communicator
from ..torch import _resume, _stats, backend
from ..torch._agreement import agree_on_store
from ..error_feedback import ErrorFeedback
from ..torch._backend_policy import ENGINE_DTYPES, Policy
from ..torch._torch_transport import ProcessGroupTransport

__all__ = ["ProcessGroupGradzip", "StepStates"]

logger = logging.getLogger(__name__)

_NAME = "torchft-gradzip"
_STATE_KEY = "gradzip"  # the manager's state dict key (attach)
_PLACE_FIELDS = ("quorum before", "same place")


class ProcessGroupGradzip(ProcessGroupWrapper):
    """A torchft process group whose allreduces gradzip compresses (see the
    module's docstring).

    Args:
        policy: what is compressed, with which codec
            (:class:`gradzip.torch.backend.Policy`; default ``Policy()``:
            qsgd 4-bit for floating tensors of at least 16384 elements). The
            same on every replica: the members compare it at every quorum.
        timeout: the group's timeout (store, gloo, the engine's waits), as
            torchft's ``ProcessGroupGloo(timeout=...)``; keep it at most the
            Manager's ``timeout``.

    Beyond torchft's ProcessGroup: :meth:`attach`, :meth:`compression_stats`.
    """

    def __init__(self, policy: Optional[Policy] = None,
                 timeout: datetime.timedelta = datetime.timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        if policy is not None and not isinstance(policy, Policy):
            raise ValueError(f"policy must be a gradzip.torch.backend.Policy, got {type(policy).__name__}")
        self.policy = policy if policy is not None else Policy()
        self._states = StepStates()  # every quorum's group continues these
        self._place: Optional[Tuple[Any, int, int]] = None  # (quorum id, rank, world size) of the last group made
        self._lock = threading.Lock()
        self._works: List[Any] = []  # this quorum's calls, for errored()
        self._error: Optional[BaseException] = None
        self._totals = {"compressed_calls": 0, "exact_calls": 0, "compressed_bytes": 0, "wire_bytes": 0,
                        "baseline_wire_bytes": 0.0}
        self._events = {"quorums": 0, "regrouped": 0, "healed": 0}
        self._joined_said = False
        self._attached = False

    # -- torchft's ProcessGroup -----------------------------------------------

    def getBackendName(self) -> str:
        return _NAME

    def _create_pg(self, store: Any, rank: int, world_size: int) -> Any:
        """A quorum's group (torchft's configure calls it, after aborting the
        last one): the members' agreement, then the backend's group over
        torchft's store, continuing this replica's error feedback."""
        keep = self._agree(store, rank, world_size)
        if world_size > 1 and self._place is None and not self._joined_said:
            self._joined_said = True
            logger.warning("gradzip torchft: this replica joins quorum %s as rank %d of %d with fresh error "
                           "feedback", self._quorum_id, rank, world_size)
        if not keep and len(self._states):
            self._states.regroup()
            self._events["regrouped"] += 1
        pg = _QuorumGroup(store, rank, world_size, self._timeout, self.policy, self._states,
                          f"torchft replica {self._replica_id}")
        with self._lock:
            self._works, self._error = [], None
        self._place = (self._quorum_id, rank, world_size)
        self._events["quorums"] += 1
        return pg

    def _wrap_work(self, work: Any, opts: object) -> Any:
        with self._lock:  # the calls that failed stay until the next quorum; the ones that succeeded go
            self._works = [w for w in self._works if not w.is_completed() or w.exception() is not None]
            self._works.append(work)
        return work

    def errored(self) -> Optional[Exception]:
        """The first error of this quorum's calls (a dead peer, a timeout, an
        abort): torchft's ``should_commit`` then returns False. torchft asks
        once per step, at ``should_commit``: the group takes the question as
        the step's end (its error-feedback states count calls per step)."""
        self._states.step_ended()
        with self._lock:
            if self._error is None:
                for w in self._works:
                    if w.is_completed() and w.exception() is not None:
                        self._error = w.exception()
                        break
            return self._error  # type: ignore[return-value]

    def abort(self, errored: bool = True) -> None:
        """Ends this quorum's group: its calls in flight raise at once (a peer
        in a call with this replica too), and the next call needs a
        ``configure``. torchft calls it with ``errored=False`` at each
        quorum change."""
        pg = self._pg
        super().abort(errored)  # torchft's log, the group's abort (which waits out its calls), _pg = None
        if errored:
            with self._lock:
                if self._error is None:
                    self._error = IoError("gradzip torchft: the process group was aborted")
        if isinstance(pg, _QuorumGroup):
            self._retire(pg)

    def shutdown(self) -> None:
        """Closes the group for good: its error feedback and codecs go too (a
        process keeps torchft's objects into interpreter teardown, past
        gradzip's native module)."""
        pg = self._pg
        super().shutdown()
        if isinstance(pg, _QuorumGroup):
            self._retire(pg)
        with self._lock:
            self._works = []
        self._states = StepStates()
        self.policy.release_codecs()

    # -- gradzip's additions --------------------------------------------------

    def attach(self, manager: Any) -> None:
        """Registers with torchft's ``Manager`` (its ``register_state_dict_fn``)
        so that a replica that heals knows it: torchft sends the healing
        replica a live peer's state dicts, gradzip's among them (the policy
        only: error feedback is a replica's own), and on receipt this
        replica drops its residuals and says so. Call it on every replica,
        right after making the Manager."""
        if self._attached:
            raise ValueError("this gradzip process group is attached to a Manager already")
        manager.register_state_dict_fn(_STATE_KEY, self._healed, self._heal_state)
        self._attached = True

    def compression_stats(self) -> Dict[str, Any]:
        """This replica's counts over every quorum since it started:
        ``compressed_calls``, ``exact_calls``, ``compressed_bytes``,
        ``wire_bytes``, ``baseline_wire_bytes`` (a ring allreduce's bytes for
        the compressed tensors, at each quorum's size), ``wire_ratio``;
        ``states`` and ``state_bytes`` (error feedback held), ``quorums``
        (groups made), ``regrouped`` (quorum changes that started the
        group-dependent residuals from zeros), ``healed``."""
        totals = dict(self._totals)
        pg = self._pg
        if isinstance(pg, _QuorumGroup):
            _add(totals, pg.compression_stats())
        s: Dict[str, Any] = {k: totals[k] for k in ("compressed_calls", "exact_calls", "compressed_bytes")}
        s.update(_stats.core(totals["wire_bytes"], totals["baseline_wire_bytes"]))
        s["states"] = len(self._states)
        s["state_bytes"] = self._states.bytes()
        s.update(self._events)
        return s

    def __repr__(self) -> str:
        return f"ProcessGroupGradzip(policy={self.policy!r}, pg={self._pg!r})"

    # -- internals --------------------------------------------------------------

    def _agree(self, store: Any, rank: int, world_size: int) -> bool:
        """The members' agreement at a quorum change. Raises the same
        InvalidArgument on every member when their policies differ (or an
        IoError when a member does not take part within the timeout).
        Returns whether the group-dependent residuals stay: every member
        comes from the same last quorum, at the same rank of the same
        world size."""
        if world_size == 1:
            return self._place is not None and self._place[1:] == (rank, world_size)
        if self._place is None:
            before, same = "none: joins", "no"
        else:
            before = f"quorum {self._place[0]} of {self._place[2]} replicas"
            same = "yes" if self._place[1:] == (rank, world_size) else "no"
        fields = self.policy.fields() + [(_PLACE_FIELDS[0], before), (_PLACE_FIELDS[1], same)]
        try:
            agree_on_store(store, "gradzip/torchft-quorum", 0, rank, world_size, fields,
                           self._timeout.total_seconds(), "gradzip's torchft quorum agreement (configure)",
                           "gradzip torchft: the replicas' policies differ (give every replica's "
                           "ProcessGroupGradzip the same Policy):")
        except InvalidArgument as e:
            if not _resume.differing(str(e)) <= set(_PLACE_FIELDS):
                raise
            return False  # members from different places: every member starts the group-dependent state anew
        return same == "yes"

    def _heal_state(self) -> Dict[str, Any]:
        return {"version": 1, "policy": [list(f) for f in self.policy.fields()]}

    def _healed(self, state: Dict[str, Any]) -> None:
        """torchft recovered this replica from a peer (its Manager calls this
        with the peer's state): its residuals are of a past it no longer
        continues."""
        policy = [tuple(f) for f in state.get("policy", [])] if isinstance(state, dict) else None
        if policy != self.policy.fields():
            raise InvalidArgument(f"gradzip torchft: healed from a replica of another policy ({policy!r}; this "
                                  f"replica: {self.policy.fields()!r})")
        zeroed = self._states.zero()  # in place: the peers' states and agreements stay as they are
        self._events["healed"] += 1
        logger.warning("gradzip torchft: this replica healed from a peer in quorum %s; its error feedback starts "
                       "fresh (%d states zeroed)", self._quorum_id, zeroed)

    def _retire(self, pg: "_QuorumGroup") -> None:
        """Folds a finished quorum's counts in and closes its group."""
        try:
            _add(self._totals, pg.compression_stats())
        finally:
            pg.shutdown()


def _add(totals: Dict[str, Any], s: Dict[str, Any]) -> None:
    for k in ("compressed_calls", "exact_calls", "compressed_bytes", "wire_bytes", "baseline_wire_bytes"):
        totals[k] += s[k]


Signature = Tuple[str, str, int, str]


class StepStates:
    """The error-feedback states of a torchft group, by position: the k-th
    compressed call of a signature (device, dtype, element count, codec)
    since the step began continues the k-th state of that signature. torchft
    reduces the same tensors in the same order every step (DDP's buckets,
    LocalSGD's parameters, DiLoCo's deltas: new tensors each sync), on every
    replica alike; the backend's identity rule, which follows a buffer by its
    address and lifetime, would follow torchft's timing instead (its Manager
    keeps a step's tensors in futures until a timer thread lets go), which
    differs between replicas, and ranks that pick states differently stop
    at the engine's agreement.

    Streaming DiLoCo's fragments of the same shapes, synced in turn, take the
    same states (the group cannot tell them apart): give them different
    shapes, or one fragment, for error feedback that follows each."""

    __slots__ = ("_by", "_seen")

    def __init__(self) -> None:
        self._by: Dict[Tuple[Signature, int], ErrorFeedback] = {}
        self._seen: Dict[Signature, int] = {}

    def get(self, tensor: torch.Tensor, codec: Any) -> ErrorFeedback:
        sig: Signature = (tensor.device.type, ENGINE_DTYPES[tensor.dtype], tensor.numel(), codec.spec)
        k = self._seen.get(sig, 0)
        self._seen[sig] = k + 1
        ef = self._by.get((sig, k))
        if ef is None:
            ef = self._by[(sig, k)] = ErrorFeedback()
        return ef

    def step_ended(self) -> None:
        self._seen.clear()

    def regroup(self) -> int:
        """ErrorFeedback.regroup on every state (a new quorum of another place)."""
        for ef in self._by.values():
            ef.regroup()
        return len(self._by)

    def zero(self) -> int:
        """ErrorFeedback.zero on every state (no agreement round: a healed replica alone)."""
        for ef in self._by.values():
            ef.zero()
        return len(self._by)

    def states(self) -> List[ErrorFeedback]:
        return list(self._by.values())

    def bytes(self) -> int:
        return sum(ef.bytes for ef in self._by.values())

    def __len__(self) -> int:
        return len(self._by)


class _QuorumGroup(backend.ProcessGroupGradzip):
    """One quorum's group: the gradzip backend's, meeting through torchft's
    store (torchft's groups are not in torch's registry, which
    ``Communicator.from_torch`` reads), continuing the states it is given.
    Each member is a node of its own, named by its replica (the launcher's
    variables describe the job it started, not the quorum)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta, policy: Policy,
                 states: StepStates, node: str) -> None:
        super().__init__(store, rank, size, timeout, policy)
        self._states = states
        self._node = node
        self._resume.settled = True  # nothing restored: torchft heals through attach()
        self._drivers: List[ProcessGroupTransport] = []

    def _connect(self, kind: str) -> Communicator:
        if kind == "cpu":
            driver = ProcessGroupTransport(self, 0, rank=self._rank, size=self._size, backend="gloo")
            self._drivers.append(driver)
            return Communicator(_core.Communicator.from_python(self._store, driver, self._timeout_s,
                                                               "gradzip/torchft/cpu", self._node))
        return Communicator.from_store(self._store, self._rank, self._size, backend._CUDA_TRANSPORT,
                                       timeout=self._timeout_s, prefix="gradzip/torchft/cuda",
                                       cuda_device=torch.cuda.current_device(), node=self._node)

    def _call_failed(self, error: BaseException) -> None:
        # A failed call ends this quorum (torchft makes a new group): close
        # the gloo pairs now, so the peers waiting for this replica's payloads
        # fail at once too instead of at their timeout.
        backend._break_pairs(self._backends["cpu"], self._rank, self._size)

    def _close(self) -> None:
        try:
            super()._close()
        finally:
            for d in self._drivers:  # their poster threads (gloo's pairs are closed: they return at once)
                d.close()
            self._drivers = []
