"""What every entry point shares about resuming: whose per-rank state a rank
restored, and the one agreement that decides what the ranks do about it.

A gradzip state has two parts. The replicated part (settings, step, the
moments of CompressedAdamW, the warm-up's progress) is the same on every
rank. The per-rank part (error-feedback residuals, a rank's own momentum) is
not: rank r's residual is what rank r's codec has not sent yet.

Trainer, Accelerate and Lightning save one copy of optimizer and callback
state, rank 0's, and load it on every rank. So after such a resume rank 1
holds rank 0's residuals: applying them would send rank 0's unsent gradient
twice and lose rank 1's. Every state_dict therefore says who saved it
(``"saved_by": {"rank", "world_size"}``), and a load classifies itself:

- ``fresh``: nothing restored since the process started;
- ``own``: this rank's own state (same rank, same world size);
- ``foreign``: another rank's or another world size's. The replicated part
  is kept; the per-rank part is dropped at the next step.

At the first step after a start or a load, every rank takes part in one
agreement (sealed, through the rendezvous store, see _agreement.py) on two
fields; the DDP hook adds them to its first-call agreement, so a resume costs
it no extra round, and the other entry points run them as a round of their
own:

1. "restored a checkpoint": whether each rank restored one. Some ranks but
   not others is a checkpoint loaded on some ranks only: their replicated
   parts differ, continuing would be wrong, and every rank raises the same
   InvalidArgument naming which ranks did.
2. "error feedback": whose. All ``own``: training continues
   bit-identically. Anything else (a one-copy checkpointer, a new world
   size): every rank drops its per-rank part, warns once, and continues with
   fresh error feedback, all ranks alike.

The mismatch report is the same on every rank, so each rank reads from it
alike whether only field 2 differs (drop) or anything else (raise).

Per-rank side files (gradzip.torch.checkpoint, which the stacks'
integrations use) restore ``own`` state on every rank: each rank writes and
reads only its own file, one residual per rank however many ranks there are.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import _core

logger = logging.getLogger("gradzip.torch")

FRESH, OWN, FOREIGN, UNBOUND = "fresh", "own", "foreign", "unbound"

Agree = Callable[[List[Tuple[str, str]], str, str], None]  # (fields, round, mismatch) -> raises on mismatch


def saved_by(rank: Optional[int], world_size: Optional[int]) -> Optional[Dict[str, int]]:
    """The stamp a state_dict carries: who saved it (None before binding)."""
    if rank is None or not world_size:
        return None
    return {"rank": int(rank), "world_size": int(world_size)}


def checked_stamp(state: Dict[str, Any]) -> Optional[Tuple[int, int]]:
    """(rank, world_size) of a state_dict's stamp, None when it has none
    (saved before binding, or by a release without stamps). Raises
    ValueError for a stamp that is not two integers in range."""
    stamp = state.get("saved_by")
    if stamp is None:
        return None
    if not isinstance(stamp, dict):
        raise ValueError(f"the state_dict's saved_by must be a dict of rank and world_size, got {stamp!r}")
    rank, world = stamp.get("rank"), stamp.get("world_size")
    for name, v in (("rank", rank), ("world_size", world)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"the state_dict's saved_by {name} must be an integer, got {v!r}")
    if not (world >= 1 and 0 <= rank < world):
        raise ValueError(f"the state_dict's saved_by is out of range: rank {rank} of {world}")
    return rank, world


class Resume:
    """One entry point's resume status on this rank (see the module doc)."""

    __slots__ = ("status", "source", "settled", "warned")

    def __init__(self) -> None:
        self.status = FRESH
        # (rank, world) of the restored state; rank None: an unstamped state (an older release) of that world
        self.source: Optional[Tuple[Optional[int], int]] = None
        self.settled = False  # the next step agrees first
        self.warned = False

    def loaded(self, stamp: Optional[Tuple[int, int]], saved_world: Optional[int], rank: Optional[int],
               world: Optional[int]) -> None:
        """After a load_state_dict of a state stamped `stamp` (None: unstamped,
        then `saved_world` if it names one). `rank`/`world` None: not bound
        yet; the state is classified by :meth:`bind` at the next step."""
        self.source = stamp if stamp is not None else (None, saved_world) if saved_world else None
        self.status = UNBOUND
        self.settled = False
        if rank is not None and world:
            self.bind(rank, world)

    def bind(self, rank: int, world: int) -> None:
        """The rank and world size are known now: classify a load made before."""
        if self.status != UNBOUND:
            return
        if self.source is None:
            self.status = OWN
        elif self.source[0] is None:  # unstamped: its world size is all it says
            self.status = OWN if self.source[1] == world else FOREIGN
        else:
            self.status = OWN if self.source == (rank, world) else FOREIGN

    def describe(self) -> str:
        if self.status == FOREIGN and self.source is not None:
            return (f"world size {self.source[1]}'s" if self.source[0] is None
                    else f"rank {self.source[0]} of {self.source[1]}'s")
        return self.status

    FIELDS = ("restored a checkpoint", "error feedback")

    def fields(self) -> List[Tuple[str, str]]:
        """What this rank contributes to its entry point's first agreement
        after a start or a load (none once settled)."""
        if self.settled:
            return []
        return [(self.FIELDS[0], "no" if self.status == FRESH else "yes"), (self.FIELDS[1], self.describe())]

    def judge(self, error: Optional[BaseException], who: str) -> bool:
        """After that agreement (`error`: its InvalidArgument, the same on
        every rank, or None): True when every rank must drop its per-rank
        state (each warns once). Re-raises `error` when anything but whose
        error feedback differs: some ranks restored and others did not, or
        the entry point's other settings."""
        if self.settled:
            if error is not None:
                raise error
            return False
        if error is not None and differing(str(error)) != {self.FIELDS[1]}:
            raise error
        self.settled = True
        drop = error is not None or self.status == FOREIGN
        if drop:
            self.warn(who, "" if error is None else _report(str(error)))
        if self.status != FRESH:
            self.status = OWN  # from here on: this rank's own state
        return drop

    def agreed(self, run: Callable[[], None], who: str) -> bool:
        """Runs `run`, an agreement that holds :meth:`fields` among its own
        (collective over the entry point's ranks), then :meth:`judge` on its
        outcome: True when every rank must drop its per-rank state."""
        try:
            run()
        except _core.InvalidArgument as e:
            return self.judge(e, who)
        return self.judge(None, who)

    def settle(self, agree: Agree, who: str) -> bool:
        """The agreement of the first step after a start or a load, in a
        round of its own (for entry points that run none at that step)."""
        if self.settled:
            return False
        return self.agreed(lambda: agree(
            self.fields(), f"the {who} resume agreement",
            f"gradzip {who}: the ranks restored different checkpoints, or some ranks none (their steps, moments "
            "and settings now differ; restore on every rank or none):"), who)

    def warn(self, who: str, report: str) -> None:
        """The warning of a drop, once per state: what this rank restored, and
        `report` (the agreement's lines, which name every rank's)."""
        if self.warned:
            return
        self.warned = True
        source = f" (this rank restored {self.describe()})" if self.status == FOREIGN else ""
        msg = (f"gradzip {who}: the restored checkpoint does not hold every rank's own error feedback{source}; "
               "every rank continues with fresh error feedback. A checkpointer that saves one copy (Trainer, "
               "Accelerate, Lightning) needs gradzip's per-rank files: gradzip.torch.checkpoint, or the "
               "stack's integration in gradzip.integrations. " + report.strip())
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        logger.warning("%s", msg)


def differing(report: str) -> set:
    """The field names an agreement's mismatch report lists (one per line,
    "  name: rank 0 'a'; rank 1 'b'", describe_disagreement in
    comm/engine/agreement.h). The report is the same on every rank."""
    return {m.group(1) for m in re.finditer(r"^  ([^:\n]+): rank", report, re.M)}


def _report(report: str) -> str:
    """The report's field lines, without the round's own headline."""
    return "\n".join(line for line in report.splitlines() if line.startswith("  "))
