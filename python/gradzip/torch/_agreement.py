"""The DDP hook's agreement: on its first call, before it takes any branch,
the ranks compare what each hook was built with.

Ranks whose hooks differ would not fail cleanly on their own: a rank still in
warm-up runs an allreduce while the others run an all_gather (both hang until
the process group's timeout), and payloads of different codecs or sizes
abort inside the backend. So the first call compares, across the process
group's ranks: the codec spec (error feedback included), whether an
adaptive optimizer was seen (compared again when it is decided), warm-up steps, step
(a checkpoint restored on some ranks only), transport, algorithm, the
gradient dtype, and the layout of the bucket at hand. A mismatch raises :class:`gradzip.InvalidArgument`
on every rank, naming each differing setting and which ranks hold which
value; a rank that never calls the hook makes the others raise
:class:`gradzip.IoError` within ``GRADZIP_TIMEOUT_S``.

How: gradzip's agreement (comm/engine/agreement.h) through torch's rendezvous
store, the one every process group of the job shares (``from_torch`` meets
there too). Every rank calls it identically, whatever its settings; each
waits for the others' records with the timeout, so it is bounded on every
backend (a collective on an NCCL group could not be bounded from here) and
touches no CUDA stream. Each rank compares its own settings, as it was
built, with the others' records. The records are sealed like every value
gradzip puts in a store (sealed_store.h: tagged with the job's key), so a
stranger on torch's store, which has no authentication, can neither invent a
mismatch nor hide one; and no rank raises before every rank has read the
round, so each rank reports the mismatch itself rather than a lost store.
"""

import hashlib
import itertools
import re
from typing import Any, Dict, List, Optional, Tuple

import torch.distributed as dist

from .. import _core

_rounds: Dict[Tuple[str, Tuple[int, ...]], "itertools.count[int]"] = {}


def _fields(state: Any, bucket: Any) -> List[Tuple[str, str]]:
    params = bucket.parameters()
    buffer = bucket.buffer()
    shapes = hashlib.sha256(repr([tuple(p.shape) for p in params]).encode()).hexdigest()[:12]
    return [
        ("codec", state.codec.spec),
        ("adaptive optimizer", "not decided yet" if state._adaptive is None else str(state._adaptive)),
        ("precondition", f"{state.precondition}: "
         + {None: "not decided yet", True: "on", False: "off"}[state._precond]),
        ("warmup_steps", str(state.warmup_steps)),
        ("measured warm-up", "off" if state._warm is None else
         f"until {state.warmup_until} x{state.warmup_patience} (max {state.warmup_max}), "
         f"{'running' if state._warm.ended_at is None else f'ended at step {state._warm.ended_at}'}"),
        ("momentum correction", "off" if state._mc is None else f"beta={state._mc.beta}"),
        ("layer filter", f"exact_below={state.exact_below}: "
         + ("off" if state._exact is None else f"parameters of <= 1 dimension or < {state._exact} elements")),
        ("step", str(state.step)),
        ("transport", state.transport),
        ("algorithm", state.algorithm),
        ("dtype", str(buffer.dtype).replace("torch.", "")),
        ("first bucket", f"#{bucket.index()}: {buffer.numel()} x {buffer.dtype} in {len(params)} parameters "
                         f"(shapes {shapes})"),
        *state._resume.fields(),  # after a start or a restore: whose state each rank restored (_resume.py)
    ]


def check(state: Any, bucket: Any) -> None:
    """Compares this rank's hook settings with every other rank's (collective
    over the state's process group). Raises InvalidArgument on a mismatch,
    IoError when a rank does not take part within GRADZIP_TIMEOUT_S."""
    agree(state.process_group, _fields(state, bucket), "hook", "the DDP hook's agreement (its first call)",
          "gradzip DDP hook: the ranks' hooks differ (build the model and CompressionState the same way on every "
          "rank, and restore the hook's state_dict on all of them or none):")


def agree(group: Any, fields: List[Tuple[str, str]], who: str, round: str, mismatch: str,
          timeout: Optional[float] = None) -> None:
    """gradzip's agreement on `fields` over `group`'s ranks (None: WORLD),
    through torch's store, sealed; `who` names the caller's rounds ("hook",
    "fsdp"), `round` and `mismatch` its messages; `timeout` in seconds (None:
    GRADZIP_TIMEOUT_S). Collective."""
    from torch.distributed import distributed_c10d as c10d

    ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
    if len(ranks) <= 1:
        return
    counter = _rounds.setdefault((who, ranks), itertools.count())
    agree_on_store(c10d._get_default_store(), f"gradzip/{who}-agree/{'.'.join(map(str, ranks))}", next(counter),
                   dist.get_rank(group), len(ranks), fields, timeout, round, mismatch)


def agree_on_store(store: Any, key: str, index: int, rank: int, size: int, fields: List[Tuple[str, str]],
                   timeout: Optional[float], round: str, mismatch: str) -> None:
    """:func:`agree` on a store of the caller's (the backend's, while its group
    is being made and torch's default store may not exist yet): round `index`
    under `key`, `rank` of `size`. Collective."""
    try:
        _core._agree_through_store(store, key, index, rank, size, fields, timeout, round, mismatch)
    except _core.InvalidArgument as e:  # the report, without the C++ file:line it was raised at
        raise _core.InvalidArgument(re.sub(r"^\[[^\]]*\] ", "", str(e))) from None
