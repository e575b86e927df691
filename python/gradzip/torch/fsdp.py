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

Layer filters (``exact_below``, the DDP hook's policy, _filters.py): FSDP's
input is P chunks, one per rank, each the concatenation of every parameter's
(padded) shard in the group's order, so every chunk has the same layout. The
filter splits that layout once; the exact parameters' runs of every chunk go
to one fp32 reduce-scatter (gradzip's ``none``: rank r gets the shards of its
own exact parameters), the others' runs, gathered end to end per chunk, to the
codec's, whose blocks then never span a parameter of the other kind; each
result is put back in place in the output shard.
"""

import logging
import weakref
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.distributed as dist
# The interface set_custom_reduce_scatter takes; torch exports it nowhere public.
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from .. import InvalidArgument
from ..codec import Codec
from . import _agreement, _filters, _resume, _stats, _torch_transport

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
        exact_below: the layer filter, as the DDP hook's (CGX's): the shards
            of parameters with at most one dimension (biases, norm weights)
            or fewer than this many elements are reduce-scattered exact (fp32,
            gradzip's ``none``), the others through the codec, gathered so
            that a block scale never spans a parameter of the other kind.
            None (default): every parameter through the codec. Needs the
            group's parameter layout, which :func:`register` gives each
            reduce-scatter; a reduce-scatter over another set of parameters
            (some without gradients) goes through the codec whole.

    Gradient dtypes: float32 is reduced as it is. bfloat16 and float16
    (``MixedPrecisionPolicy(reduce_dtype=...)``) are upcast to float32 (exact),
    reduced, and the shard cast back; anything else raises ValueError.
    Reduce ops: sum, average, and FSDP's ``PREMUL_SUM(f)`` (gradient divide
    factors), computed as f x the sum.
    """

    __slots__ = ("codec", "timeout", "exact_below", "_efs", "_splits", "_comms", "_stats",
                 "_world_size", "_agreed_ops", "_resume", "_rank")

    def __init__(self, codec: Union[str, Codec] = "onebit", timeout: Optional[float] = None,
                 exact_below: Optional[int] = None) -> None:
        _filters.check(exact_below)
        self.codec = codec if isinstance(codec, Codec) else Codec(codec)
        self.timeout = timeout
        self.exact_below = None if self.codec.name == "none" else exact_below  # none: nothing to protect
        # Each group's split, keyed by FSDP module name; its exact part's state
        # is the split's (the none codec keeps no residual: nothing to checkpoint).
        self._splits: Dict[str, Any] = {}
        self._efs: Dict[str, Any] = {}  # FSDP module name -> gradzip.ErrorFeedback
        self._comms: Dict[int, Any] = {}  # id(process group) -> (group, Communicator)
        self._world_size: Optional[int] = None
        self._agreed_ops: Dict[str, Any] = {}  # FSDP module name -> (op, factor) the ranks agreed on
        self._stats = _new_stats()
        self._resume = _resume.Resume()  # whose residuals were restored (_resume.py)
        self._rank: Optional[int] = None  # this rank in the reduce-scatter's group, once it ran

    def compression_stats(self) -> Dict[str, float]:
        """This rank's reduce-scatter traffic since construction (or the restored
        checkpoint's counts): ``calls``; ``dense_bytes``: what torch's
        uncompressed reduce-scatter of the same tensors sends from this rank
        ((P-1)/P of the input, in its dtype); ``wire_bytes``: what gradzip
        sent; ``exact_wire_bytes``: the part of it the layer filter sent in
        fp32 (``exact_below``); ``baseline_wire_bytes`` (= dense_bytes) and
        ``wire_ratio``: dense / wire (the keys every entry point reports:
        ``_stats.py``)."""
        s = dict(self._stats)
        s.update(_stats.core(s["wire_bytes"], s["dense_bytes"]))
        return s

    def state_dict(self) -> Dict[str, Any]:
        """This rank's state for a checkpoint (residuals differ between ranks:
        save one per rank): codec, world size, each parameter group's residual
        (serialised, checksummed bytes) and the byte counts."""
        return {
            "version": _STATE_VERSION,
            "codec": self.codec.spec,
            "exact_below": self.exact_below,
            "world_size": self._world_size,
            "saved_by": _resume.saved_by(self._rank, self._world_size),
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
        if state.get("exact_below") != self.exact_below:  # the residuals' layouts follow the filter
            raise ValueError(f"the state_dict was saved with exact_below={state.get('exact_below')!r}, this state "
                             f"has {self.exact_below!r}")
        from .. import ErrorFeedback

        stamp = _resume.checked_stamp(state)
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
        # Another rank's or world size's residuals (a checkpointer that keeps one copy): dropped at the
        # first reduce-scatter by every rank alike (_resume.py).
        self._resume.loaded(stamp, world, self._rank, self._world_size)  # rank None: classified when bound
        if self._rank is None:
            self._world_size = world
        self._stats = _new_stats()
        self._stats.update(stats)

    def __getstate__(self) -> Dict[str, Any]:
        return {"codec": self.codec.spec, "timeout": self.timeout, "exact_below": self.exact_below,
                "state": self.state_dict()}

    def __setstate__(self, d: Dict[str, Any]) -> None:
        self.__init__(codec=d["codec"], timeout=d["timeout"], exact_below=d.get("exact_below"))  # type: ignore[misc]
        self.load_state_dict(d["state"])

    def __repr__(self) -> str:
        return (f"FSDPCompressionState(codec='{self.codec.spec}', exact_below={self.exact_below}, "
                f"groups={len(self._efs)})")

    # -- the collective --------------------------------------------------------

    def reduce_scatter(self, name: str, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup,
                       op: Any, layout: Optional[Sequence[Any]] = None) -> None:
        """FSDP parameter group `name`'s reduce-scatter: output = this rank's
        shard of op over ranks of input (world-size equal chunks). `layout`:
        the (shape, elements per chunk) of each parameter in a chunk, in
        order, for the layer filter (None: the whole input through the codec)."""
        kind, factor = _parse_op(op)
        if input.dtype != torch.float32 and input.dtype not in _UPCAST:
            raise ValueError(f"gradzip's FSDP reduce-scatter takes float32, bfloat16 or float16 gradients; this "
                             f"group ({name or 'root'}) reduces {input.dtype}")
        if output.dtype != input.dtype:
            raise ValueError(f"reduce-scatter output is {output.dtype}, input {input.dtype}")
        comm = self._communicator(group)
        if self._agreed_ops.get(name) != (kind, factor) or not self._resume.settled:
            # The factor is applied here, after the C++ collective (which
            # agrees on the rest): the ranks compare it at the group's first
            # reduce-scatter, and again whenever it changes; after a start or
            # a restore, whose residuals each rank restored too (_resume.py).
            fields = [("FSDP module", name or "(root)"), ("reduce op", kind),
                      ("gradient divide factor", "none" if factor is None else repr(factor)),
                      ("exact_below", repr(self.exact_below)), *self._resume.fields()]
            if self._resume.agreed(lambda: _agreement.agree(
                    group, fields, "fsdp", "the FSDP reduce-scatter's agreement",
                    "gradzip FSDP reduce-scatter: the ranks reduce differently (every rank must use the same reduce "
                    "op, gradient divide factor and exact_below, and restore its state on all ranks or none):",
                    self.timeout), "FSDP reduce-scatter"):
                self._efs = {}
            self._agreed_ops[name] = (kind, factor)
        n = input.numel()
        split = self._split(name, layout, n // comm.size) if n % comm.size == 0 else None
        if split is not None:
            wire, exact = self._reduce_scatter_split(name, split, output, input, comm, kind)
            self._finish(comm, input, n, wire, exact, factor, output)
            return
        ef = self._residual(name, n, comm.rank, comm.size)
        if input.dtype == torch.float32:
            stats = comm.reduce_scatter(input, output, self.codec, ef, op=kind, timeout=self.timeout)
        else:  # 16-bit: reduce an fp32 copy (exact upcast), cast the shard back
            wide = input.float()
            stats = comm.reduce_scatter(wide, None, self.codec, ef, op=kind, timeout=self.timeout)
            shard = n // comm.size
            output.copy_(wide[comm.rank * shard:(comm.rank + 1) * shard].view(output.shape))
        self._finish(comm, input, n, stats["wire_bytes"], 0, factor, output)

    def _finish(self, comm: Any, input: torch.Tensor, n: int, wire: float, exact: float, factor: Optional[float],
                output: torch.Tensor) -> None:
        """Applies the divide factor to the output shard; counts the call's bytes."""
        if factor is not None:
            output.mul_(factor)
        s = self._stats
        s["calls"] += 1
        s["dense_bytes"] += (comm.size - 1) * (n // comm.size) * input.element_size()
        s["wire_bytes"] += wire
        s["exact_wire_bytes"] += exact

    def _split(self, name: str, layout: Optional[Sequence[Any]], chunk: int) -> Any:
        """The layer filter's split of a chunk of group `name`'s input (None:
        the whole input through the codec: no filter, nothing exact, or an
        input that is not the layout's: parameters without gradients)."""
        if self.exact_below is None or layout is None:
            return None
        cached = self._splits.get(name)
        if cached is None or cached[0] != layout:
            layout = list(layout)
            cached = self._splits[name] = (layout, sum(m for _, m in layout),
                                           _filters.split_end_to_end(layout, self.exact_below))
        if cached[1] != chunk:
            logger.warning("gradzip FSDP reduce-scatter: group %r reduces %d elements per rank, its parameters hold "
                           "%d (parameters without gradients?); this call goes through the codec whole", name,
                           chunk, cached[1])
            return None
        return cached[2]

    def _reduce_scatter_split(self, name: str, split: Any, output: torch.Tensor, input: torch.Tensor, comm: Any,
                              kind: str) -> Any:
        """The filtered reduce-scatter: every chunk's exact runs in fp32, its
        other runs through the codec (this group's residual), each gathered
        end to end per chunk in float32 (a 16-bit input is widened exactly)
        and put back in place in the output. Returns (wire bytes, of them fp32)."""
        from .. import ErrorFeedback

        size = comm.size
        chunks = input.view(size, -1)
        shard = output.view(-1)
        wire = 0.0
        fp32 = torch.empty(0, dtype=torch.float32, device=input.device)  # what the parts are gathered in
        if split.n_compressed:
            c = split.buffer("compressed", size * split.n_compressed, fp32)
            _filters.gather(chunks, split.compressed, c.view(size, -1))
            ef = self._residual(name, c.numel(), comm.rank, size)
            got = c.view(size, -1)[comm.rank]  # this rank's own chunk: reduced in place
            wire += comm.reduce_scatter(c, None, self.codec, ef, op=kind, timeout=self.timeout)["wire_bytes"]
            _filters.scatter(got, split.compressed, shard)
        e = split.buffer("exact", size * split.n_exact, fp32)
        _filters.gather(chunks, split.exact, e.view(size, -1))
        if split.exact_ef.layout is not None and split.exact_ef.layout["n"] != e.numel():  # another group size
            split.exact_ef = ErrorFeedback()
        exact = comm.reduce_scatter(e, None, _filters.none_codec(), split.exact_ef, op=kind,
                                    timeout=self.timeout)["wire_bytes"]
        _filters.scatter(e.view(size, -1)[comm.rank], split.exact, shard)
        return wire + exact, exact

    def _communicator(self, group: dist.ProcessGroup) -> Any:
        """The communicator over `group`, made at its first reduce-scatter (every
        rank reaches it in the same FSDP order: a collective)."""
        entry = self._comms.get(id(group))
        if entry is None:
            size = dist.get_world_size(group)
            self._rank = dist.get_rank(group)
            self._resume.bind(self._rank, size)  # a restore before: this rank's own, or not (_resume.py)
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

    def __init__(self, state: FSDPCompressionState, name: str, module: Optional[torch.nn.Module] = None) -> None:
        self.state = state
        self.name = name
        # The FSDP module whose parameter layout the layer filter splits (weakly: the module holds this object).
        self._module = None if module is None else weakref.ref(module)

    def allocate(self, size: Sequence[Union[int, torch.SymInt]], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> Optional[dist.Work]:
        # Runs now, on the caller's thread and (CUDA) current stream, in FSDP's
        # order: the collective is never started from a callback.
        self.state.reduce_scatter(self.name, output_tensor, input_tensor, group, op, self._layout())
        if not async_op:
            return None
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result([output_tensor])
        return torch._C._distributed_c10d._create_work_from_future(fut)  # already complete

    def _layout(self) -> Optional[List[Any]]:
        """(shape, elements in each rank's chunk) of each parameter of the FSDP
        module's group, in the order FSDP lays its reduce-scatter input out
        (each parameter's padded shard); None without a module or filter."""
        module = None if self._module is None or self.state.exact_below is None else self._module()
        if module is None:
            return None
        try:  # torch's FSDPParamGroup and FSDPParam: private, as the ReduceScatter interface is
            group = module._get_fsdp_state()._fsdp_param_group
            if group is None:
                return None
            return [(tuple(p._orig_size), p.padded_sharded_param_size.numel()) for p in group.fsdp_params]
        except AttributeError as e:
            raise RuntimeError(f"gradzip FSDP layer filter (exact_below): this torch ({torch.__version__}) does "
                               f"not expose FSDP's parameter layout as torch 2.15 does ({e}); use "
                               f"exact_below=None") from None

    def __repr__(self) -> str:
        return f"CompressedReduceScatter({self.name!r}, {self.state!r})"


def register(model: torch.nn.Module, codec: Union[str, Codec, None] = None, *,
             state: Optional[FSDPCompressionState] = None, timeout: Optional[float] = None,
             exact_below: Optional[int] = None) -> FSDPCompressionState:
    """Compresses the gradient reduce-scatter of every FSDP module in `model`
    (``fully_shard`` applied first): each gets a :class:`CompressedReduceScatter`
    over one shared state, keyed by its module name. Returns the state: the
    given one, or a new one with `codec` (default ``"onebit"``), `timeout`
    and `exact_below` (the layer filter: :class:`FSDPCompressionState`).

    Raises:
        ValueError: `model` has no FSDP module, both `state` and settings
            (codec, timeout, exact_below) were given, or a bad exact_below.
    """
    from torch.distributed.fsdp import FSDPModule

    if state is None:
        state = FSDPCompressionState("onebit" if codec is None else codec, timeout=timeout, exact_below=exact_below)
    elif codec is not None or timeout is not None or exact_below is not None:
        raise ValueError("pass either a state or its settings (codec, timeout, exact_below), not both")
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError("the model has no FSDP module: apply torch.distributed.fsdp.fully_shard first")
    for name, module in modules:
        module.set_custom_reduce_scatter(CompressedReduceScatter(state, name, module))
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
    return {"calls": 0, "dense_bytes": 0, "wire_bytes": 0, "exact_wire_bytes": 0}

