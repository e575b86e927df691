"""gradzip's own communicator: a compressed allreduce over UCX or NCCL."""

from __future__ import annotations

import builtins
import itertools
import warnings
from typing import Any, Dict, Optional

from . import _arrays
from . import _core
from ._core import InvalidArgument
from .codec import Codec
from .error_feedback import ErrorFeedback

__all__ = ["AllreduceState", "Communicator"]

_torch_count = itertools.count()


class AllreduceState(ErrorFeedback):
    """Deprecated: :class:`gradzip.ErrorFeedback` serves the collectives (and
    :meth:`Codec.encode`); this alias goes in the next release. Constructing
    one warns (DeprecationWarning). It keeps the former calls: ``save()``,
    ``restore(data)`` and ``memory_bytes``."""

    __slots__ = ()

    def __init__(self) -> None:
        warnings.warn("gradzip.AllreduceState is deprecated: use gradzip.ErrorFeedback, which serves "
                      "Codec.encode and the Communicator's collectives alike", DeprecationWarning, stacklevel=2)
        super().__init__()

    def save(self) -> builtins.bytes:
        """The C++ state serialised (``state_dict()["data"]``); InvalidArgument when unbound."""
        return self._collective().save()

    def restore(self, data: builtins.bytes) -> None:
        """Loads what :meth:`save` returned (``load_state_dict`` with it)."""
        if not isinstance(data, (builtins.bytes, bytearray, memoryview)):
            raise InvalidArgument(f"restore takes bytes, got {type(data).__name__}")
        self.load_state_dict({"version": 1, "data": data})

    @property
    def memory_bytes(self) -> int:
        return self.bytes


