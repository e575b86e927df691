"""Per-rank checkpoint files for gradzip's state, beside any checkpoint.

Error-feedback residuals differ on every rank, and the checkpointers of the
training stacks (Trainer, Accelerate, Lightning) save one copy of the
optimizer and callback state, rank 0's. So gradzip writes its own file per
rank into the stack's checkpoint folder::

    gradzip.torch.checkpoint.save(folder, state)   # every rank: folder/gradzip-rank{r}-of-{P}.pt
    gradzip.torch.checkpoint.load(folder, state)   # every rank (collective): True when restored

``state`` is any of gradzip's stateful objects: a :class:`CompressionState`,
:class:`CompressedAdamW` / :class:`CompressedSGD`, :class:`BlockMomentum`,
an :class:`~gradzip.torch.fsdp.FSDPCompressionState`, or the
:mod:`gradzip.torch.backend` module (the default group's backend state);
several, in one order on save and load.
Each rank writes and reads its own file only: one rank's residuals, however
many ranks the job has. The integrations in :mod:`gradzip.integrations`
call these two functions from the stacks' own save and resume events.

:func:`load` is collective. Every rank reads and checks its own file, then
the ranks agree (sealed, through the rendezvous store):

- every file present and well-formed: each object is restored, and restored
  again at its next step, after whatever the stack restores in between (a
  stack that loads rank 0's optimizer state on every rank would otherwise
  overwrite rank 1's residuals with rank 0's). Training continues
  bit-identically.
- a file missing on some or all ranks (none saved, another world size):
  every rank warns once and continues with fresh error feedback; nothing is
  restored anywhere, so the ranks stay alike.
- a file unreadable, from another rank or job layout, or holding other
  objects or settings: every rank raises the same
  :class:`gradzip.InvalidArgument`, naming each rank's problem.

Files are read with ``torch.load(weights_only=True)``: a file is hostile
until checked and cannot run code.
"""

from __future__ import annotations

import io
import logging
import os
import re
import types
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .. import _core
from . import _agreement

__all__ = ["Stateful", "load", "path_of", "save"]

logger = logging.getLogger(__name__)

_FORMAT = "gradzip-rank-state"
_VERSION = 1
_NAME = re.compile(r"^gradzip-rank(\d+)-of-(\d+)\.pt$")


def path_of(directory: str, rank: int, world_size: int) -> str:
    """The file of `rank` of `world_size` in `directory`."""
    return os.path.join(os.fspath(directory), f"gradzip-rank{rank}-of-{world_size}.pt")


