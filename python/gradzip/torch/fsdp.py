"""Compressed gradient reduce-scatter for FSDP2 (``fully_shard``) models.

FSDP2 reduces each parameter group's gradients with one reduce-scatter per
backward: every rank hands in the concatenation of all ranks' padded
gradient shards (world-size equal chunks) and keeps its own shard of the
sum or average. :func:`register` replaces that collective, through torch's
``FSDPModule.set_custom_reduce_scatter``, with gradzip's compressed
reduce-scatter (``Communicator.reduce_scatter``; docs/comm.md): each rank's
chunks are encoded with this rank's error feedback and sent to their owners,
which sum the payloads. It runs over FSDP's own process group (gloo on CPU,
NCCL on GPU), in FSDP's order, on the caller's thread and stream.

Example::

    from torch.distributed.fsdp import fully_shard
    from gradzip.torch import fsdp as gz_fsdp

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    state = gz_fsdp.register(model, codec="onebit")
    ...                                   # train as usual
    torch.save({"model": ..., "optim": ..., "gradzip": state.state_dict()}, path)

One :class:`FSDPCompressionState` holds the error feedback of every FSDP
parameter group of the model, keyed by the FSDP module's name, so a restored
state continues bit-identically (docs/python.md, "FSDP2").
"""

import logging
from typing import Any, Dict, Optional, Sequence, Union

import torch
import torch.distributed as dist
# The interface set_custom_reduce_scatter takes; torch exports it nowhere public.
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from .. import InvalidArgument
from ..codec import Codec
from . import _agreement, _torch_transport

__all__ = ["CompressedReduceScatter", "FSDPCompressionState", "register"]

logger = logging.getLogger(__name__)

_STATE_VERSION = 1
# Gradients FSDP may reduce in: float32 natively; 16-bit ones are reduced in
# float32 (an exact upcast) and cast back, so their error feedback is fp32.
_UPCAST = (torch.bfloat16, torch.float16)


