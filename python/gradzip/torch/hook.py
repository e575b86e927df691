"""A PyTorch DDP communication hook that compresses gradients with gradzip."""

# No "from __future__ import annotations": DDP's register_comm_hook inspects
# the hook's annotations and needs the real dist.GradBucket / Future types.
import logging
import math
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .. import _core
from ..codec import Codec, server_codec_arg
from . import (_agreement, _filters, _layout, _momentum, _precondition, _quality, _resume, _stats, _transports,
               _worker)
from ._quality import is_adaptive

__all__ = ["CompressionState", "compression_hook"]

logger = logging.getLogger(__name__)

_ALGORITHMS = tuple(_core.allreduce_algorithm_names())  # the C++ registry (comm/algorithms/registry.h)
_STATE_VERSION = 2  # 2: residuals are the allreduce's (worker and server), for either transport


class CompressionState:
    """State of :func:`compression_hook` for one DDP model.

    Holds the codec, the error-feedback residuals of the model's gradient
    buckets, the step counter and byte counts. Build one per DDP model (on
    every rank, with the same arguments) and register it with the hook::

        state = CompressionState(warmup_steps=10)  # qsgd 4-bit
        ddp_model.register_comm_hook(state, compression_hook)

    The state can be built (and pickled) before ``init_process_group``, as
    frameworks do (Lightning builds it in the user's script and pickles it
    into the ranks it spawns): it binds to the process group, its world size
    and a communicator on the first hook call. A pickled state carries its
    settings and :meth:`state_dict`, never a process group or communicator.

    Args:
        codec: a gradzip codec spec (``"onebit"``, ``"topk:density=0.01"``,
            ``"fp16"``, ... with ``ef=on|off``; see :class:`gradzip.Codec`) or a
            :class:`gradzip.Codec`. Default ``"qsgd:bits=4"`` (4 bits and a
            scale per 512 coordinates, error feedback: 7.7x fewer bytes than
            fp32 DDP): on the LM experiment with AdamW it ended -3.2% and
            -0.5% against fp32's validation loss at 4 and 8 ranks (means over
            3 and 5 seeds; one 8-rank seed +8.8%), where onebit, the former
            default, ended +4.6%; on digits with momentum SGD it matched fp32
            (BENCHMARKS.md section 11, "Defaults that keep AdamW's
            quality"). ``"none"`` sends fp32 with a plain allreduce, exactly
            like DDP without a hook. onebit and top-k under an adaptive
            optimizer lose quality even with the defaults below (``adaptive``):
            the state then logs a warning once per process naming
            :class:`gradzip.torch.CompressedAdamW`, which keeps it.
        process_group: the group to reduce over; None means the default (WORLD)
            as it is at the first hook call.
        warmup_steps: steps that run a plain fp32 allreduce before compression
            starts, like PowerSGD's ``start_powerSGD_iter``. Default 0.
        transport: what carries the compressed payloads; either way every bucket
            runs gradzip's pipelined compressed allreduce (the C++ algorithms of
            :class:`gradzip.Communicator`, docs/comm.md). ``"torch"`` (default):
            ``process_group`` itself, through its point-to-point calls (gloo on
            CPU, NCCL on GPU), no other connections. ``"gradzip"``: gradzip's
            own transports (UCX on CPU, NCCL on GPU), connected through torch's
            rendezvous store.
        algorithm: ``"auto"`` (default: whichever of allgather and the
            two-phase scatter-reduce sends fewer bytes: allgather on 2 ranks,
            for onebit up to 15 ranks and for top-k up to 16; hierarchical
            across nodes of several ranks; docs/comm.md), ``"allgather"``,
            ``"scatter_reduce"``, ``"hierarchical"`` or ``"ring"``.
        server_codec: the codec spec scatter_reduce re-encodes each chunk's sum
            with (its second phase). None (default): the engine's default, fp16
            for onebit, the codec itself otherwise; ``"same"``: the codec
            itself. Error feedback follows ``codec``.
        communicator: with ``transport="gradzip"``, the communicator to use; by
            default one is made for this state at its first compressed bucket.
        exact_below: the layer filter (CGX's): parameters with at most one
            dimension (biases, norm weights) or fewer than this many elements
            are averaged exact (fp32), apart from the codec's part, whose block
            scales then never span them. None: no filter (every parameter
            through the codec). ``"auto"`` (default): under an adaptive
            optimizer (see ``adaptive``) and for top-k, the filter with
            1024; otherwise none. Without error feedback top-k leaves a bias
            or norm gain without a gradient on most steps, and Adam then barely
            moves it: on the LM the filter took top-k 1% from +9.2 / +13.2 /
            +13.2% to +4.9 / +9.4 / +10.3% of fp32's loss (seeds 0/1/2, 4
            ranks) at 17.9x fewer bytes than fp32 instead of 24.8x
            (BENCHMARKS.md section 11, "The hook's top-k under AdamW: the
            layer filter"). The exact parameters' bytes are counted in
            ``compression_stats()`` (``uncompressed_bytes_per_step``,
            ``wire_ratio``).
        adaptive: whether an adaptive optimizer (Adam, AdamW and the like:
            one that divides each coordinate by a running second moment)
            applies these gradients. ``"auto"`` (default): seen at the first
            ``step()`` of a torch optimizer over the model's parameters;
            ``True`` / ``False``: as given. For an adaptive optimizer, onebit
            and top-k run without error feedback (Adam's per-coordinate
            division turns its delayed repayments into noise: on the LM,
            onebit ended +27% with it and +3-8% without: BENCHMARKS.md
            section 11, "The hook's defaults with AdamW"), onebit in blocks
            of 128 unless the spec gives ``block=`` (on the LM 2.5-4.5
            points closer to fp32 than 512, at 11.4x instead of 14.2x), and
            scatter_reduce's onebit chunk sums go as qsgd 4-bit
            (``auto`` then runs scatter_reduce from 5 ranks, where
            allgather's bytes would grow past it: >= 8x fewer bytes than
            fp32 at any rank count); top-k keeps its biases and norm
            weights exact (``exact_below="auto"``). An ``ef=`` in the codec
            spec (or a :class:`gradzip.Codec`) and a ``server_codec`` are
            kept as given.
        warmup_until: opt-in, a warm-up that ends on a measured criterion
            (None, default: the fixed ``warmup_steps`` only). The hook sends
            fp32 (a plain allreduce) until the relative change of an EMA
            (decay 0.9) of the averaged gradient's norm has stayed below this
            tolerance for ``warmup_patience`` consecutive steps; at least
            ``warmup_steps`` steps, at most ``warmup_max``. The norm is taken
            from the allreduced gradient, which every rank holds
            bit-identically, so every rank ends the warm-up at the same step
            (the ranks also agree on it through the hook's agreement).
            BENCHMARKS.md section 11, "A warm-up that ends on a measured
            criterion".
        warmup_patience: consecutive calm steps that end the measured warm-up. Default 4.
        warmup_max: the measured warm-up's cap in steps. Default 64.
        precondition: compress in the adaptive optimizer's own units: each
            bucket is divided by the square root of the optimizer's second
            moment (Adam's bias-corrected ``exp_avg_sq``; Adamax's ``exp_inf``,
            RMSprop's ``square_avg``, Adagrad's ``sum``), floored at 1% of its
            mean over the bucket, before it is encoded, and the decoded
            average is multiplied back. Adam divides by it anyway, so onebit's
            one magnitude per block and top-k's choice are then made where
            the errors count (on the LM, top-k 1% went from +13-18% to
            +8-13%; onebit did not change beyond the seeds' spread:
            BENCHMARKS.md section 11, "The hook in the optimizer's units").
            ``"auto"`` (default): on for top-k once an adaptive optimizer
            that steps every parameter of the model is seen (from its
            second step: the first has no second moment yet); ``True``: the
            same for every codec; ``False``: off. Every rank holds the same second moment, so the
            ranks still end with the same bits; the ranks agree on the
            decision, and a restored state finds the restored optimizer
            (build and restore it before the first backward).
        momentum_correction: DGC's momentum correction, for onebit and top-k
            with error feedback under a non-adaptive optimizer with momentum
            (torch's SGD): each rank compresses its local momentum
            ``u = beta u + g`` instead of its gradient, and the hook returns
            ``S_t - beta S_{t-1}`` (S: the averaged decoded momentum), so that
            the optimizer's momentum buffer becomes S_t and the model moves
            by the averaged compressed momentum. ``"auto"`` (default): on when
            the optimizer seen at the first ``step()`` (as for ``adaptive``)
            is non-adaptive with one momentum in (0, 1) and no Nesterov,
            with that momentum, and onebit without a ``block=`` in its spec
            then runs in blocks of 128; ``None``: off; a float beta in
            (0, 1): on with it. ``True``/``False`` read as in
            CompressedSGD: ``"auto"`` (the optimizer's momentum) and off. Plain error feedback under momentum SGD swings: on digits at
            16 ranks onebit ended 10.8 points below fp32 (worst seed -20.8),
            with the correction within 1 (BENCHMARKS.md section 11, "digits
            under auto at 8 and 16 ranks"). The parameters' ``.grad`` then
            holds ``S_t - beta S_{t-1}``, not the averaged gradient (clip or
            log the gradient before it, or turn the correction off).

    Raises:
        ValueError: an unknown codec spec, transport or algorithm, a negative
            warmup, or arguments that do not go together (the message says why).

    Every rank ends each step with bit-identical gradients: all ranks decode
    the same payloads in the same order. The state's :meth:`state_dict` (one
    per rank: residuals differ between ranks) belongs in training checkpoints.
    """

    __slots__ = (
        # Configuration, fixed at construction.
        "process_group",
        "codec",
        "warmup_steps",
        "transport",
        "algorithm",
        "server_codec",
        "exact_below",
        "adaptive",
        "warmup_until",
        "warmup_patience",
        "warmup_max",
        "precondition",
        "momentum_correction",
        "_given_codec",  # the codec as built, before the adaptive defaults
        "_ef_given",  # the codec's error feedback was chosen by the caller
        "_block_given",  # onebit's block size was chosen by the caller
        "_codec_arg",  # the codec argument as given (a spec string or a Codec), for pickling
        "_given_server",
        # Internal state.
        "_world_size",  # 0 until the first hook call binds the state
        "_saved_world",  # world size of a state_dict loaded before binding
        "_dense",
        "_tracker",
        "_step",
        "_comm",
        "_worker",
        "_agreed",
        "_resume",  # whose per-rank state was restored (_resume.py)
        "_resume_pending",  # a state restored from gradzip's rank file, applied again at the next call
        "_ran",  # the algorithm the engine last ran
        "_exact",  # the layer filter's threshold in use (exact_below, or what "auto" decided), or None
        "_splits",  # layer filters: id(segment) -> (segment, _filters.Split or None)
        "_adaptive",  # None until decided (adaptive="auto"), then True or False
        "_seen",  # _Seen: adaptive="auto" watches the optimizer steps until it decides
        "_warm",  # _Warmup: the measured warm-up (warmup_until), or None
        "_precond",  # None until decided (precondition wanted), then True or False
        "_opt",  # weakref to the optimizer whose second moment preconditions the buckets
        "_mc",  # _momentum.MomentumCorrection while the momentum correction is on, else None
        # Statistics (totals since construction or the restored checkpoint).
        "_stats",
    )

    def __init__(
        self,
        codec: Union[str, Codec] = _quality.DEFAULT_CODEC,
        process_group: Optional[dist.ProcessGroup] = None,
        warmup_steps: int = 0,
        transport: str = "torch",
        algorithm: str = "auto",
        communicator: Any = None,
        server_codec: Optional[str] = None,
        exact_below: Union[str, int, None] = "auto",
        adaptive: Union[str, bool] = "auto",
        warmup_until: Optional[float] = None,
        warmup_patience: int = 4,
        warmup_max: int = 64,
        precondition: Union[str, bool] = "auto",
        momentum_correction: Union[str, float, None] = "auto",
    ) -> None:
        _filters.check(exact_below, auto=True)
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if warmup_until is not None and (isinstance(warmup_until, bool) or not isinstance(warmup_until, (int, float))
                                         or not 0.0 < warmup_until < 1.0):
            raise ValueError(f"warmup_until must be None or a tolerance in (0, 1), got {warmup_until!r}")
        for name, v in (("warmup_patience", warmup_patience), ("warmup_max", warmup_max)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if warmup_until is not None and warmup_max < warmup_steps:
            raise ValueError(f"warmup_max ({warmup_max}) must be >= warmup_steps ({warmup_steps}), the minimum")
        if adaptive not in ("auto", True, False):
            raise ValueError(f"adaptive must be 'auto', True or False, got {adaptive!r}")
        if precondition not in ("auto", True, False):
            raise ValueError(f"precondition must be 'auto', True or False, got {precondition!r}")
        if isinstance(momentum_correction, bool):  # CompressedSGD's on/off: on takes the optimizer's momentum
            momentum_correction = "auto" if momentum_correction else None
        if not (momentum_correction is None or (isinstance(momentum_correction, str) and momentum_correction == "auto")
                or (isinstance(momentum_correction, (int, float)) and not isinstance(momentum_correction, bool)
                    and 0.0 < momentum_correction < 1.0)):
            raise ValueError(f"momentum_correction must be 'auto', True, False, None or a momentum in (0, 1), "
                             f"got {momentum_correction!r}")
        _transports.check(transport, communicator)
        if algorithm not in _ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(_ALGORITHMS)}")

        self.codec = codec if isinstance(codec, Codec) else Codec(codec)
        self.process_group = process_group
        self.warmup_steps = warmup_steps
        self.transport = transport
        self.algorithm = algorithm
        # Canonical, so that ranks compare equal and a bad spec fails here.
        self.server_codec = server_codec_arg(server_codec)
        self._given_codec, self._given_server = self.codec, self.server_codec
        # What the caller chose, rather than left to the hook (C++ reads the spec: _core.spec_keys).
        given = None if not isinstance(codec, str) else _core.spec_keys(codec)
        self._ef_given = given is None or "ef" in given
        self._block_given = given is None or "block" in given
        self._codec_arg = codec  # pickled as given: the string as written, or the Codec
        self.adaptive = adaptive
        self.warmup_until = None if warmup_until is None else float(warmup_until)
        self.warmup_patience, self.warmup_max = warmup_patience, warmup_max
        self._warm = None if warmup_until is None or self.codec.name == "none" else _Warmup()
        # Only onebit's and top-k's defaults depend on the optimizer (measured).
        self._adaptive: Optional[bool] = None
        self._seen: Any = None
        self.precondition = precondition
        self._opt: Any = None
        # Decided with the optimizer (None) unless it cannot be wanted.
        self._precond: Optional[bool] = None if self._may_precondition() else False
        self.momentum_correction = (momentum_correction if momentum_correction in (None, "auto")
                                    else float(momentum_correction))
        self._mc: Optional[_momentum.MomentumCorrection] = None
        self.exact_below = None if self.codec.name == "none" else exact_below  # none: nothing to protect
        # The filter's threshold in use: exact_below, or for "auto" decided with the optimizer (_set_adaptive).
        self._exact: Optional[int] = None if self.exact_below == "auto" else self.exact_below
        self._splits: Dict[int, Any] = {}
        if adaptive != "auto" or self.codec.name not in _ADAPTIVE_CODECS:
            self._set_adaptive(adaptive is True)
            self._set_momentum(None)
        self._world_size = 0
        self._saved_world: Optional[int] = None
        # The none codec over torch's group: DDP's own allreduce, bit for bit.
        self._dense = self.codec.name == "none" and transport == "torch"
        self._tracker = _layout.Tracker()
        self._step = 0
        self._comm = communicator  # the given one, or made at the first compressed bucket
        self._worker = None
        self._agreed = False
        self._resume = _resume.Resume()
        self._resume_pending: Optional[Dict[str, Any]] = None
        self._ran: Optional[str] = None  # the algorithm the engine last ran (compression_stats)
        self._stats = _new_stats()

    @property
    def step(self) -> int:
        """Steps completed (the hook saw the last bucket of a backward pass)."""
        return self._step

    def compression_stats(self) -> Dict[str, float]:
        """Bytes per step, averaged over the steps so far, for this rank.

        Returns a dict with:
            steps: steps counted.
            dense_bytes_per_step: the gradient as DDP holds it (4 bytes per element,
                2 for a float16 or bfloat16 model).
            payload_bytes_per_step: what the codec produced (headers included;
                the dense gradient on warm-up and ``none`` steps).
            wire_bytes_per_step: what this rank sends to other ranks, as
                the communicator counts it (payloads; on warm-up and ``none``
                steps over torch's allreduce, modelled as a ring: 2(P-1)/P x
                the dense bucket).
            ratio: dense / payload bytes.
            wire_bytes, baseline_wire_bytes, wire_ratio: the keys every entry
                point reports (``_stats.py``): the totals sent and what DDP's
                ring allreduce of the buckets would have sent, and their ratio.
            uncompressed_steps: warm-up steps (the whole gradient sent uncompressed),
                fixed or measured (``warmup_until``).
            warmup_ended_at: with ``warmup_until``, the step the measured
                warm-up ended at (the first compressed step); -1 while it runs.
            uncompressed_bytes_per_step: the part of wire_bytes_per_step sent
                uncompressed: warm-up steps, and the parameters the layer
                filter keeps exact (``exact_below``). Both are in wire_ratio.
            preconditioned_buckets: bucket exchanges compressed in the
                optimizer's units (``precondition``).
            algorithm: what the engine ran for the last compressed bucket
                (``auto`` resolved: by the descriptors' rule, weighing the
                server codec the hook sends with); the configured one before.
        """
        s = self._stats
        steps = max(s["steps"], 1)
        p = max(self._world_size or self._saved_world or 1, 1)
        fp32_wire = _stats.ring(s["dense_bytes"], p)
        return {
            "steps": s["steps"],
            "dense_bytes_per_step": s["dense_bytes"] / steps,
            "payload_bytes_per_step": s["payload_bytes"] / steps,
            "wire_bytes_per_step": s["wire_bytes"] / steps,
            "ratio": s["dense_bytes"] / s["payload_bytes"] if s["payload_bytes"] else float("nan"),
            **_stats.core(s["wire_bytes"], fp32_wire),
            "uncompressed_steps": s["uncompressed_steps"],
            "uncompressed_bytes_per_step": (s["uncompressed_wire_bytes"] + s["exact_wire_bytes"]) / steps,
            **({} if self._warm is None else
               {"warmup_ended_at": -1 if self._warm.ended_at is None else self._warm.ended_at}),
            "preconditioned_buckets": s["preconditioned_buckets"],
            "algorithm": self._ran or self.algorithm,
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
            "codec": self._given_codec.spec,
            "adaptive": self._adaptive,  # None: not decided yet
            "adaptive_seen": self._seen.adaptive if self._seen is not None else None,  # seen, to decide next step
            "precondition": self._precond,  # None: not decided yet
            "momentum_seen": self._seen.momentum if self._seen is not None else None,
            "transport": self.transport,
            "world_size": self._world_size or self._saved_world,
            "saved_by": _resume.saved_by(dist.get_rank(self.process_group) if self._world_size else None,
                                         self._world_size),
            "step": self._step,
            "shapes": [list(s) for s in self._tracker.shapes()],
            "segments": segments,
            "stats": dict(self._stats),
            **({} if self._warm is None else {"warmup": self._warm.state_dict()}),
            **({} if self._mc is None else {"momentum_correction": self._mc.state_dict()}),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output, saved on this rank. Training then
        continues bit-identically, provided DDP buckets the gradients as the
        saved run did (see docs/python.md, "Checkpoints").

        May be called before the state is bound (before the process group
        exists): the world size is then checked at the first hook call.

        Raises:
            ValueError: the state was saved with another codec, transport or
                world size, or for another model.
        """
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a gradzip CompressionState state_dict (version {_STATE_VERSION})")
        for key, mine in (("codec", self._given_codec.spec), ("transport", self.transport)):
            if state.get(key) != mine:
                raise ValueError(f"the state_dict was saved with {key}={state.get(key)!r}, this state has {mine!r}")
        step = state.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"the state_dict's step must be an integer >= 0, got {step!r}")
        stamp = _resume.checked_stamp(state)
        saved_world = state.get("world_size")
        if saved_world is not None and (not isinstance(saved_world, int) or isinstance(saved_world, bool)
                                        or saved_world < 1):
            raise ValueError(f"the state_dict's world_size must be a positive integer, got {saved_world!r}")
        segments = []
        for entry in _listed(state, "segments", dict):
            keys, numels = _listed(entry, "keys", int), _listed(entry, "numels", int)
            if len(keys) != len(numels) or any(m < 0 for m in numels):
                raise ValueError("the state_dict's segment keys and numels do not match")
            ef = self._new_ef()  # its load_state_dict checks the residuals (finite, checksummed bytes)
            ef.load_state_dict(entry.get("ef"))  # InvalidArgument (a ValueError) when malformed
            segments.append(_layout.Segment(keys, numels, ef))
        shapes = [tuple(_listed({"shape": s}, "shape", int)) for s in _listed(state, "shapes", list)]
        adaptive = state.get("adaptive")
        if adaptive not in (None, True, False):
            raise ValueError(f"the state_dict's adaptive must be None, True or False, got {adaptive!r}")
        if adaptive is not None and self.adaptive != "auto" and self._adaptive != adaptive:
            raise ValueError(f"the state_dict was saved with adaptive={adaptive!r}, this state has "
                             f"adaptive={self.adaptive!r}")
        stats = state.get("stats", {})
        if not isinstance(stats, dict) or any(k not in _new_stats() or not isinstance(v, (int, float))
                                              for k, v in stats.items()):
            raise ValueError(f"the state_dict's stats must be a dict of {', '.join(_new_stats())}")
        warm = None
        if self._warm is not None:
            if "warmup" not in state:
                raise ValueError("the state_dict was saved without warmup_until; this state has "
                                 f"warmup_until={self.warmup_until!r}")
            warm = _Warmup.from_state(state["warmup"])
        elif "warmup" in state:
            raise ValueError("the state_dict was saved with warmup_until; this state has none")
        precond = state.get("precondition", False)  # a checkpoint from before it existed: off
        if precond not in (None, True, False) or (precond is not False and not self._may_precondition()):
            raise ValueError(f"the state_dict was saved with precondition={precond!r}, this state has "
                             f"precondition={self.precondition!r} (codec {self._given_codec.spec!r})")
        mc = None
        if "momentum_correction" in state:
            if self.momentum_correction is None:
                raise ValueError("the state_dict was saved with the momentum correction on; this state has "
                                 "momentum_correction=None")
            mc = _momentum.MomentumCorrection.from_state(state["momentum_correction"])
        momentum_seen = state.get("momentum_seen")
        if momentum_seen is not None and (isinstance(momentum_seen, bool) or not isinstance(momentum_seen, float)):
            raise ValueError(f"the state_dict's momentum_seen must be None or a float, got {momentum_seen!r}")
        self._tracker.restore(shapes, segments)
        if warm is not None:
            self._warm = warm
        if self.adaptive == "auto" and self._given_codec.name in _ADAPTIVE_CODECS:
            if self._seen is not None:
                self._seen.close()
            self._seen = None
            self._adaptive = None
            self.codec, self.server_codec = self._given_codec, self._given_server
            if self.exact_below == "auto":
                self._exact, self._splits = None, {}
            if adaptive is not None:
                self._set_adaptive(adaptive)
            elif state.get("adaptive_seen") in (True, False) and step > 0:
                # Saved after the optimizer's step, before the hook decided: decide at the next call, as the
                # saved run did.
                self._seen = _Seen(step - 1)
                self._seen.adaptive = state["adaptive_seen"]
                self._seen.momentum = momentum_seen
        if self._adaptive is None:
            self._mc = None  # decided at the next calls, as in the saved run
        else:  # the saved run's correction, or off (a beta given: on, from zero)
            self._set_momentum(None if mc is None else mc.beta)
            if mc is not None:
                self._mc = mc
        self._precond, self._opt = precond, None  # on: the restored optimizer is found at the first bucket
        if precond is None and self._seen is None and step > 0:
            self._seen = _Seen(step - 1)  # saved before the decision: decide at the first call, as the saved run did
        if not self._world_size:
            self._saved_world = saved_world
        self._resume.loaded(stamp, saved_world, dist.get_rank(self.process_group) if self._world_size else None,
                            self._world_size or None)
        self._step = int(state["step"])
        self._agreed = False  # the ranks check again that all of them restored
        self._stats = _new_stats()
        self._stats.update(stats)

    # -- pickling (frameworks build the state before the process group) ------

    def __getstate__(self) -> Dict[str, Any]:
        if self.process_group is not None:
            raise TypeError("a CompressionState with an explicit process_group cannot be pickled (a process "
                            "group cannot be); use the default group, or build the state in each rank")
        # The argument as given keeps "the block and the error feedback are the hook's to choose" (or not).
        return {"codec": self._codec_arg, "warmup_steps": self.warmup_steps, "transport": self.transport,
                "algorithm": self.algorithm, "server_codec": self._given_server, "exact_below": self.exact_below,
                "adaptive": self.adaptive, "warmup_until": self.warmup_until,
                "warmup_patience": self.warmup_patience, "warmup_max": self.warmup_max,
                "precondition": self.precondition,
                "momentum_correction": self.momentum_correction, "state": self.state_dict()}

    def __setstate__(self, d: Dict[str, Any]) -> None:
        self.__init__(codec=d["codec"], warmup_steps=d["warmup_steps"],  # type: ignore[misc]
                      transport=d["transport"], algorithm=d["algorithm"], server_codec=d.get("server_codec"),
                      exact_below=d.get("exact_below"), adaptive=d.get("adaptive", "auto"),
                      warmup_until=d.get("warmup_until"), warmup_patience=d.get("warmup_patience", 4),
                      warmup_max=d.get("warmup_max", 64), precondition=d.get("precondition", "auto"),
                      momentum_correction=d.get("momentum_correction", "auto"))
        self.load_state_dict(d["state"])

    # -- internals ------------------------------------------------------------

    def _bind(self) -> None:
        """The first hook call: the process group exists now."""
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call init_process_group before training "
                               "(the hook binds to the process group at its first call)")
        world = dist.get_world_size(self.process_group)
        rank = dist.get_rank(self.process_group)
        self._resume.bind(rank, world)  # a state restored before: this rank's own, or not (_resume.py)
        self._saved_world = None
        self._world_size = world
        logger.info("gradzip DDP hook: codec=%s transport=%s algorithm=%s warmup_steps=%d world_size=%d",
                    self.codec.spec, self.transport, self.algorithm, self.warmup_steps, world)

    def _drop_rank_state(self) -> None:
        """The ranks agreed that not every rank restored its own state
        (_resume.py): every rank drops its residuals and local momentum."""
        for seg in self._tracker.segments():
            seg.ef.reset()
        if self._mc is not None:
            self._mc = _momentum.MomentumCorrection(self._mc.beta)

    def _connect(self) -> None:
        """The first compressed bucket: this state's communicator and worker thread."""
        self._comm = _transports.connect(self.transport, self.process_group, self._comm, None)
        self._worker = _worker.Worker()

    def _new_ef(self) -> Any:
        from .. import ErrorFeedback

        return ErrorFeedback()

    def _make_ef(self, n: int, sources: List[_layout.Source]) -> Any:
        """Error feedback of a new segment. Residuals live in C++ per bucket
        (worker and server) and do not split by parameter: a bucket DDP
        rebuilt starts from zero (expected once, after DDP's provisional first
        step: one step's residual)."""
        held = any(src is not None and src.bound for src, _, _ in sources)
        if held and self.codec.error_feedback:
            log = logger.info if self._step <= 1 else logger.warning
            log("gradzip DDP hook: DDP changed its buckets; the error feedback of the affected buckets "
                "restarts from zero")
        return self._new_ef()

    def _split(self, seg: Any) -> Any:
        """The layer filter's split of a segment (None: compressed whole); cached."""
        if self._exact is None:
            return None
        cached = self._splits.get(id(seg))
        if cached is None or cached[0] is not seg:
            cached = self._splits[id(seg)] = (seg, _filters.split_of(seg, self._tracker.shapes(), self._exact))
        return cached[1]

    def _set_adaptive(self, adaptive: bool) -> None:
        """The codec and server codec for an adaptive optimizer or not (the docstring's ``adaptive``)."""
        self._adaptive = adaptive
        codec, server = self._given_codec, self._given_server
        if adaptive:
            _quality.warn_adaptive(codec.spec, codec.name)
        if adaptive and codec.name in _ADAPTIVE_CODECS:
            if codec.error_feedback and not self._ef_given:
                codec = Codec(_core.respec(codec.spec, "ef=off"))
            if codec.name == "onebit" and not self._block_given:
                codec = Codec(_core.respec(codec.spec, f"block={_ADAPTIVE_ONEBIT_BLOCK}"))
            if server is None and codec.name == "onebit":
                server = Codec(_ADAPTIVE_ONEBIT_SERVER).spec
        self.codec, self.server_codec = codec, server
        if self.exact_below == "auto":
            exact = _ADAPTIVE_EXACT_BELOW if adaptive and codec.name in _FILTERED_CODECS else None
            if exact != self._exact:
                self._exact, self._splits = exact, {}

    def _decide(self, bucket: dist.GradBucket) -> None:
        """adaptive="auto" (and the preconditioning): watches the optimizer
        steps over the bucket's parameters; at the first hook call after a
        step, decides, and the ranks agree on the decision (a rank deciding
        otherwise raises)."""
        if self._seen is None:
            self._seen = _Seen(self._step)
        if self._step <= self._seen.since:
            self._seen.watch(bucket.parameters())
            return
        self._seen.close()
        seen, self._seen = self._seen, None
        self._agreed = False
        if self._adaptive is None:
            adaptive = bool(seen.adaptive)
            self._set_adaptive(adaptive)
            self._set_momentum(seen.momentum)
            if (self.codec is not self._given_codec or self.server_codec != self._given_server
                    or self._exact is not None):
                # Step 1's residuals belong to the other codec (or, from 5 ranks, to allgather): dropped.
                for seg in self._tracker.segments():
                    seg.ef.reset()
            logger.info("gradzip DDP hook: %s optimizer; codec=%s server_codec=%s momentum correction %s",
                        "an adaptive" if adaptive else "no adaptive", self.codec.spec, self.server_codec,
                        "off" if self._mc is None else f"beta={self._mc.beta}")
        if self._precond is None:
            self._decide_precondition(seen, bucket)

    def _may_precondition(self) -> bool:
        """Whether the settings allow preconditioning (then the optimizer decides)."""
        if self.precondition is False or self.adaptive is False or self._given_codec.name == "none":
            return False
        return self.precondition is True or self._given_codec.name in _PRECONDITIONED_CODECS

    def _decide_precondition(self, seen: Any, bucket: dist.GradBucket) -> None:
        """On when the optimizer is adaptive, its second moment readable, and
        it steps every parameter the hook saw (not so a ZeroRedundancyOptimizer's
        shard, which would differ between ranks). A watch restored from a
        checkpoint saw no parameters: the optimizer over this bucket then."""
        opt = seen.optimizer() if seen.optimizer is not None else None
        covers = seen.covers
        if opt is None and not seen.params:
            opt = _precondition.holding(bucket.parameters())
            covers = opt is not None
        on = opt is not None and covers and _precondition.supported(opt)
        self._precond, self._opt = on, (weakref.ref(opt) if on else None)
        logger.info("gradzip DDP hook: preconditioning by the optimizer's second moment: %s",
                    f"on ({type(opt).__name__})" if on else "off")

    def _scale(self, bucket: dist.GradBucket, plan: Any) -> Optional[torch.Tensor]:
        """The bucket's preconditioner d (None: not this step: no second moment yet)."""
        opt = self._opt() if self._opt is not None else None
        if opt is None:  # a restored state, or the optimizer was replaced: the one over these parameters
            opt = _precondition.holding(bucket.parameters())
            if opt is None or not _precondition.supported(opt):
                raise ValueError("gradzip DDP hook: this state preconditions the gradients by the adaptive "
                                 "optimizer's second moment, and no one torch optimizer with a second moment "
                                 "steps this bucket's parameters: build (and restore) the optimizer before the "
                                 "first backward, or set precondition=False")
            self._opt = weakref.ref(opt)
        return _precondition.scale(opt, bucket.parameters(), plan.cache)

    def _set_momentum(self, seen: Optional[float]) -> None:
        """The momentum correction (the docstring's ``momentum_correction``),
        once the optimizer is decided; `seen`: the momentum the optimizer seen
        has (None: none that the correction applies to, or not seen)."""
        beta = self.momentum_correction if isinstance(self.momentum_correction, float) else (
            seen if self.momentum_correction == "auto" else None)
        on = (beta is not None and self._adaptive is False and self.codec.name in _ADAPTIVE_CODECS
              and self.codec.error_feedback)
        self._mc = _momentum.MomentumCorrection(beta) if on else None
        if on and self.codec.name == "onebit" and not self._block_given:
            # With the correction, onebit's blocks of 512 still lost up to 2.5 points at 8 ranks on digits;
            # blocks of 128 held fp32's accuracy at 8 and 16 ranks (BENCHMARKS.md section 11).
            self.codec = Codec(_core.respec(self.codec.spec, f"block={_SGD_ONEBIT_BLOCK}"))

    def _warming(self, bucket: dist.GradBucket) -> bool:
        """Whether this step is a warm-up step (fp32 allreduce). With
        ``warmup_until``, the first bucket of each step folds the previous
        step's averaged-gradient norm into the criterion (its futures are
        done: DDP waited for them); ending it re-runs the ranks' agreement."""
        if self._warm is None:
            return self._step < self.warmup_steps
        w = self._warm
        if w.ended_at is None and w.decided < self._step:
            if w.decide(self._step, self.warmup_until, self.warmup_patience, self.warmup_steps, self.warmup_max):
                self._agreed = False  # every rank must have ended it at this step: checked before the branch
                logger.info("gradzip DDP hook: the measured warm-up ended at step %d (norm EMA %s)",
                            self._step, w.ema)
        return w.ended_at is None

    def _count(self, dense: int, payload: int, wire: float) -> None:
        s = self._stats
        s["dense_bytes"] += dense
        s["payload_bytes"] += payload
        s["wire_bytes"] += wire

    def __repr__(self) -> str:
        return (f"CompressionState(codec='{self.codec.spec}', transport='{self.transport}', "
                f"warmup_steps={self.warmup_steps}, "
                f"{'' if self.warmup_until is None else f'warmup_until={self.warmup_until}, '}"
                f"adaptive={'auto' if self._adaptive is None else self._adaptive}, "
                f"precondition={'auto' if self._precond is None else self._precond}, step={self._step})")


# The codecs whose defaults depend on the optimizer, and onebit's server codec
# for an adaptive one (BENCHMARKS.md section 11, "The hook's defaults with AdamW").
_ADAPTIVE_CODECS = ("onebit", "topk")
_ADAPTIVE_ONEBIT_SERVER = "qsgd:bits=4"
# onebit's block size for an adaptive optimizer, unless the spec gives one:
# one magnitude per 128 coordinates instead of 512 (on the LM: +3.2/+8.0/+9.6%
# -> +2.6/+3.7/+5.1% at 4 ranks seeds 0/1 and 8 ranks, 14.2x -> 11.4x).
_ADAPTIVE_ONEBIT_BLOCK = 128
# The codecs precondition="auto" preconditions: top-k (measured: 4-10 points
# closer to fp32 on the LM); onebit was unchanged within the seeds' spread
# (BENCHMARKS.md section 11, "The hook in the optimizer's units").
_PRECONDITIONED_CODECS = ("topk",)
# exact_below="auto": the layer filter for an adaptive optimizer, for these codecs, with this threshold
# (on the LM top-k 1% went 3-4 points closer to fp32 with it: BENCHMARKS.md section 11,
# "The hook's top-k under AdamW: the layer filter").
_FILTERED_CODECS = ("topk",)
_ADAPTIVE_EXACT_BELOW = 1024
# onebit's block size under the momentum correction (a non-adaptive optimizer), unless the spec gives one.
_SGD_ONEBIT_BLOCK = 128


class _Seen(_precondition.Watch):
    """adaptive="auto" and the preconditioning: torch's global optimizer step
    pre-hook, while the state decides (from the first hook call after step
    `since`). Holds the watched parameters' ids and no reference to the state."""

    def __init__(self, step: int) -> None:
        super().__init__(is_adaptive)
        self.since = step
        self.momentum: Optional[float] = None  # the momentum correction's beta (_momentum.optimizer_momentum)

    def _observe(self, optimizer: Any, mine: set) -> None:
        super()._observe(optimizer, mine)
        if self.params & mine:
            self.momentum = _momentum.optimizer_momentum(optimizer, self.params)


class _Warmup:
    """The measured warm-up's criterion (``warmup_until``). Per step, the
    averaged gradient's norm n_t (float64 sum of squares per bucket, summed in
    bucket order, the root rounded to float32 so that a reduction order
    differing in the last bits between ranks cannot tip a decision), its EMA
    e_t = 0.9 e_{t-1} + 0.1 n_t (e_1 = n_1), and the relative change
    r_t = |e_t - e_{t-1}| / e_{t-1}. The warm-up ends at the start of step s
    (the first compressed step) when s >= warmup_max, or when s >= warmup_steps
    and the last `patience` values of r were all below the tolerance."""

    DECAY = 0.9

    def __init__(self) -> None:
        self.sums: Dict[int, float] = {}  # bucket index -> sum of squares of the step being collected
        self.ema: Optional[float] = None
        self.calm = 0  # consecutive steps with r below the tolerance
        self.decided = 0  # the step the criterion last ran at (step 0 is always warm-up)
        self.ended_at: Optional[int] = None
        self.trace: List[Tuple[float, float, float]] = []  # (norm, EMA, change) per step since built: not saved

    def collect(self, index: int, averaged: torch.Tensor) -> None:
        self.sums[index] = float(torch.sum(torch.square(averaged.detach().to(torch.float64))))

    def decide(self, step: int, tol: float, patience: int, least: int, cap: int) -> bool:
        """At the start of `step`: fold the last step's norm; whether the warm-up ends now."""
        self.decided = step
        if self.sums:
            norm = float(torch.tensor(math.sqrt(sum(self.sums[k] for k in sorted(self.sums))), dtype=torch.float32))
            self.sums = {}
            prev, self.ema = self.ema, norm if self.ema is None else self.DECAY * self.ema + (1 - self.DECAY) * norm
            change = abs(self.ema - prev) / prev if prev is not None and prev > 0 else math.inf
            self.calm = self.calm + 1 if change < tol else 0
            self.trace.append((norm, self.ema, change))
            logger.debug("gradzip DDP hook: warm-up step %d: norm %.6g, EMA %.6g, change %.4g", step - 1, norm,
                         self.ema, change)
        if step >= cap or (step >= least and self.calm >= patience):
            self.ended_at = step
        return self.ended_at is not None

    def state_dict(self) -> Dict[str, Any]:
        return {"sums": [[k, v] for k, v in sorted(self.sums.items())], "ema": self.ema, "calm": self.calm,
                "decided": self.decided, "ended_at": self.ended_at}

    @classmethod
    def from_state(cls, d: Any) -> "_Warmup":
        w = cls()
        try:
            w.sums = {int(k): float(v) for k, v in d["sums"]}
            w.ema = None if d["ema"] is None else float(d["ema"])
            w.calm, w.decided = int(d["calm"]), int(d["decided"])
            w.ended_at = None if d["ended_at"] is None else int(d["ended_at"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"the state_dict's warmup is malformed: {d!r:.120}") from None
        return w


def _new_stats() -> Dict[str, Any]:
    # uncompressed_*: the warm-up's steps and wire bytes; exact_wire_bytes: the
    # layer filter's exactly averaged parameters (a checkpoint without them,
    # from before they were counted, loads with zeros).
    return {"steps": 0, "dense_bytes": 0, "payload_bytes": 0, "wire_bytes": 0.0,
            "uncompressed_steps": 0, "uncompressed_wire_bytes": 0.0, "exact_wire_bytes": 0.0,
            "preconditioned_buckets": 0}


def _listed(d: Dict[str, Any], key: str, kind: type) -> List[Any]:
    """d[key], a list of `kind`; ValueError naming the key when it is not one."""
    value = d.get(key) if isinstance(d, dict) else None
    if not isinstance(value, list) or any(not isinstance(v, kind) or isinstance(v, bool) for v in value):
        raise ValueError(f"the state_dict's {key!r} must be a list of {kind.__name__}, got {value!r:.80}")
    return value


# Bucket dtypes the hook takes: a model kept in bfloat16 or float16 gives
# buckets of that dtype. gradzip encodes them as their exact float32 widening,
# keeps the residuals in float32 and rounds the average once into the bucket.
_GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket's gradients across ranks,
    sending gradzip-compressed payloads.

    0. On the first call: bind the state to the process group (see
       :class:`CompressionState`), then check that every rank's hook has the
       same settings (codec, warm-up, step, transport, bucket layout; see
       ``_agreement.py``). A mismatch raises :class:`gradzip.InvalidArgument`
       on every rank instead of a hang. With ``adaptive="auto"`` (onebit,
       top-k): the first calls note the bucket's parameters for the
       optimizer step pre-hook; the first call after an optimizer step
       decides whether the optimizer is adaptive, sets the codec, server
       codec and error feedback to match, and the ranks agree again.
    1. Before ``state.warmup_steps``, or until the measured warm-up
       (``warmup_until``) ends (and for the ``none`` codec over the torch
       transport): divide by the world size and allreduce the bucket
       with torch, in its dtype, exactly as DDP does.
    2. Otherwise hand the bucket to the state's worker thread, in DDP's
       bucket order, and return at once: the worker runs gradzip's
       compressed allreduce on it (pipelined encode, exchange and decode,
       with error feedback per bucket; the average lands in
       ``bucket.buffer()`` in place, bit-identical on every rank), over the
       state's transport. Nothing is started from a future's callback. The
       call for the last bucket waits for the step's exchanges, so errors
       surface from ``backward()`` with their gradzip type.

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
    if buffer.dtype not in _GRAD_DTYPES:
        raise ValueError(
            f"gradzip compresses float32, float16 and bfloat16 gradients; this bucket is {buffer.dtype}")
    if state._resume_pending is not None:  # restored from gradzip's rank file: again, over what a stack restored
        pending, state._resume_pending = state._resume_pending, None
        state.load_state_dict(pending)
    if not state._world_size:  # the first call: the process group exists now
        state._bind()
    if state._adaptive is None or state._precond is None:  # adaptive="auto" or the preconditioning: undecided
        state._decide(bucket)
    if not state._agreed:  # first call: every rank checks the others' settings before taking a branch
        if not state._resume.settled and state._resume.status == _resume.FRESH:
            _warn_if_resumed_without_state(bucket)
        # The settings, and after a start or a restore whose state each rank restored (_resume.py): raises
        # unless only whose error feedback differs.
        if state._resume.agreed(lambda: _agreement.check(state, bucket), "DDP hook"):
            state._drop_rank_state()
        state._agreed = True
    warming = state._warming(bucket)
    if not state._agreed:  # the measured warm-up ended: every rank must end it at this step
        _agreement.check(state, bucket)
        state._agreed = True
    plan = state._tracker.plan(bucket.index(), bucket.parameters(), buffer.numel(), state._make_ef)
    scale = None
    if state._precond and not (state._dense or warming):
        scale = state._scale(bucket, plan)
        if scale is not None:
            state._stats["preconditioned_buckets"] += 1
    if state._dense or warming:
        fut = _allreduce_dense(state, buffer)
        if state._warm is not None and warming:
            warm, index = state._warm, bucket.index()

            def collected(f: Any) -> torch.Tensor:
                warm.collect(index, f.value())
                return f.value()

            fut = fut.then(collected)
    else:
        if state._worker is None:
            state._connect()
        mc = state._mc
        if mc is not None:  # momentum correction: the codec gets the local momentum (_momentum.py)
            keys = plan.cache.get("momentum_keys")
            if keys is None:
                keys = plan.cache["momentum_keys"] = (tuple(state._tracker._keys_of(plan.params)),
                                                      [p.numel() for p in plan.params])
            flat = mc.before(keys[0], keys[1], buffer)
        fut = _worker.exchange(state, plan, buffer, bucket.is_last(), scale)
        if mc is not None:
            fut = fut.then(lambda f: mc.after(flat, f.wait()))
    if bucket.is_last():
        if warming and not state._dense:
            state._stats["uncompressed_steps"] += 1
        state._tracker.end_step()
        state._step += 1
        state._stats["steps"] += 1
    return fut


def _warn_if_resumed_without_state(bucket: dist.GradBucket) -> None:
    """A fresh hook whose optimizer already holds state (momentum, Adam's
    moments) at the process's first backward: a run resumed from a checkpoint
    that did not carry the hook's state (a stack's own checkpoint saves the
    optimizer, never the hook). Says so once; the hook starts fresh."""
    global _resumed_warned
    if _resumed_warned:
        return
    if not any(opt.state for opt in _precondition.over(bucket.parameters())):
        return
    _resumed_warned = True
    msg = ("gradzip DDP hook: the optimizer already holds state at this process's first backward, but the hook's "
           "state is fresh: if this run resumed from a checkpoint, it did not carry gradzip's state, and the hook "
           "restarts (step 0, warm-up, no residuals). gradzip.integrations (Trainer, Accelerate, Lightning) or "
           "gradzip.torch.checkpoint carry it.")
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    logger.warning("%s", msg)


_resumed_warned = False


def _allreduce_dense(state: CompressionState, buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """What DDP does without a hook: scale by 1/P (the same multiply), allreduce."""
    p = state._world_size
    nbytes = buffer.numel() * buffer.element_size()
    state._count(nbytes, nbytes, nbytes * 2 * (p - 1) / p)
    if not state._dense:
        state._stats["uncompressed_wire_bytes"] += nbytes * 2 * (p - 1) / p
    buffer.mul_(1.0 / p)
    fut = dist.all_reduce(buffer, group=state.process_group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])