def _kind(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return type(obj).__name__


def _where(group: Any) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _body(objects: Tuple[Any, ...], rank: int, world: int) -> Dict[str, Any]:
    if not objects:
        raise ValueError("gradzip.torch.checkpoint needs at least one gradzip object")
    return {"format": _FORMAT, "version": _VERSION, "rank": rank, "world_size": world,
            "objects": [{"kind": _kind(o), "state": o.state_dict()} for o in objects]}


def save(directory: str, *objects: Any, group: Any = None) -> str:
    """Writes this rank's state of `objects` (in order) to its file in
    `directory` (created if needed), atomically: a crash mid-write leaves the
    previous file or none. Call on every rank. Returns the file's path."""
    rank, world = _where(group)
    body = _body(objects, rank, world)
    os.makedirs(os.fspath(directory), exist_ok=True)
    path = path_of(directory, rank, world)
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(body, tmp)
    os.replace(tmp, path)
    return path


def _read(source: Any, name: str, rank: int, world: int, objects: Tuple[Any, ...]) -> List[Any]:
    """This rank's saved body (a path or a file-like), checked: the state
    dicts in `objects`' order. Raises ValueError naming what is wrong."""
    try:
        body = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, not a torch file, or a pickle that is not plain data
        raise ValueError(f"{name} is not a readable gradzip rank file ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:160] if str(e) else ''})") from None
    if not isinstance(body, dict) or body.get("format") != _FORMAT or body.get("version") != _VERSION:
        raise ValueError(f"{name} is not a gradzip rank file (format {_FORMAT} v{_VERSION})")
    if body.get("rank") != rank or body.get("world_size") != world:
        raise ValueError(f"{name} says it is rank {body.get('rank')!r} of {body.get('world_size')!r}")
    entries = body.get("objects")
    kinds = [e.get("kind") if isinstance(e, dict) else None for e in entries] if isinstance(entries, list) else None
    if kinds != [_kind(o) for o in objects]:
        raise ValueError(f"{name} holds {kinds!r}; asked to restore {[_kind(o) for o in objects]!r}")
    return [e.get("state") for e in entries]


def _others(directory: str, world: int) -> str:
    """The world sizes of other rank files in `directory`, for the warning."""
    try:
        sizes = sorted({int(m.group(2)) for m in map(_NAME.match, os.listdir(directory)) if m} - {world})
    except OSError:
        return ""
    return f" (it holds files of world size {', '.join(map(str, sizes))})" if sizes else ""


def load(directory: str, *objects: Any, group: Any = None) -> bool:
    """Restores `objects` (in the order :func:`save` was given them) from this
    rank's file in `directory`. Collective over `group` (None: the default
    group). Returns True when every rank restored its own state; False when
    a file was missing on some rank (every rank warns once and restores
    nothing). Raises :class:`gradzip.InvalidArgument` on every rank when a
    rank's file is malformed or does not match `objects`."""
    if not objects:
        raise ValueError("load() needs at least one gradzip object")
    rank, world = _where(group)
    path = path_of(directory, rank, world)
    found = os.path.exists(path)
    return _restore(lambda: _read(path, os.path.basename(path), rank, world, objects) if found else None,
                    objects, group, f"gradzip.torch.checkpoint.load({os.fspath(directory)!r})",
                    "missing" + ("" if found else _others(os.fspath(directory), world)))


def _restore(read: Callable[[], Optional[List[Any]]], objects: Tuple[Any, ...], group: Any, where: str,
             missing: str) -> bool:
    """What :func:`load` and :class:`Stateful` share: this rank's states
    (`read`: None when absent, then `missing` says so), then the ranks'
    agreement, then the restore."""
    world = _where(group)[1]
    states: Optional[List[Any]] = None
    problem = "none"
    try:
        states = read()
    except ValueError as e:
        problem = str(e)

    def agree(fields: List[Tuple[str, str]], mismatch: str) -> None:
        if world > 1:
            _agreement.agree(group, fields, "checkpoint", "the checkpoint agreement", mismatch)

    agree([("rank file", problem)], f"{where}: a rank file is unusable:")
    if problem != "none":  # the same problem on every rank
        raise _core.InvalidArgument(f"{where}: {problem}")
    try:
        agree([("rank file", "found" if states is not None else missing)], "")
        complete = states is not None
    except _core.InvalidArgument:
        complete = False
    if not complete:
        msg = (f"{where}: no gradzip state of world size {world} on some rank"
               f"{'' if states is not None else ' (this one: ' + missing + ')'}; nothing is "
               "restored, every rank continues with fresh error feedback")
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        logger.warning("%s", msg)
        return False
    problem = "none"
    for obj, state in zip(objects, states):  # type: ignore[arg-type]
        try:
            obj.load_state_dict(state)  # checks every field
        except (ValueError, TypeError, KeyError, AttributeError) as e:  # InvalidArgument is a ValueError
            problem = f"{_kind(obj)}: {type(e).__name__}: {re.sub(r'^[[][^]]*[]] ', '', str(e))}"
            break
    agree([("restore", problem)], f"{where}: a rank could not restore its file:")
    if problem != "none":
        raise _core.InvalidArgument(f"{where}: {problem}")
    for obj, state in zip(objects, states):  # type: ignore[arg-type]
        if hasattr(obj, "_resume_pending"):
            obj._resume_pending = state  # restored again at the object's next step
    return True


class Stateful:
    """gradzip's per-rank state for ``torch.distributed.checkpoint`` (DCP)::

        dcp.save({"model": ..., "gradzip": checkpoint.Stateful(state)}, checkpoint_id=folder)
        dcp.load({"model": ..., "gradzip": checkpoint.Stateful(state)}, checkpoint_id=folder)

    Its state_dict is one entry per rank, keyed ``rank<r>-of-<P>`` (the
    same body as a rank file, as bytes), so DCP keeps every rank's instead of
    deduplicating them into one. The load is :func:`load`'s, agreed and
    checked the same way (``torch.load(weights_only=True)`` of the bytes).
    A checkpoint of another world size lacks this rank's key: DCP raises,
    unless the load planner allows a partial load
    (``DefaultLoadPlanner(allow_partial_load=True)``), and then every rank
    warns and continues with fresh error feedback.
    """

    def __init__(self, *objects: Any, group: Any = None) -> None:
        if not objects:
            raise ValueError("Stateful needs at least one gradzip object")
        self.objects, self.group = objects, group
        self._template: Optional[bytes] = None  # what state_dict() last returned

    def _key(self) -> str:
        rank, world = _where(self.group)
        return f"rank{rank}-of-{world}"

    def state_dict(self) -> Dict[str, Any]:
        buf = io.BytesIO()
        torch.save(_body(self.objects, *_where(self.group)), buf)
        self._template = buf.getvalue()
        return {self._key(): self._template}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        key, rank_world = self._key(), _where(self.group)
        value = state_dict.get(key) if isinstance(state_dict, dict) else None

        def read() -> Optional[List[Any]]:
            # DCP leaves the template's own object where the checkpoint lacks the key (a partial load): this
            # very state's body, which is not a restore.
            if value is None or value is self._template:
                return None
            if not isinstance(value, bytes):
                raise ValueError(f"the entry {key} is {type(value).__name__}, not bytes")
            return _read(io.BytesIO(value), key, *rank_world, self.objects)

        _restore(read, self.objects, self.group, "gradzip.torch.checkpoint.Stateful", "missing")
