"""The gradzip process-group backend's policy (which all_reduce calls are
compressed, with which codec) and its error-feedback states (which residual a
compressed call continues).

Words used here:
- *rule*: (dtype, min_elements, codec spec). A floating tensor reduced with
  SUM or AVG takes the first rule whose dtype matches ("*" matches every
  floating dtype the engine takes) and whose min_elements it reaches; codec
  ``none`` in a rule, or no rule at all, keeps the call exact (delegated to
  gloo or NCCL).
- *signature*: (device type, dtype, element count, codec spec) of a
  compressed call. Only a state of the same signature can serve it.
- *slot*: one error-feedback state, the buffer it was last used with (its
  address and a weak reference to its storage) and when.

The identity rule (docs/python.md, "The process-group backend"): a compressed
call on a buffer that is still alive continues that buffer's state (found by
its address, element count and dtype). A call on a new buffer (new address,
or the storage at a known address was freed and allocated again) takes over
the *orphaned* state of its signature that was used least recently: one
whose buffer has been freed since (``zero_grad(set_to_none=True)`` frees and
reallocates every ``.grad`` each step; they take their states back in the
order they were first reduced). With none, it gets a new zero state. An
orphan that no buffer takes over within one round (until a live buffer's
state is used again) is dropped. A checkpoint holds the states in the order
of their first use and a restored one starts with all of them orphaned, so a
program that reduces its buffers in the same order continues bit-identically.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .. import InvalidArgument, _core
from ..codec import Codec, server_codec_arg
from ._quality import DEFAULT_CODEC

# The dtypes gradzip's engine reduces (16-bit ones on their float32 widening).
ENGINE_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_DTYPE_NAMES = {"*", *ENGINE_DTYPES.values()}
_ALGORITHMS = tuple(_core.allreduce_algorithm_names())  # the C++ registry (comm/algorithms/registry.h)
_UNSET: Any = object()

Rule = Tuple[str, int, str]


class Policy:
    """What the ``gradzip`` process-group backend compresses: set once, the same
    on every rank (``init_process_group`` checks that).

    Args:
        codec: the codec spec for floating tensors of at least ``min_elements``
            elements (default ``"qsgd:bits=4"``: 7.7x fewer bytes than fp32;
            with AdamW on the LM experiment -4.4% and -2.1% against fp32's
            validation loss at 4 and 8 ranks, worst seed +1.3%, where onebit,
            the former default, ended +8.4%; on digits with momentum SGD
            fp32's accuracy: BENCHMARKS.md section 11, "Defaults that keep
            AdamW's quality").
            ``"none"`` compresses nothing.
        min_elements: tensors with fewer elements stay exact (default 16384,
            64 KiB of float32: biases, norms and metrics are not compressed).
        rules: instead of ``codec`` and ``min_elements``: a sequence of
            ``(dtype, min_elements, codec)``; a tensor takes the first rule
            whose dtype (``"float32"``, ``"float16"``, ``"bfloat16"`` or ``"*"``)
            matches and whose ``min_elements`` it reaches, and stays exact when
            none does (codec ``"none"`` in a rule also keeps it exact).
        algorithm: the engine's ``"auto"`` (default), ``"allgather"``,
            ``"scatter_reduce"``, ``"hierarchical"`` or ``"ring"``.
        server_codec: the codec scatter_reduce re-encodes chunk sums with
            (None: the engine's default, fp16 for onebit and the codec itself
            otherwise; ``"same"``: the codec itself).

    Raises:
        ValueError: an unknown algorithm or dtype, a negative threshold,
            ``rules`` given with ``codec``/``min_elements``; an unknown codec
            spec raises :class:`gradzip.InvalidArgument` (a ValueError).

    Example::

        Policy("onebit", min_elements=1 << 16)
        Policy(rules=[("float32", 1 << 20, "onebit"), ("*", 1 << 14, "fp16")])
    """

    __slots__ = ("rules", "algorithm", "server_codec", "_codecs")

    def __init__(self, codec: Any = _UNSET, *, min_elements: Any = _UNSET, rules: Optional[Sequence[Any]] = None,
                 algorithm: str = "auto", server_codec: Optional[str] = None) -> None:
        if rules is not None:
            if codec is not _UNSET or min_elements is not _UNSET:
                raise ValueError("give either codec and min_elements or rules, not both")
            given = list(rules)
        else:
            given = [("*", 16384 if min_elements is _UNSET else min_elements,
                      DEFAULT_CODEC if codec is _UNSET else codec)]
        if algorithm not in _ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(_ALGORITHMS)}")
        self.rules: List[Rule] = [_rule(r) for r in given]
        self.algorithm = algorithm
        self.server_codec = server_codec_arg(server_codec)
        self._codecs = {spec: Codec(spec) for _, _, spec in self.rules if spec != "none"}

    @classmethod
    def parse(cls, text: str) -> "Policy":
        """From ``GRADZIP_POLICY``'s form: ``key=value`` pairs separated by ``;``
        (keys codec, min_elements, algorithm, server_codec), e.g.
        ``"codec=topk:density=0.01;min_elements=65536"``."""
        kwargs: Dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(";"))):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in ("codec", "min_elements", "algorithm", "server_codec"):
                raise ValueError(f"cannot read {part!r}; expected key=value with key codec, min_elements, "
                                 f"algorithm or server_codec, separated by ';'")
            value = value.strip()
            if key == "min_elements":
                if not value.isdigit():  # (int() would take "+1_0" and " 7 ")
                    raise ValueError(f"min_elements={value!r} is not a whole number of elements")
                kwargs[key] = int(value)
            else:
                kwargs[key] = value
        return cls(**kwargs)

    def codec_for(self, tensor: torch.Tensor) -> Optional[Codec]:
        """The codec that reduces `tensor`, or None: exact."""
        name = ENGINE_DTYPES.get(tensor.dtype)
        spec = None if name is None else self.spec_for(name, tensor.numel())
        if spec is None:
            return None
        codec = self._codecs.get(spec)
        if codec is None:  # after release_codecs()
            codec = self._codecs[spec] = Codec(spec)
        return codec

    def spec_for(self, dtype: str, numel: int) -> Optional[str]:
        """The codec spec of a tensor of `dtype` (an ENGINE_DTYPES name) and
        `numel` elements, or None: exact."""
        for rule_dtype, least, spec in self.rules:
            if rule_dtype in ("*", dtype) and numel >= least:
                return None if spec == "none" else spec
        return None

    def release_codecs(self) -> None:
        """Drops the codec objects (made again at the next use). A group's
        shutdown calls it: torch keeps the group, and so its policy, alive
        into interpreter teardown, past the native module."""
        self._codecs = {}

    def fields(self) -> List[Tuple[str, str]]:
        """What the ranks compare."""
        return [("rules", "; ".join(f"{d} >= {m}: {s}" for d, m, s in self.rules)),
                ("algorithm", self.algorithm), ("server_codec", str(self.server_codec))]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash(tuple(self.fields()))

    def __getstate__(self) -> Dict[str, Any]:
        return {"rules": self.rules, "algorithm": self.algorithm, "server_codec": self.server_codec}

    def __setstate__(self, d: Dict[str, Any]) -> None:
        Policy.__init__(self, rules=d["rules"], algorithm=d["algorithm"], server_codec=d["server_codec"])

    def __repr__(self) -> str:
        return f"Policy(rules={self.rules!r}, algorithm={self.algorithm!r}, server_codec={self.server_codec!r})"


def _rule(r: Any) -> Rule:
    if not isinstance(r, (tuple, list)) or len(r) != 3:
        raise ValueError(f"a rule is (dtype, min_elements, codec), got {r!r}")
    dtype, least, spec = r
    if isinstance(dtype, torch.dtype):
        dtype = ENGINE_DTYPES.get(dtype, str(dtype))
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"rule {r!r}: dtype must be one of {', '.join(sorted(_DTYPE_NAMES))} (other dtypes always "
                         f"stay exact)")
    if not isinstance(least, int) or isinstance(least, bool) or least < 0:
        raise ValueError(f"rule {r!r}: min_elements must be an integer >= 0")
    spec = spec.spec if isinstance(spec, Codec) else Codec(spec).spec
    return (dtype, least, spec)


# -- error-feedback states ----------------------------------------------------

Signature = Tuple[str, str, int, str]


class _Slot:
    __slots__ = ("sig", "ef", "addr", "ref", "last")

    def __init__(self, sig: Signature, ef: Any) -> None:
        self.sig = sig
        self.ef = ef
        self.addr: Any = None
        self.ref: Any = None  # StorageWeakRef of the buffer's storage; None: orphaned (restored)
        self.last = 0  # call number of its last use

    def orphaned(self) -> bool:
        return self.ref is None or self.ref.expired()


class States:
    """The error-feedback states of one process group, by the identity rule
    above. Called on the calling thread, in program order (the same order on
    every rank)."""

    __slots__ = ("_slots", "_by_addr", "_calls")

    def __init__(self) -> None:
        self._slots: List[_Slot] = []  # in order of first use
        self._by_addr: Dict[Any, _Slot] = {}
        self._calls = 0

    def get(self, tensor: torch.Tensor, codec: Codec) -> Any:
        from torch.multiprocessing.reductions import StorageWeakRef

        self._calls += 1
        sig: Signature = (tensor.device.type, ENGINE_DTYPES[tensor.dtype], tensor.numel(), codec.spec)
        addr = (tensor.device.type, tensor.device.index, tensor.data_ptr(), sig)
        slot = self._by_addr.get(addr)
        if slot is not None and not slot.orphaned():
            # A new round for this buffer: orphans nobody took over since its last use go.
            self._drop_orphans(before=slot.last)
        else:
            slot = min((s for s in self._slots if s.sig == sig and s.orphaned()),
                       key=lambda s: s.last, default=None)  # min: the least recently used (first use on ties)
            if slot is None:
                from .. import ErrorFeedback

                slot = _Slot(sig, ErrorFeedback())
                self._slots.append(slot)
            if self._by_addr.get(slot.addr) is slot:
                del self._by_addr[slot.addr]
            slot.addr = addr
            slot.ref = StorageWeakRef(tensor.untyped_storage())
            self._by_addr[addr] = slot
        slot.last = self._calls
        return slot.ef

    def _drop_orphans(self, before: int) -> None:
        if any(s.orphaned() and s.last < before for s in self._slots):
            keep = [s for s in self._slots if not (s.orphaned() and s.last < before)]
            self._by_addr = {a: s for a, s in self._by_addr.items() if any(s is k for k in keep)}
            self._slots = keep

    def regroup(self) -> int:
        """The group changed (torchft's quorum): every state may bind at its
        next call to its new rank and world size, carrying its worker
        residual (ErrorFeedback.regroup). The number of states."""
        for s in self._slots:
            s.ef.regroup()
        return len(self._slots)

    def zero(self) -> int:
        """Sets every state's residuals to zeros in place (ErrorFeedback.zero:
        no agreement round, so one rank may do it alone). The number of states."""
        for s in self._slots:
            s.ef.zero()
        return len(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def bytes(self) -> int:
        return sum(s.ef.bytes for s in self._slots)

    def state_dict(self) -> List[Dict[str, Any]]:
        """The states in order of first use. A state no call bound (its first
        call failed) holds nothing, a fresh one is the same, and is not saved:
        a checkpoint's every state is bound (restored() refuses an unbound one)."""
        return [{"device": s.sig[0], "dtype": s.sig[1], "numel": s.sig[2], "codec": s.sig[3],
                 "ef": s.ef.state_dict()} for s in self._slots if s.ef.bound]

    @classmethod
    def restored(cls, entries: Any, policy: Policy, rank: int, size: int) -> "States":
        """The states of a checkpoint's ``states`` list, every one orphaned,
        after checking each entry against this group: a signature this
        `policy` compresses (else its residual could never be used), and error
        feedback bound to that codec and size on this rank of `size` (the C++
        restore checks its bytes: checksum, limits, finite and bounded
        residuals; an unbound one is no saved state), and no state listed
        twice: an entry whose signature and residuals equal an earlier one's,
        non-zero, is one buffer's state repeated (two buffers never carry the
        same non-zero residuals bit for bit), and the identity rule would
        hand the copies to that buffer in turn, one per call. Raises
        InvalidArgument naming the entry; nothing is kept."""
        import hashlib

        from .. import ErrorFeedback

        if not isinstance(entries, (list, tuple)):
            raise InvalidArgument(f"gradzip backend state_dict: 'states' must be a list, got "
                                  f"{type(entries).__name__}")
        states = cls()
        seen: Dict[Any, int] = {}  # (signature, digest of non-zero residuals) -> the entry that had them
        for i, e in enumerate(entries):
            def bad(why: str) -> InvalidArgument:
                return InvalidArgument(f"gradzip backend state_dict: state {i}: {why}")

            if not isinstance(e, dict) or set(e) != {"device", "dtype", "numel", "codec", "ef"}:
                raise bad("not a dict of device, dtype, numel, codec and ef")
            device, dtype, numel, spec = e["device"], e["dtype"], e["numel"], e["codec"]
            if device not in ("cpu", "cuda") or dtype not in ENGINE_DTYPES.values():
                raise bad(f"device {device!r} or dtype {dtype!r} is not one the engine reduces")
            if type(numel) is not int or numel < 0:
                raise bad(f"numel must be an integer >= 0, got {numel!r}")
            if not isinstance(spec, str) or policy.spec_for(dtype, numel) != spec:
                raise bad(f"codec {spec!r} is not what this group's policy compresses {numel} x {dtype} with "
                          f"({policy.spec_for(dtype, numel) or 'exact'}): saved under another policy?")
            ef = ErrorFeedback()
            try:
                ef.load_state_dict(e["ef"])
            except (ValueError, TypeError, KeyError, AttributeError) as err:  # (InvalidArgument: a ValueError)
                raise bad(f"ef: {err}") from None
            layout = ef.layout
            if ef.role not in (None, "collective"):
                raise bad(f"ef holds a {ef.role!r} state, not a collective one")
            if layout is None:
                raise bad("ef is an unbound state (role None, no residuals): a saved state holds the residuals of the "
                          "compressed call that bound it")
            if (layout["codec"] != spec or layout["n"] != numel or layout["rank"] != rank
                    or layout["world_size"] != size):
                raise bad(f"ef is bound to {layout['codec']} x {layout['n']} on rank {layout['rank']} of "
                          f"{layout['world_size']}, not to {spec} x {numel} on rank {rank} of {size}")
            sig: Signature = (device, dtype, numel, spec)
            worker, server = ef.residuals()
            if worker.any() or server.any():
                h = hashlib.sha256(worker)
                h.update(server)
                digest = h.digest()
                first = seen.setdefault((sig, layout["algorithm"], len(worker), digest), i)
                if first != i:
                    raise bad(f"ef repeats state {first}'s residuals ({spec} x {numel}): one buffer's state "
                              f"listed twice (a checkpoint holds each buffer's state once)")
            states._slots.append(_Slot(sig, ef))
        return states
