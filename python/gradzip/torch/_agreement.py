"""The DDP hook's agreement: on its first call, before it takes any branch,
the ranks compare what each hook was built with.

Ranks whose hooks differ would not fail cleanly on their own: a rank still in
warm-up runs an allreduce while the others run an all_gather (both hang until
the process group's timeout), and payloads of different codecs or sizes
abort inside the backend. So the first call compares, across the process
group's ranks: the codec spec (error feedback included), warm-up steps, step
(a checkpoint restored on some ranks only), transport, algorithm, the
gradient dtype, and the layout of the bucket at hand. A mismatch raises :class:`gradzip.InvalidArgument`
on every rank, naming each differing setting and which ranks hold which
value; a rank that never calls the hook makes the others raise
:class:`gradzip.IoError` within ``GRADZIP_TIMEOUT_S``.

How: through torch's rendezvous store, the one every process group of the
job shares (``from_torch`` meets there too). Every rank calls it
identically, whatever its settings; each waits for the others' records with
the timeout, so it is bounded on every backend (a collective on an NCCL
group could not be bounded from here) and touches no CUDA stream. Each rank
compares its own settings, as it was built, with the others' records, and
the last rank to read a round deletes it.
"""

import datetime
import hashlib
import itertools
import json
from typing import Any, Dict, List, Tuple

import torch.distributed as dist

from .. import _core
from .._core import InvalidArgument, IoError

_rounds: Dict[Tuple[int, ...], "itertools.count[int]"] = {}


def _fields(state: Any, bucket: Any) -> List[Tuple[str, str]]:
    params = bucket.parameters()
    buffer = bucket.buffer()
    shapes = hashlib.sha256(repr([tuple(p.shape) for p in params]).encode()).hexdigest()[:12]
    return [
        ("codec", state.codec.spec),
        ("warmup_steps", str(state.warmup_steps)),
        ("step", str(state.step)),
        ("transport", state.transport),
        ("algorithm", state.algorithm),
        ("dtype", str(buffer.dtype).replace("torch.", "")),
        ("first bucket", f"#{bucket.index()}: {buffer.numel()} x {buffer.dtype} in {len(params)} parameters "
                         f"(shapes {shapes})"),
    ]


def check(state: Any, bucket: Any) -> None:
    """Compares this rank's hook settings with every other rank's (collective
    over the state's process group). Raises InvalidArgument on a mismatch,
    IoError when a rank does not take part within GRADZIP_TIMEOUT_S."""
    group = state.process_group
    ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
    me, size = dist.get_rank(group), len(ranks)
    mine = _fields(state, bucket)
    if size > 1:
        everyone = _exchange(mine, ranks, me, size)
        report = _core._describe_disagreement(everyone)
        if report:
            raise InvalidArgument(
                "gradzip DDP hook: the ranks' hooks differ (build the model and CompressionState the same way "
                "on every rank, and restore the hook's state_dict on all of them or none):" + report)


def _exchange(mine: List[Tuple[str, str]], ranks: Tuple[int, ...], me: int, size: int) -> List[List[Tuple[str, str]]]:
    from torch.distributed import distributed_c10d as c10d

    store = c10d._get_default_store()
    timeout = _core._default_timeout_s()
    counter = _rounds.setdefault(ranks, itertools.count())
    prefix = f"gradzip/hook-agree/{'.'.join(map(str, ranks))}/{next(counter)}/"
    store.set(prefix + str(me), json.dumps(mine))
    others = [prefix + str(r) for r in range(size) if r != me]
    try:
        store.wait(others, datetime.timedelta(seconds=timeout))
    except Exception as e:  # torch raises its own store errors on timeout
        missing = [k.rsplit("/", 1)[1] for k in others if not store.check([k])]
        raise IoError(
            f"rank {me}: the DDP hook's first call did not meet ranks {', '.join(missing) or '?'} within "
            f"{timeout:g} s (GRADZIP_TIMEOUT_S): they did not call the hook (a model without it, or a rank "
            f"that died or hangs): {e}") from None
    everyone: List[List[Tuple[str, str]]] = []
    for r in range(size):
        if r == me:
            everyone.append(mine)  # this rank's own settings, never the store's copy
            continue
        try:
            record = json.loads(store.get(prefix + str(r)))
            everyone.append([(str(k), str(v)) for k, v in record])
        except (ValueError, TypeError) as e:
            raise IoError(f"rank {me}: the DDP hook settings rank {r} published are malformed: {e}") from None
    if store.add(prefix + "read", 1) == size and hasattr(store, "delete_key"):
        for key in [prefix + str(r) for r in range(size)] + [prefix + "read"]:
            store.delete_key(key)
    return everyone