class FSDPCompressionState:
    """The compressed reduce-scatter's state for one FSDP model.

    Holds the codec, the error-feedback residual of each FSDP parameter group
    (this rank's contribution: its whole reduce-scatter input), the
    communicators (one per process group FSDP reduces over, made at its first
    reduce-scatter) and byte counts. Build one per model, on every rank with
    the same codec, and :func:`register` it; it can be built (and pickled)
    before ``init_process_group``.

    Args:
        codec: a gradzip codec spec (``"onebit"``, ``"topk:density=0.01"``,
            ``"fp16"``, ``"none"``, ... with ``ef=on|off``) or a
            :class:`gradzip.Codec`. ``"none"`` sends fp32 and gives the sum in
            rank order: torch's uncompressed reduce-scatter, bit for bit on
            two ranks.
        timeout: seconds for each reduce-scatter's waits (default
            ``GRADZIP_TIMEOUT_S``, 60).

    Gradient dtypes: float32 is reduced as it is. bfloat16 and float16
    (``MixedPrecisionPolicy(reduce_dtype=...)``) are upcast to float32 (exact),
    reduced, and the shard cast back; anything else raises ValueError.
    Reduce ops: sum, average, and FSDP's ``PREMUL_SUM(f)`` (gradient divide
    factors), computed as f x the sum.
    """

    __slots__ = ("codec", "timeout", "_efs", "_comms", "_stats", "_world_size", "_agreed_ops")

    def __init__(self, codec: Union[str, Codec] = "onebit", timeout: Optional[float] = None) -> None:
        self.codec = codec if isinstance(codec, Codec) else Codec(codec)
        self.timeout = timeout
        self._efs: Dict[str, Any] = {}  # FSDP module name -> gradzip.ErrorFeedback
        self._comms: Dict[int, Any] = {}  # id(process group) -> (group, Communicator)
        self._world_size: Optional[int] = None
        self._agreed_ops: Dict[str, Any] = {}  # FSDP module name -> (op, factor) the ranks agreed on
        self._stats = _new_stats()

    def compression_stats(self) -> Dict[str, float]:
        """This rank's reduce-scatter traffic since construction (or the restored
        checkpoint's counts): ``calls``; ``dense_bytes``: what torch's
        uncompressed reduce-scatter of the same tensors sends from this rank
        ((P-1)/P of the input, in its dtype); ``wire_bytes``: what gradzip
        sent; ``wire_ratio``: dense / wire."""
        s = dict(self._stats)
        s["wire_ratio"] = s["dense_bytes"] / s["wire_bytes"] if s["wire_bytes"] else float("nan")
        return s

    def state_dict(self) -> Dict[str, Any]:
        """This rank's state for a checkpoint (residuals differ between ranks:
        save one per rank): codec, world size, each parameter group's residual
        (serialised, checksummed bytes) and the byte counts."""
        return {
            "version": _STATE_VERSION,
            "codec": self.codec.spec,
            "world_size": self._world_size,
            "groups": {name: ef.state_dict() for name, ef in self._efs.items()},
            "stats": dict(self._stats),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output, saved on this rank; the next
        reduce-scatters continue bit-identically. Each residual is checked
        (checksum, finite values) here, and against its call's layout (size,
        rank, world size) at its first reduce-scatter.

        Raises:
            ValueError: not such a state_dict, or saved with another codec.
        """
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a gradzip FSDPCompressionState state_dict (version {_STATE_VERSION})")
        if state.get("codec") != self.codec.spec:
            raise ValueError(f"the state_dict was saved with codec={state.get('codec')!r}, this state has "
                             f"{self.codec.spec!r}")
        from .. import ErrorFeedback

        groups, world, stats = state.get("groups"), state.get("world_size"), state.get("stats", {})
        if not isinstance(groups, dict) or any(not isinstance(k, str) for k in groups):
            raise ValueError("the state_dict's 'groups' must map FSDP module names to error feedback state_dicts")
        if world is not None and (not isinstance(world, int) or isinstance(world, bool) or world < 1):
            raise ValueError(f"the state_dict's world_size must be a positive integer, got {world!r}")
        if not isinstance(stats, dict) or any(k not in _new_stats() or not isinstance(v, (int, float))
                                              for k, v in stats.items()):
            raise ValueError(f"the state_dict's stats must be a dict of {', '.join(_new_stats())}")
        efs = {}
        for name, saved in groups.items():
            ef = ErrorFeedback()
            ef.load_state_dict(saved)  # InvalidArgument (a ValueError) when malformed
            efs[name] = ef
        self._efs = efs
        self._world_size = world
        self._stats = _new_stats()
        self._stats.update(stats)

    def __getstate__(self) -> Dict[str, Any]:
        return {"codec": self.codec.spec, "timeout": self.timeout, "state": self.state_dict()}

    def __setstate__(self, d: Dict[str, Any]) -> None:
        self.__init__(codec=d["codec"], timeout=d["timeout"])  # type: ignore[misc]
        self.load_state_dict(d["state"])

    def __repr__(self) -> str:
        return f"FSDPCompressionState(codec='{self.codec.spec}', groups={len(self._efs)})"

    # -- the collective --------------------------------------------------------

    def reduce_scatter(self, name: str, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup,
                       op: Any) -> None:
        """FSDP parameter group `name`'s reduce-scatter: output = this rank's
        shard of op over ranks of input (world-size equal chunks)."""
        kind, factor = _parse_op(op)
        if input.dtype != torch.float32 and input.dtype not in _UPCAST:
            raise ValueError(f"gradzip's FSDP reduce-scatter takes float32, bfloat16 or float16 gradients; this "
                             f"group ({name or 'root'}) reduces {input.dtype}")
        if output.dtype != input.dtype:
            raise ValueError(f"reduce-scatter output is {output.dtype}, input {input.dtype}")
        comm = self._communicator(group)
        if self._agreed_ops.get(name) != (kind, factor):
            # The factor is applied here, after the C++ collective (which
            # agrees on the rest): the ranks compare it at the group's first
            # reduce-scatter, and again whenever it changes.
            _agreement.agree(group, [("FSDP module", name or "(root)"), ("reduce op", kind),
                                     ("gradient divide factor", "none" if factor is None else repr(factor))],
                             "fsdp", "the FSDP reduce-scatter's agreement",
                             "gradzip FSDP reduce-scatter: the ranks reduce differently (every rank must use the "
                             "same reduce op and gradient divide factor):", self.timeout)
            self._agreed_ops[name] = (kind, factor)
        n = input.numel()
        ef = self._residual(name, n, comm.rank, comm.size)
        if input.dtype == torch.float32:
            stats = comm.reduce_scatter(input, output, self.codec, ef, op=kind, timeout=self.timeout)
        else:  # 16-bit: reduce an fp32 copy (exact upcast), cast the shard back
            wide = input.float()
            stats = comm.reduce_scatter(wide, None, self.codec, ef, op=kind, timeout=self.timeout)
            shard = n // comm.size
            output.copy_(wide[comm.rank * shard:(comm.rank + 1) * shard].view(output.shape))
        if factor is not None:
            output.mul_(factor)
        s = self._stats
        s["calls"] += 1
        s["dense_bytes"] += (comm.size - 1) * (n // comm.size) * input.element_size()
        s["wire_bytes"] += stats["wire_bytes"]

    def _communicator(self, group: dist.ProcessGroup) -> Any:
        """The communicator over `group`, made at its first reduce-scatter (every
        rank reaches it in the same FSDP order: a collective)."""
        entry = self._comms.get(id(group))
        if entry is None:
            size = dist.get_world_size(group)
            if self._world_size is not None and self._world_size != size:
                raise ValueError(f"this state was saved with world_size={self._world_size}, FSDP reduces over "
                                 f"{size} ranks")
            self._world_size = size
            comm = _torch_transport.connect(group, None, self.timeout)
            logger.info("gradzip FSDP reduce-scatter: codec=%s world_size=%d", self.codec.spec, size)
            entry = self._comms[id(group)] = (group, comm)  # the group is held: its id stays its own
        return entry[1]

    def _residual(self, name: str, n: int, rank: int, size: int) -> Any:
        from .. import ErrorFeedback

        ef = self._efs.get(name)
        if ef is None:
            ef = self._efs[name] = ErrorFeedback()
        layout = ef.layout
        if layout is not None and layout["n"] != n and (layout["rank"], layout["world_size"]) == (rank, size):
            # FSDP reduces only the parameters that got gradients: another set
            # this step moves every offset, so the residual restarts. (Another
            # rank or world size is the call's clear error, from C++.)
            logger.warning("gradzip FSDP reduce-scatter: group %r reduces %d elements, its residual holds %d "
                           "(parameters without gradients?); the residual restarts from zero", name, n, layout["n"])
            ef.reset()
        return ef


class CompressedReduceScatter(ReduceScatter):
    """FSDP2's ``ReduceScatter`` interface over a :class:`FSDPCompressionState`,
    for the FSDP module named `name` (its key in the state). :func:`register`
    installs one per FSDP module."""

    def __init__(self, state: FSDPCompressionState, name: str) -> None:
        self.state = state
        self.name = name

    def allocate(self, size: Sequence[Union[int, torch.SymInt]], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> Optional[dist.Work]:
        # Runs now, on the caller's thread and (CUDA) current stream, in FSDP's
        # order: the collective is never started from a callback.
        self.state.reduce_scatter(self.name, output_tensor, input_tensor, group, op)
        if not async_op:
            return None
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result([output_tensor])
        return torch._C._distributed_c10d._create_work_from_future(fut)  # already complete

    def __repr__(self) -> str:
        return f"CompressedReduceScatter({self.name!r}, {self.state!r})"


def register(model: torch.nn.Module, codec: Union[str, Codec, None] = None, *,
             state: Optional[FSDPCompressionState] = None, timeout: Optional[float] = None) -> FSDPCompressionState:
    """Compresses the gradient reduce-scatter of every FSDP module in `model`
    (``fully_shard`` applied first): each gets a :class:`CompressedReduceScatter`
    over one shared state, keyed by its module name. Returns the state: the
    given one, or a new one with `codec` (default ``"onebit"``) and `timeout`.

    Raises:
        ValueError: `model` has no FSDP module, or both `state` and settings
            (codec, timeout) were given.
    """
    from torch.distributed.fsdp import FSDPModule

    if state is None:
        state = FSDPCompressionState("onebit" if codec is None else codec, timeout=timeout)
    elif codec is not None or timeout is not None:
        raise ValueError("pass either a state or its settings (codec, timeout), not both")
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError("the model has no FSDP module: apply torch.distributed.fsdp.fully_shard first")
    for name, module in modules:
        module.set_custom_reduce_scatter(CompressedReduceScatter(state, name))
    return state


def _parse_op(op: Any):
    """("sum" | "avg", post-multiply factor or None) for FSDP's reduce op."""
    kind = getattr(op, "op", op)  # a PREMUL_SUM ReduceOp carries its type and factor
    if kind == dist.ReduceOp.SUM:
        return "sum", None
    if kind == dist.ReduceOp.AVG:
        return "avg", None
    if kind == dist.ReduceOp.PREMUL_SUM:
        factor = op.factor
        return "sum", float(factor.item() if isinstance(factor, torch.Tensor) else factor)
    raise InvalidArgument(f"gradzip's reduce-scatter sums or averages; FSDP asked for {kind}")


def _new_stats() -> Dict[str, Any]:
    return {"calls": 0, "dense_bytes": 0, "wire_bytes": 0}

