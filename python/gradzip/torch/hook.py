"""A PyTorch DDP communication hook that compresses gradients with gradzip."""

# No "from __future__ import annotations": DDP's register_comm_hook inspects
# the hook's annotations and needs the real dist.GradBucket / Future types.
import logging
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from ..codec import Codec, ErrorFeedback
from . import _agreement, _layout

__all__ = ["CompressionState", "compression_hook"]

logger = logging.getLogger(__name__)

_TRANSPORTS = ("torch", "gradzip")
_STATE_VERSION = 1


def _align4(x: int) -> int:
    # Payloads start 4-byte aligned inside a message: the decoders need it.
    return (x + 3) & ~3


class CompressionState:
    """State of :func:`compression_hook` for one DDP model.

    Holds the codec, the error-feedback residuals of the model's gradient
    buckets, the step counter and byte counts. Build one per DDP model (on
    every rank, with the same arguments) and register it with the hook::

        state = CompressionState(codec="onebit", warmup_steps=10)
        ddp_model.register_comm_hook(state, compression_hook)

    Args:
        codec: a gradzip codec spec (``"onebit"``, ``"topk:density=0.01"``,
            ``"fp16"``, ... with ``ef=on|off``; see :class:`gradzip.Codec`) or a
            :class:`gradzip.Codec`. Default ``"onebit"`` (1-bit SGD with error
            feedback, blocks of 512). ``"none"`` sends fp32 with a plain
            allreduce, exactly like DDP without a hook.
        process_group: the group to reduce over; None means the default (WORLD).
        warmup_steps: steps that run a plain fp32 allreduce before compression
            starts, like PowerSGD's ``start_powerSGD_iter``. Default 0.
        transport: ``"torch"`` (default): the compressed payloads travel through
            ``process_group`` (an all_gather, so gloo on CPU and NCCL on GPU work
            as they are). ``"gradzip"``: gradzip's own :class:`gradzip.Communicator`
            and its compressed allreduce algorithms (two-phase scatter-reduce for
            dense codecs), needs a build with gradzip's transports.
        algorithm: with ``transport="gradzip"``: ``"auto"``, ``"allgather"`` or
            ``"scatter_reduce"``. The torch transport always all-gathers.
        communicator: with ``transport="gradzip"``, the communicator to use; by
            default one is made for this state from torch's rendezvous store.

    Raises:
        ValueError: an unknown codec spec, transport or algorithm, a negative
            warmup, or arguments that do not go together (the message says why).

    Every rank ends each step with bit-identical gradients: all ranks decode
    the same payloads in rank order. The state's :meth:`state_dict` (one per
    rank: residuals differ between ranks) belongs in training checkpoints.
    """

    __slots__ = (
        # Configuration, fixed at construction.
        "process_group",
        "codec",
        "warmup_steps",
        "transport",
        "algorithm",
        # Internal state.
        "_world_size",
        "_dense",
        "_tracker",
        "_step",
        "_comm",
        "_worker",
        "_agreed",
        # Statistics (totals since construction or the restored checkpoint).
        "_stats",
    )

    def __init__(
        self,
        codec: Union[str, Codec] = "onebit",
        process_group: Optional[dist.ProcessGroup] = None,
        warmup_steps: int = 0,
        transport: str = "torch",
        algorithm: str = "auto",
        communicator: Any = None,
    ) -> None:
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if transport not in _TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; valid: {', '.join(_TRANSPORTS)}")
        if transport == "torch" and algorithm not in ("auto", "allgather"):
            raise ValueError(
                f"algorithm={algorithm!r} needs transport='gradzip': the torch transport exchanges "
                f"payloads with one all_gather")
        if transport == "torch" and communicator is not None:
            raise ValueError("a communicator is used only with transport='gradzip'")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call init_process_group first")

        self.codec = codec if isinstance(codec, Codec) else Codec(codec)
        self.process_group = process_group
        self.warmup_steps = warmup_steps
        self.transport = transport
        self.algorithm = algorithm
        self._world_size = dist.get_world_size(process_group)
        self._dense = self.codec.name == "none" and transport == "torch"
        self._tracker = _layout.Tracker()
        self._step = 0
        self._comm = None
        self._worker = None
        self._agreed = False
        self._stats = _new_stats()
        if transport == "gradzip":
            from . import _gradzip_transport

            _gradzip_transport.setup(self, communicator)
        logger.info(
            "gradzip DDP hook: codec=%s transport=%s warmup_steps=%d world_size=%d",
            self.codec.spec, transport, warmup_steps, self._world_size)

    @property
    def step(self) -> int:
        """Steps completed (the hook saw the last bucket of a backward pass)."""
        return self._step

    def compression_stats(self) -> Dict[str, float]:
        """Bytes per step, averaged over the steps so far, for this rank.

        Returns a dict with:
            steps: steps counted.
            dense_bytes_per_step: the fp32 gradient (4 bytes per element).
            payload_bytes_per_step: what the codec produced (headers included;
                the fp32 gradient on warm-up and ``none`` steps).
            wire_bytes_per_step: what this rank puts on the network: for the
                torch transport modelled as a ring (allreduce 2(P-1)/P x message,
                all_gather (P-1) x message, message = payloads + alignment);
                for the gradzip transport as counted by the communicator.
            ratio: dense / payload bytes.
            wire_ratio: what a plain fp32 ring allreduce would send / wire bytes.
        """
        s = self._stats
        steps = max(s["steps"], 1)
        p = self._world_size
        fp32_wire = s["dense_bytes"] * 2 * (p - 1) / p
        return {
            "steps": s["steps"],
            "dense_bytes_per_step": s["dense_bytes"] / steps,
            "payload_bytes_per_step": s["payload_bytes"] / steps,
            "wire_bytes_per_step": s["wire_bytes"] / steps,
            "ratio": s["dense_bytes"] / s["payload_bytes"] if s["payload_bytes"] else float("nan"),
            "wire_ratio": fp32_wire / s["wire_bytes"] if s["wire_bytes"] else float("nan"),
        }

    def state_dict(self) -> Dict[str, Any]:
        """This rank's hook state for a checkpoint: step, byte counts and the
        residuals (as tensors where they live), keyed by parameter. Save one per
        rank (the residuals differ between ranks)."""
        segments = []
        for seg in self._tracker.segments():
            segments.append({"keys": list(seg.keys), "numels": list(seg.numels), "ef": seg.ef.state_dict()})
        return {
            "version": _STATE_VERSION,
            "codec": self.codec.spec,
            "transport": self.transport,
            "world_size": self._world_size,
            "step": self._step,
            "shapes": [list(s) for s in self._tracker.shapes()],
            "segments": segments,
            "stats": dict(self._stats),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output, saved on this rank. Training then
        continues bit-identically, provided DDP buckets the gradients as the
        saved run did (see docs/python.md, "Checkpoints").

        Raises:
            ValueError: the state was saved with another codec, transport or
                world size, or for another model.
        """
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a gradzip CompressionState state_dict (version {_STATE_VERSION})")
        for key, mine in (("codec", self.codec.spec), ("transport", self.transport),
                          ("world_size", self._world_size)):
            if state.get(key) != mine:
                raise ValueError(f"the state_dict was saved with {key}={state.get(key)!r}, this state has {mine!r}")
        step = state.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"the state_dict's step must be an integer >= 0, got {step!r}")
        segments = []
        for entry in state["segments"]:
            ef = self._new_ef()  # its load_state_dict checks the residuals (finite, checksummed bytes)
            ef.load_state_dict(entry["ef"])
            segments.append(_layout.Segment(entry["keys"], entry["numels"], ef))
        self._tracker.restore([tuple(s) for s in state["shapes"]], segments)
        self._step = int(state["step"])
        self._agreed = False  # the ranks check again that all of them restored
        self._stats = _new_stats()
        self._stats.update(state.get("stats", {}))

    # -- internals ------------------------------------------------------------

    def _new_ef(self) -> Any:
        if self.transport == "gradzip":
            from .. import AllreduceState

            return AllreduceState()
        return ErrorFeedback()

    def _make_ef(self, n: int, sources: List[_layout.Source]) -> Any:
        """Error feedback of a new segment, assembled from where its parameters' residuals were."""
        ef = self._new_ef()
        held = [(src, off, m) for src, off, m in sources if src is not None and src.bound]
        if not held or not self.codec.error_feedback:
            return ef
        if self.transport == "gradzip":
            # Its residuals (worker and server) live in C++ per bucket and cannot
            # be split by parameter. Expected once: after DDP's provisional first step.
            log = logger.info if self._step <= 1 else logger.warning
            log("gradzip DDP hook: DDP changed its buckets; the gradzip transport's error feedback of "
                "the affected buckets restarts from zero")
            return ef
        like = next(src.residual for src, _, _ in held if src.residual is not None)
        residual = torch.zeros(n, dtype=torch.float32, device=like.device)
        pos = 0
        for src, off, m in sources:
            if src is not None and src.bound and src.residual is not None:
                residual[pos:pos + m].copy_(src.residual.reshape(-1)[off:off + m])
            pos += m
        ef.load_state_dict({"version": 1, "codec": self.codec.spec, "n": n, "residual": residual})
        return ef

    def _count(self, dense: int, payload: int, wire: float) -> None:
        s = self._stats
        s["dense_bytes"] += dense
        s["payload_bytes"] += payload
        s["wire_bytes"] += wire

    def __repr__(self) -> str:
        return (f"CompressionState(codec='{self.codec.spec}', transport='{self.transport}', "
                f"warmup_steps={self.warmup_steps}, step={self._step})")


def _new_stats() -> Dict[str, Any]:
    return {"steps": 0, "dense_bytes": 0, "payload_bytes": 0, "wire_bytes": 0.0}


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket's gradients across ranks,
    sending gradzip-compressed payloads.

    0. On the first call only, before any branch: check that every rank's
       hook has the same settings (codec, warm-up, step, transport, bucket
       layout; see ``_agreement.py``). A mismatch raises
       :class:`gradzip.InvalidArgument` on every rank instead of a hang.
    1. Before ``state.warmup_steps`` (and always for the ``none`` codec):
       divide by the world size and allreduce the fp32 bucket, as DDP does.
    2. Otherwise encode the bucket with error feedback (one residual per
       bucket, following its parameters when DDP rebuilds its buckets), and
       issue the exchange from here, in DDP's bucket order: torch transport:
       one all_gather of the ranks' payloads; gradzip transport: the
       communicator's compressed allreduce, on a worker thread that runs the
       buckets in order.
    3. Once the bytes arrived, decode every rank's payload in rank order into
       ``bucket.buffer()`` (in place) and divide by the world size, so every
       rank gets bit-identical gradients. The callback only decodes: it never
       starts a collective.

    Args:
        state: the model's :class:`CompressionState`.
        bucket: the bucket DDP hands in.

    Returns:
        A future holding the averaged ``bucket.buffer()``.

    Example::
        >>> state = CompressionState(codec="topk:density=0.01")
        >>> ddp_model.register_comm_hook(state, compression_hook)
    """
    buffer = bucket.buffer()
    if buffer.dtype != torch.float32:
        raise ValueError(
            f"gradzip compresses float32 gradients; this bucket is {buffer.dtype} (keep the parameters "
            f"in float32, e.g. with autocast, or use torch's fp16/bf16 hooks)")
    if not state._agreed:  # first call: every rank checks the others' settings before taking a branch
        _agreement.check(state, bucket)
        state._agreed = True
    plan = state._tracker.plan(bucket.index(), bucket.parameters(), buffer.numel(), state._make_ef)
    if state._dense or state._step < state.warmup_steps:
        fut = _allreduce_dense(state, buffer)
    elif state.transport == "torch":
        fut = _exchange_torch(state, plan, buffer)
    else:
        from . import _gradzip_transport

        fut = _gradzip_transport.exchange(state, plan, buffer, bucket.is_last())
    if bucket.is_last():
        state._tracker.end_step()
        state._step += 1
        state._stats["steps"] += 1
    return fut


def _allreduce_dense(state: CompressionState, buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """What DDP does without a hook: scale by 1/P (the same multiply), allreduce."""
    p = state._world_size
    nbytes = buffer.numel() * 4
    state._count(nbytes, nbytes, nbytes * 2 * (p - 1) / p)
    buffer.mul_(1.0 / p)
    fut = dist.all_reduce(buffer, group=state.process_group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _segment_inputs(plan: _layout.Plan, buffer: torch.Tensor) -> List[torch.Tensor]:
    """Each segment's gradient: the bucket itself, or its parameters gathered into scratch."""
    inputs = []
    for j, (seg, runs) in enumerate(plan.parts):
        if runs is None:
            inputs.append(buffer)
            continue
        key = f"scratch{j}"
        x = plan.cache.get(key)
        if x is None or x.device != buffer.device:
            x = plan.cache[key] = torch.empty(seg.n, dtype=torch.float32, device=buffer.device)
        for bo, so, m in runs:
            x[so:so + m].copy_(buffer[bo:bo + m])
        inputs.append(x)
    return inputs


def _message_buffers(plan: _layout.Plan, codec: Codec, p: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
    """Per-plan buffers, reused every step: this rank's message (payload slots
    at 4-byte aligned offsets) and the all_gather output (p messages)."""
    caps = [_align4(codec.max_payload_bytes(seg.n)) for seg, _ in plan.parts]
    cached = plan.cache.get("message")
    if cached is None or cached[0].device != device:
        total = sum(caps)
        # Zeros: alignment padding goes on the wire and should carry nothing.
        message = torch.zeros(total, dtype=torch.uint8, device=device)
        gathered = torch.empty(p * total, dtype=torch.uint8, device=device)
        cached = plan.cache["message"] = (message, gathered, caps)
    return cached


def _exchange_torch(state: CompressionState, plan: _layout.Plan,
                    buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    codec, p, group = state.codec, state._world_size, state.process_group
    inputs = _segment_inputs(plan, buffer)
    message, gathered, caps = _message_buffers(plan, codec, p, buffer.device)

    # Encode each segment into its slot of the message.
    sizes, off = [], 0
    for (seg, _), x, cap in zip(plan.parts, inputs, caps):
        payload = codec.encode(x, seg.ef, out=message[off:off + cap])
        sizes.append(payload.numel())
        off += cap

    if codec.fixed_size:
        slots = caps
        sizes_by_rank = [sizes] * p
    else:
        # Sizes vary (sampled top-k): agree on them, then pack the slots as
        # tightly as the largest rank allows.
        mine = torch.tensor(sizes, dtype=torch.int64, device=buffer.device)
        everyone = torch.empty(p * len(sizes), dtype=torch.int64, device=buffer.device)
        dist.all_gather_into_tensor(everyone, mine, group=group)
        sizes_by_rank = everyone.view(p, len(sizes)).tolist()
        slots = [_align4(max(col)) for col in zip(*sizes_by_rank)]
        src, dst = 0, 0
        for cap, slot, size in zip(caps, slots, sizes):
            if dst != src:
                message[dst:dst + size].copy_(message[src:src + size].clone())
            message[dst + size:dst + slot].zero_()
            src += cap
            dst += slot
    length = sum(slots)
    out = gathered[:p * length]
    work = dist.all_gather_into_tensor(out, message[:length], group=group, async_op=True)

    dense = buffer.numel() * 4
    state._count(dense, sum(sizes), (p - 1) * length)

    def decode(fut: torch.futures.Future) -> torch.Tensor:
        fut.value()  # raises if the all_gather failed
        starts = [0]
        for s in slots[:-1]:
            starts.append(starts[-1] + s)
        scale = 1.0 / p
        for j, ((seg, runs), x) in enumerate(zip(plan.parts, inputs)):
            x.zero_()
            for r in range(p):
                begin = r * length + starts[j]
                codec.decode_accumulate(out[begin:begin + sizes_by_rank[r][j]], x)
            x.mul_(scale)
            if runs is not None:
                for bo, so, m in runs:
                    buffer[bo:bo + m].copy_(x[so:so + m])
        return buffer

    return work.get_future().then(decode)