class Communicator:
    """gradzip's communicator: every rank calls :meth:`allreduce` with the same
    codec spec and size, in the same order, and gets the sum or average with
    the bytes on the wire compressed (see docs/comm.md for the algorithms).

    Build one with :meth:`from_env` (torchrun-style variables; rank 0 hosts a
    rendezvous store on MASTER_PORT), :meth:`from_store` (an existing
    torch.distributed store) or :meth:`from_torch` (torch's default store and
    a process group's ranks). Waits have a timeout (``GRADZIP_TIMEOUT_S``,
    default 60 s); a dead peer raises :class:`gradzip.IoError`, after which the
    communicator is broken: build a new one. One call at a time.

    Example::

        comm = gradzip.Communicator.from_env("ucx")
        codec, ef = gradzip.Codec("onebit"), gradzip.ErrorFeedback()  # one state per gradient buffer
        stats = comm.allreduce(grad, codec, ef, op="avg")   # grad averaged in place
    """

    __slots__ = ("_impl",)

    def __init__(self, impl: _core.Communicator) -> None:
        self._impl = impl

    @classmethod
    def from_env(cls, transport: str = "ucx", *, timeout: Optional[float] = None, prefix: str = "gradzip",
                 cuda_device: int = -1) -> "Communicator":
        """Rendezvous from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (torchrun, gradzip-run).
        Rank 0 hosts the store on MASTER_PORT, so in a job that also runs
        torch.distributed (whose store holds that port) use :meth:`from_torch`."""
        return cls(_core.Communicator.from_env(transport, timeout, prefix, cuda_device))

    @classmethod
    def from_store(cls, store: Any, rank: int, world_size: int, transport: str = "ucx", *,
                   timeout: Optional[float] = None, prefix: str = "gradzip", cuda_device: int = -1,
                   node: str = "") -> "Communicator":
        """Rendezvous through a store with torch.distributed.Store's set/get/wait/add.
        ``node``: this rank's node name for the topology (default: from the
        launcher's variables, which describe the job it started: a group of
        other members, such as torchft's quorums, names its nodes itself)."""
        named = (node,) if node else ()  # (an extension built before `node` takes the others)
        return cls(_core.Communicator.from_store(store, rank, world_size, transport, timeout, prefix, cuda_device,
                                                 *named))

    @classmethod
    def from_torch(cls, process_group: Any = None, transport: Optional[str] = None, *,
                   timeout: Optional[float] = None) -> "Communicator":
        """A communicator over the ranks of a torch process group (default: WORLD),
        meeting through torch's default store. Collective: every rank of the
        group calls it, in the same order relative to other from_torch calls.

        transport: one of gradzip's own (:func:`gradzip.transport_names`; the
        default is the one the registry names for the group's backend: nccl
        for an NCCL group, else ucx), or ``"torch"``: the group itself carries
        the bytes (gloo or NCCL point-to-point calls), driven by the same C++
        algorithms, with no second set of connections."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call init_process_group first")
        get_store = getattr(c10d, "_get_default_store", None)
        if get_store is None:
            raise RuntimeError("this torch has no default store to meet through; use Communicator.from_env")
        if transport is None:
            transport = _core.transport_for_torch_backend(str(dist.get_backend(process_group)))
        ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
        count = next(_torch_count)
        prefix = f"gradzip/{'.'.join(map(str, ranks))}/{count}"
        if transport == "torch":
            from .torch._torch_transport import ProcessGroupTransport

            driver = ProcessGroupTransport(process_group, tag=count)
            return cls(_core.Communicator.from_python(get_store(), driver, timeout, prefix))
        cuda_device = -1
        if _core.transport_takes_device_memory(transport):
            import torch

            cuda_device = torch.cuda.current_device()
        return cls.from_store(get_store(), dist.get_rank(process_group), len(ranks), transport,
                              timeout=timeout, prefix=prefix, cuda_device=cuda_device)

    @property
    def rank(self) -> int:
        return self._impl.rank

    @property
    def size(self) -> int:
        return self._impl.size

    @property
    def transport(self) -> str:
        return self._impl.transport

    @property
    def workspace_bytes(self) -> int:
        """Scratch held beyond the callers' buffers and states."""
        return self._impl.workspace_bytes

    @property
    def broken(self) -> bool:
        """True after an IoError: build a new communicator."""
        return self._impl.broken

    def allreduce(self, tensor: Any, codec: Codec, state: ErrorFeedback, op: str = "avg",
                  algorithm: str = "auto", *, server_codec: Any = None,
                  timeout: Optional[float] = None) -> Dict[str, Any]:
        """In place: ``tensor`` becomes the sum (``op="sum"``) or average (``"avg"``)
        over ranks, sent compressed by ``codec`` with error feedback in ``state``.

        Args:
            tensor: float32, float16 or bfloat16, contiguous; numpy array or torch
                tensor (CPU, or CUDA on torch's current stream). A 16-bit tensor is
                reduced in float32 (widened exactly, summed, rounded once to its
                dtype); the dtype is part of what the ranks agree on.
            codec: a :class:`gradzip.Codec` (the same spec on every rank).
            state: this buffer's :class:`gradzip.ErrorFeedback`, kept across calls
                (the first call binds it to this collective, codec and size; a
                state that serves :meth:`Codec.encode` is refused).
            algorithm: ``"auto"``, ``"allgather"``, ``"scatter_reduce"`` or
                ``"hierarchical"``.
            server_codec: the codec (spec or :class:`gradzip.Codec`) scatter_reduce
                re-encodes the chunk sums with; None: the default, fp16 for onebit
                and the codec itself otherwise (docs/comm.md, "The server phase");
                ``"same"``: the codec itself.
                Its error feedback follows ``codec``'s. The same on every rank.
            timeout: seconds for this call's waits (default: the communicator's).

        Returns:
            The call's stats: algorithm, encode_s, comm_s, decode_s, total_s,
            wire_bytes (payload bytes this rank sent), agreed.

        The GIL is released while the call runs. Every rank ends with the
        same bits.
        """
        native = _native_state(codec, state)
        if isinstance(server_codec, _core.Codec):
            server_codec = server_codec.spec
        if server_codec is not None and not isinstance(server_codec, str):
            raise InvalidArgument(f"server_codec must be a spec string or a gradzip.Codec, got "
                                  f"{type(server_codec).__name__}")
        tensor = _arrays.as_input(tensor, "tensor")
        _arrays.check_writable(tensor, "tensor")
        with _arrays.cuda_call(tensor) as (stream, _):
            return self._impl.allreduce(tensor, codec, native, op=op, algorithm=algorithm,
                                        server_codec=server_codec, stream=stream, timeout=timeout)

    def reduce_scatter(self, input: Any, output: Any, codec: Codec, state: ErrorFeedback, op: str = "avg", *,
                       timeout: Optional[float] = None) -> Dict[str, Any]:
        """Compressed reduce-scatter: rank r gets chunk r of the sum (``op="sum"``)
        or average (``"avg"``) over ranks of ``input``, sent compressed by
        ``codec`` with error feedback in ``state`` (this rank's contribution).

        Args:
            input: float32, contiguous, n elements (numpy array or torch tensor,
                CPU or CUDA on torch's current stream): every rank's chunks in
                rank order. Used as scratch, as NCCL's in-place reduce-scatter:
                chunk ``rank`` is overwritten with the result, the others are
                only read.
            output: where the result goes too: float32, n / size elements (n
                must divide by the world size, as for torch's
                ``reduce_scatter_tensor``); or None: the result stays in
                ``input``'s chunk ``rank`` (chunks of n // size or one more
                element, the first n % size the longer).
            codec: a :class:`gradzip.Codec` (the same spec on every rank).
            state: this buffer's :class:`gradzip.ErrorFeedback`; one used here is
                bound to the reduce-scatter and cannot serve an allreduce (nor
                :meth:`Codec.encode`).

        Returns:
            The call's stats, as :meth:`allreduce`'s (algorithm ``"reduce_scatter"``).

        For codec ``none`` the result is the fp32 sum in rank order (times 1/P
        for an average); lossy codecs are within their documented error, and
        error feedback carries what a step lost into the next (docs/comm.md).
        """
        native = _native_state(codec, state)
        input = _arrays.as_input(input, "input")
        _arrays.check_writable(input, "input")
        n, size, rank = _arrays.numel(input), self.size, self.rank
        if output is not None:
            output = _arrays.as_input(output, "output")
            _arrays.check_writable(output, "output")
            if n % size:
                raise InvalidArgument(f"reduce_scatter: input has {n} elements, which do not split into {size} "
                                      f"equal chunks (pad it to a multiple of the world size, as FSDP does)")
            if _arrays.numel(output) != n // size:
                raise InvalidArgument(f"reduce_scatter: output has {_arrays.numel(output)} elements, expected "
                                      f"{n // size} (input {n} / world size {size})")
            if not _arrays.same_home(input, output):
                raise InvalidArgument("reduce_scatter: input and output must be of one framework and on one device")
            if getattr(output, "dtype", None) != getattr(input, "dtype", None):
                raise InvalidArgument(f"reduce_scatter: output is {output.dtype}, input {input.dtype}; both float32")
        with _arrays.cuda_call(input) as (stream, _):
            stats = self._impl.reduce_scatter(input, codec, native, op=op, stream=stream, timeout=timeout)
            if output is not None:
                chunk = n // size
                output[...] = input.reshape(-1)[rank * chunk:(rank + 1) * chunk].reshape(output.shape)
        return stats

    def barrier(self) -> None:
        self._impl.barrier()

    def close(self) -> None:
        """Releases the transport (waits up to 10 s for the other ranks to close)."""
        self._impl.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._impl.closed:
            return "Communicator(closed)"
        return f"Communicator(transport='{self.transport}', rank={self.rank}, size={self.size})"


def _native_state(codec: Any, state: Any) -> Any:
    """Checks the call's codec and state; the C++ state the collective runs on."""
    if not isinstance(codec, _core.Codec):
        raise InvalidArgument(f"codec must be a gradzip.Codec, got {type(codec).__name__}")
    if not isinstance(state, ErrorFeedback):
        raise InvalidArgument(f"state must be a gradzip.ErrorFeedback, got {type(state).__name__}")
    return state._collective()
