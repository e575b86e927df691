"""Block momentum (BMUF) over slow links: each rank takes H local optimizer
steps, then the ranks average the block's model update once, compressed, and
a block-level momentum filters it.

Chen and Huo, "Scalable training of deep learning machines by incremental
block training with intra-block parallel optimization and blockwise
model-update filtering", ICASSP 2016. DiLoCo's outer optimizer (SGD with
Nesterov momentum on the averaged update) is the same filter with
``nesterov=True``.
"""

import contextlib
import hashlib
import logging
import math
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import torch

from .. import ErrorFeedback, _core
from ..codec import Codec, server_codec_arg
from . import _block_exchange, _filters, _quality, _resume, _stats, _transports

__all__ = ["BlockMomentum"]

logger = logging.getLogger(__name__)

_STATE_VERSION = 1
# block_momentum="auto": measured (issue 22; docs/python.md, "Defaults and the local optimizer").
_AUTO_ADAPTIVE = 0.0  # Adam-family local optimizers (the LM experiment)
_AUTO_OTHER = 0.5     # SGD tuned for DDP (digits)
_ALGORITHMS = tuple(_core.allreduce_algorithm_names())  # the C++ registry (comm/algorithms/registry.h)


class BlockMomentum:
    """Blockwise model-update filtering around a local optimizer: each rank
    trains its own full copy of the model and the ranks meet once every
    ``block_steps`` steps, sending a compressed model update.

    Use it instead of DDP (not inside it), with torch.distributed
    initialised (torchrun, Lightning, ...)::

        model = Net()                                   # no DistributedDataParallel
        local = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8)
        opt = BlockMomentum(model, local, block_steps=16, codec="onebit")
        for x, y in this_ranks_batches:
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
        opt.sync()                                      # end the last, partial block
        with opt.global_model():                        # W, the same bits on every rank
            evaluate(model)

    A block, with P ranks, the global model W and the block momentum Delta
    (both the same bits on every rank):

    1. Every rank starts the block from x = W (``nesterov=False``) or from the
       look-ahead x = W + mu * Delta (``nesterov=True``, BMUF-NBM).
    2. Each rank runs ``block_steps`` steps of its own ``local_optimizer``
       on its own batches; nothing is exchanged in between.
    3. The ranks average their updates G = mean(W_local - x) with gradzip's
       compressed allreduce (any codec; its error feedback is kept per buffer
       and carried from block to block).
    4. Delta = mu * Delta + zeta * G;  W = W + Delta. The next block starts
       from step 1.

    With ``nesterov=True`` this is Nesterov's method at the block level, and
    the same as DiLoCo's outer ``torch.optim.SGD(lr=zeta, momentum=mu,
    nesterov=True)`` stepping on the outer gradient ``x - mean(W_local)``.
    The update is measured from where the block started (for
    ``nesterov=False`` that is W itself), so the look-ahead mu * Delta is not
    counted a second time. In float32, in this order, on every rank: ``x =
    (Delta * mu) + W``; ``G = (W_local - x)`` averaged by the allreduce (sum
    of the decoded updates in rank order, times float32 1/P);
    ``G = G * zeta``; ``Delta = (Delta * mu) + G``; ``W = W + Delta``.

    Args:
        module_or_params: an ``nn.Module`` (its parameters that require grad,
            and its float32 buffers, which are averaged in fp32 at each block
            end, unfiltered: batch norm statistics) or an iterable of
            parameters. float32, all on one device. Rank 0's values are
            broadcast at construction, so every rank starts from the same W.
        local_optimizer: the optimizer each rank steps between exchanges
            (any ``torch.optim.Optimizer`` over these parameters). Its own
            state (momentum buffers) stays local and is not reset.
        block_steps: H, local steps per block. Default 16. The bytes per step
            fall by H x the codec's ratio.
        sync_steps: the first ``sync_steps`` steps each end a block of one
            step (the ranks meet every step, still through the codec), then
            blocks of ``block_steps``: post-local SGD's synchronous start
            (Lin et al., ICLR 2020), e.g. over the learning-rate warm-up.
            Default 0.
        codec: gradzip spec (``"onebit"``, ``"topk:density=0.01"``, ``"none"``,
            ...) or a :class:`gradzip.Codec`. Default ``"onebit"``.
        block_momentum: mu in [0, 1); None for the paper's 1 - 1/P; or
            ``"auto"`` (default): 0 when the local optimizer is adaptive
            (Adam, AdamW, RMSprop, Adagrad, ...: the hook's test), else 0.5. The
            paper's value assumes a local optimizer tuned for one rank and
            lost 8-25 points on digits with a DDP-tuned SGD, where 0.5 held
            (docs/python.md); on the LM experiment with AdamW inside, onebit
            at H = 8 ended +5.1% at mu 0, +18.8% at 0.5 and +32.6% with
            DiLoCo's 0.9 and block_lr 0.7 (BENCHMARKS.md section 11).
        block_lr: zeta > 0. Default 1 (the paper's).
        nesterov: start each block from the look-ahead (BMUF-NBM). Default True.
        overlap: start each block's exchange in the background and go on
            with the next block's local steps at once. The average goes
            through the filter one block late; meanwhile each rank starts the
            next block from the agreed start plus its own update. Costs one
            model copy more. Default False. Works over either transport; over
            an NCCL group with ``transport="torch"`` the exchange in flight
            shares the group's communicator, so give BlockMomentum a group
            of its own if the training loop runs collectives meanwhile
            (gloo keeps them apart by tag).
        transport: what carries the exchange; either way it is gradzip's
            compressed allreduce (the same C++ algorithms, the same bits).
            ``"torch"`` (default): ``process_group`` itself, through its
            point-to-point calls (gloo on CPU, NCCL on GPU), no other
            connections: the DDP hook's default transport. ``"gradzip"``:
            gradzip's own transports (UCX on CPU, NCCL on GPU), connected
            through torch's rendezvous store, or ``communicator``.
        process_group: the torch group whose ranks train together (default
            WORLD).
        communicator: with ``transport="gradzip"``, a
            :class:`gradzip.Communicator` to use (made by the caller, e.g.
            ``Communicator.from_env``: then torch.distributed is not needed);
            by default one is made over ``process_group``'s ranks.
        algorithm: the communicator's ``"auto"``, ``"allgather"``,
            ``"scatter_reduce"``, ``"hierarchical"`` or ``"ring"`` (the registry's
            allreduce algorithms, ``gradzip.allreduce_algorithm_names()``).
        server_codec: the spec scatter_reduce re-encodes each chunk's sum
            with (:meth:`gradzip.Communicator.allreduce`); None: the engine's
            default (fp16 for onebit); ``"same"``: the codec itself. ``algorithm="scatter_reduce",
            server_codec="onebit"`` sends the fewest bytes with onebit at 3-15
            ranks (about half of what ``auto``'s allgather sends at 4 ranks;
            BENCHMARKS.md section 7 has both).
        bucket_elements: the update travels as buffers of at most this many
            elements, each with its own error feedback. Default 2**26 (256 MiB).
        exact_below: the layer filter, as the DDP hook's (CGX's): parameters
            with at most one dimension (biases, norm weights) or fewer than
            this many elements are averaged exact (fp32, gradzip's ``none``:
            the same bits on every rank); the others are gathered end to end
            and sent through the codec (in buffers of ``bucket_elements``),
            so a block scale never spans a parameter of the other kind
            (one model copy more, the two gathered parts). None (default):
            every parameter through the codec.

    Raises:
        ValueError: a bad value or arguments that do not go together (the
            message says why), e.g. a DDP module, non-float32 parameters, or a
            local optimizer that trains parameters BMUF does not synchronize;
            on every rank, when the ranks' hyperparameters or parameter shapes
            differ (the message names each setting that differs, and the
            ranks).

    Collective: every rank constructs it, calls :meth:`step` as often,
    and calls :meth:`sync` and :meth:`state_dict` at the same points.
    :meth:`state_dict` holds the whole state (one per rank: the residuals of
    error feedback differ) and a restore continues bit-identically.
    """

    __slots__ = (
        # Tuned hyperparameters.
        "block_steps",
        "sync_steps",
        "block_momentum",
        "block_lr",
        # Options, fixed at construction.
        "nesterov",
        "overlap",
        "transport",
        "codec",
        "algorithm",
        "server_codec",
        "bucket_elements",
        "exact_below",
        "local_optimizer",
        "world_size",
        # What BMUF keeps in step: the trained parameters (flattened in this
        # order) and the module's float32 buffers.
        "_params",
        "_offsets",
        "_buffers",
        "_n",
        "_payload_bytes",  # what the codec makes of one block's update
        "_split",  # the layer filter's _filters.Split of the flat model (None: no filter)
        # Internal state. W and Delta: flat float32 on the parameters' device,
        # the same bits on every rank. Counters: this rank's.
        "_global",
        "_delta",
        "_local_steps",
        "_steps",  # local steps since the start of training (restored from checkpoints): sync_steps
        # Scratch (sync): the update. Overlap: this rank's block start and the
        # update exchanged in the background (pending: not yet applied).
        "_update",
        "_start",
        "_in_flight",
        "_pending",
        "_background",
        # Transport.
        "_exchange",
        "_owns_comm",
        # Statistics (totals since construction or the restored checkpoint).
        "_stats",
    )

    def __init__(
        self,
        module_or_params: Union[torch.nn.Module, Iterable[torch.Tensor]],
        local_optimizer: torch.optim.Optimizer,
        block_steps: int = 16,
        *,
        sync_steps: int = 0,
        codec: Union[str, Codec] = "onebit",
        block_momentum: Union[float, str, None] = "auto",
        block_lr: float = 1.0,
        nesterov: bool = True,
        overlap: bool = False,
        transport: str = "torch",
        process_group: Any = None,
        communicator: Any = None,
        algorithm: str = "auto",
        server_codec: Optional[str] = None,
        bucket_elements: int = 1 << 26,
        exact_below: Optional[int] = None,
    ) -> None:
        _filters.check(exact_below)
        _check_int("block_steps", block_steps, 1)
        _check_int("sync_steps", sync_steps, 0)
        _check_int("bucket_elements", bucket_elements, 1)
        for name, flag in (("nesterov", nesterov), ("overlap", overlap)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if isinstance(block_momentum, str) and block_momentum == "auto":
            block_momentum = _AUTO_ADAPTIVE if _quality.is_adaptive(local_optimizer) else _AUTO_OTHER
        if block_momentum is not None and not (_is_real(block_momentum) and 0.0 <= block_momentum < 1.0):
            raise ValueError(f"block_momentum must be in [0, 1) (or None for 1 - 1/P, or 'auto'), got "
                             f"{block_momentum!r}")
        if not (_is_real(block_lr) and 0.0 < block_lr < math.inf):
            raise ValueError(f"block_lr must be a finite number > 0, got {block_lr!r}")
        if algorithm not in _ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(_ALGORITHMS)}")
        _transports.check(transport, communicator)
        if not isinstance(local_optimizer, torch.optim.Optimizer):
            raise ValueError(f"local_optimizer must be a torch.optim.Optimizer, got {type(local_optimizer).__name__}")
        params, buffers = _tensors_of(module_or_params)
        _check_optimizer_covers(local_optimizer, params)
        self.codec = codec if isinstance(codec, Codec) else Codec(codec)
        self.server_codec = server_codec_arg(server_codec)
        comm = _connect(transport, process_group, communicator)

        self.transport = transport
        self.algorithm = algorithm
        self.bucket_elements = bucket_elements
        self.exact_below = None if self.codec.name == "none" else exact_below  # none: nothing to protect
        self.local_optimizer = local_optimizer
        self.world_size = comm.size
        self.block_steps = block_steps
        self.sync_steps = sync_steps
        self.block_momentum = float(1.0 - 1.0 / comm.size if block_momentum is None else block_momentum)
        self.block_lr = float(block_lr)
        self.nesterov = nesterov
        self.overlap = overlap
        self._params = params
        self._buffers = buffers
        self._offsets = [0]
        for p in params:
            self._offsets.append(self._offsets[-1] + p.numel())
        self._n = self._offsets[-1]
        device = params[0].device
        self._split = _filters.split_flat([tuple(p.shape) for p in params], self.exact_below)
        n_codec = self._n if self._split is None else self._split.n_compressed  # what goes through the codec
        buckets = -(-n_codec // bucket_elements)
        self._payload_bytes = sum(self.codec.max_payload_bytes(min(bucket_elements, n_codec - lo))
                                  for lo in range(0, n_codec, bucket_elements))
        if self._split is not None:
            self._payload_bytes += _filters.none_codec().max_payload_bytes(self._split.n_exact)
        self._exchange = _block_exchange.CommunicatorExchange(comm, self.codec, algorithm, buckets,
                                                             self.server_codec)
        self._owns_comm = communicator is None
        self._global = torch.empty(self._n, dtype=torch.float32, device=device)
        self._delta = torch.zeros(self._n, dtype=torch.float32, device=device)
        # sync: W, Delta and one scratch; overlap: W, Delta, this rank's
        # start and the update in flight.
        empty = lambda: torch.empty(self._n, dtype=torch.float32, device=device)  # noqa: E731
        self._update = None if overlap else empty()
        self._start = empty() if overlap else None
        self._in_flight = empty() if overlap else None
        self._pending = False
        self._background = _block_exchange.Background() if overlap else None
        self._local_steps = 0
        self._steps = 0
        self._stats = _new_stats()

        agreed = dict(self._structure(), transport=transport, block_steps=block_steps,
                      sync_steps=sync_steps,
                      block_momentum=self.block_momentum, block_lr=self.block_lr,
                      shapes=[list(p.shape) for p in params], buffer_shapes=[list(b.shape) for b in buffers])
        self._exchange.agree("BlockMomentum configuration", agreed, device)
        with torch.no_grad():
            self._gather_params(self._global)
            self._exchange.broadcast_(self._global)
            self._scatter_params(self._global)
            if overlap:
                self._start.copy_(self._global)
            if buffers:
                flat = torch.cat([b.reshape(-1) for b in buffers])
                self._exchange.broadcast_(flat)
                self._scatter(buffers, flat)
        logger.info(
            "gradzip BlockMomentum: block_steps=%d sync_steps=%d codec=%s block_momentum=%g block_lr=%g "
            "nesterov=%s overlap=%s transport=%s (%s) algorithm=%s world_size=%d elements=%d update_buffers=%d "
            "module_buffers=%d exact_below=%s (%d elements exact)", block_steps, sync_steps, self.codec.spec,
            self.block_momentum, self.block_lr, nesterov, overlap, transport, comm.transport, algorithm,
            self.world_size, self._n, buckets, len(buffers), self.exact_below,
            0 if self._split is None else self._split.n_exact)

    # -- training -------------------------------------------------------------

    def step(self, closure: Any = None) -> Any:
        """One step of the local optimizer; every ``block_steps``-th call (each
        of the first ``sync_steps`` calls) also ends the block (the exchange and
        the filter). Returns the closure's loss.

        Raises:
            FloatingPointError: on every rank, when the block's outer step
                left W with NaN or infinite values (training diverged, or was
                restored from a state with absurd values)."""
        loss = self.local_optimizer.step() if closure is None else self.local_optimizer.step(closure)
        self._local_steps += 1
        self._steps += 1
        self._stats["steps"] += 1
        if self._local_steps >= (1 if self._steps <= self.sync_steps else self.block_steps):
            self._end_block(drain=False)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.local_optimizer.zero_grad(set_to_none=set_to_none)

    def sync(self) -> None:
        """Ends the current block now, even if it is partial, and applies any
        update still in flight: afterwards W includes every local step taken
        so far and the model holds the next block's start. Does nothing when
        there is nothing to exchange. Collective."""
        self._end_block(drain=True)

    @contextlib.contextmanager
    def global_model(self, lookahead: bool = False) -> Iterator[None]:
        """Puts W (the filtered global model, the same bits on every rank) into
        the parameters for the ``with`` body, e.g. to evaluate or save it;
        restores this rank's parameters afterwards. With ``overlap``, W lacks
        the update still in flight: call :meth:`sync` first for the latest.

        ``lookahead=True`` puts the look-ahead W + mu * Delta instead (with
        ``nesterov``; W itself without): where the next block starts, and
        the parameters DiLoCo's outer ``torch.optim.SGD(nesterov=True)``
        holds and evaluates."""
        with torch.no_grad():
            saved = torch.empty_like(self._global)
            self._gather_params(saved)
            if lookahead:
                point = torch.empty_like(self._global)
                self._start_point(point)
                self._scatter_params(point)
            else:
                self._scatter_params(self._global)
        try:
            yield
        finally:
            with torch.no_grad():
                self._scatter_params(saved)

    @property
    def local_steps(self) -> int:
        """Steps taken in the current block."""
        return self._local_steps

    def compression_stats(self) -> Dict[str, float]:
        """Bytes this rank sent, averaged over the steps and blocks so far.

        Returns a dict with:
            steps, blocks: local steps and block ends counted.
            elements: parameters synchronized.
            dense_bytes_per_step: the fp32 model (4 bytes per element): what
                DDP would allreduce every step.
            payload_bytes_per_block: what the codec produced per block end.
            wire_bytes_per_block, wire_bytes_per_step: what this rank put on
                the network (counted by the communicator; module buffers
                included, the initial broadcast not).
            wire_bytes, baseline_wire_bytes, wire_ratio: the keys every entry
                point reports (``_stats.py``): the total sent, what a DDP fp32
                ring allreduce (2(P-1)/P x the model) would have sent over the
                same steps, and their ratio.
            uncompressed_bytes_per_step: the part of wire_bytes_per_step
                sent in fp32: the parameters the layer filter keeps exact
                (``exact_below``) and the module buffers.
        """
        s = self._stats
        steps, blocks = max(s["steps"], 1), max(s["blocks"], 1)
        p = self.world_size
        ddp = _stats.ring(4.0 * self._n, p)
        wire_step = s["wire_bytes"] / steps
        return {
            "steps": s["steps"],
            "blocks": s["blocks"],
            "elements": self._n,
            "dense_bytes_per_step": 4.0 * self._n,
            "payload_bytes_per_block": s["payload_bytes"] / blocks,
            "wire_bytes_per_block": s["wire_bytes"] / blocks,
            "wire_bytes_per_step": wire_step,
            **_stats.core(s["wire_bytes"], ddp * s["steps"]),
            "uncompressed_bytes_per_step": s["uncompressed_wire_bytes"] / steps,
        }

    # -- checkpoints ----------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The whole state of this rank, for a checkpoint next to the model's
        own state_dict: W, Delta, the update in flight (overlap), the counters,
        the error feedback of every buffer (this rank's), the statistics and
        the local optimizer's state_dict. Collective with ``overlap`` (waits
        for the exchange in flight)."""
        if self._background is not None and self._background.busy:
            self._count_wire(*self._background.wait())
        return {
            "version": _STATE_VERSION,
            "config": self._structure(),
            "hyperparameters": {"block_steps": self.block_steps, "block_momentum": self.block_momentum,
                                "block_lr": self.block_lr, "sync_steps": self.sync_steps},
            "global": self._global.clone(),
            "delta": self._delta.clone(),
            "pending": self._in_flight.clone() if self._pending else None,
            "start": self._start.clone() if self.overlap else None,
            "local_steps": self._local_steps,
            "steps": self._steps,
            "error_feedback": self._exchange.state_dict(),
            "saved_by": _resume.saved_by(self._exchange.comm.rank, self._exchange.comm.size),
            "stats": dict(self._stats),
            "local_optimizer": self.local_optimizer.state_dict(),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output, saved on this rank. Restore the
        model's parameters (they are this rank's local model mid-block) with
        the model's own ``load_state_dict``; training then continues
        bit-identically.

        Collective: call it on every rank, with the checkpoints of one step.
        The state is checked before anything is replaced (W, Delta and the
        update in flight: float32 tensors of the model's size, finite; the
        counters and the error feedback as saved), then the ranks compare a
        digest of what must be the same on all of them (W, Delta, the update
        in flight, the step in the block): ranks restored from different
        checkpoints, or one rank whose state is refused, raise ValueError on
        every rank and keep their state. A rank that restores while the
        others train on fails with IoError within ``GRADZIP_TIMEOUT_S``, as
        do the others.

        Raises:
            ValueError: the state is not a valid BlockMomentum state_dict, was
                saved for another model size, world size, codec or mode, or
                the ranks' restored states differ.
        """
        try:
            checked, problem = self._checked(state), None
        except ValueError as e:
            checked, problem = None, e
        digest = "refused" if checked is None else _digest(checked)
        try:
            self._exchange.agree("restored state (call load_state_dict on every rank, with the checkpoints of one "
                                 "step)", {"state digest": digest}, self._global.device)
        except ValueError:
            if problem is not None:
                raise problem from None  # this rank's own reason
            raise
        if problem is not None:
            raise problem
        # Another rank's or world size's error feedback (a checkpointer that keeps one copy): W, Delta and the
        # counters are the same on every rank, the residuals are not. Every rank drops its own too (_resume.py).
        comm = self._exchange.comm
        resume = _resume.Resume()
        resume.loaded(checked["saved_by"], None, comm.rank, comm.size)
        drop, report = resume.status == _resume.FOREIGN, ""
        try:
            self._exchange.agree("restored error feedback", {"error feedback": resume.describe()},
                                 self._global.device)
        except ValueError as e:  # raised on every rank alike
            drop, report = True, str(e)
        if drop:
            resume.warn("BlockMomentum", report)
            checked["error_feedback"] = [ErrorFeedback() for _ in checked["error_feedback"]]
        saved = state["hyperparameters"]
        now = {"block_steps": self.block_steps, "block_momentum": self.block_momentum, "block_lr": self.block_lr,
               "sync_steps": self.sync_steps}
        if {k: saved.get(k, 0) for k in now} != now:
            logger.warning("gradzip BlockMomentum: restoring a state saved with %s under %s; training "
                           "continues with the new values", saved, now)
        if self._background is not None and self._background.busy:
            self._background.wait()  # an exchange of the state being replaced
        with torch.no_grad():
            self._global.copy_(checked["global"])
            self._delta.copy_(checked["delta"])
            self._pending = checked["pending"] is not None
            if self._pending:
                self._in_flight.copy_(checked["pending"])
            if self.overlap:
                self._start.copy_(checked["start"])
        self._local_steps = checked["local_steps"]
        self._steps = checked["steps"]
        self._exchange.set_states(checked["error_feedback"])
        self._stats = _new_stats()
        self._stats.update(state["stats"])
        self.local_optimizer.load_state_dict(state["local_optimizer"])

    def _checked(self, state: Any) -> Dict[str, Any]:
        """The parts of `state` this object takes, checked (ValueError naming what is wrong)."""
        keys = ("config", "hyperparameters", "global", "delta", "pending", "start", "local_steps",
                "error_feedback", "stats", "local_optimizer")
        if (not isinstance(state, dict) or state.get("version") != _STATE_VERSION
                or any(k not in state for k in keys)):
            raise ValueError(f"not a gradzip BlockMomentum state_dict (version {_STATE_VERSION})")
        config = state["config"]
        if not isinstance(config, dict):
            raise ValueError("the state_dict's config is not a dict")
        for key, value in self._structure().items():
            if config.get(key) != value:
                raise ValueError(f"the state_dict was saved with {key}={config.get(key)!r}, "
                                 f"this BlockMomentum has {value!r}")
        for key in ("hyperparameters", "stats", "local_optimizer"):
            if not isinstance(state[key], dict):
                raise ValueError(f"the state_dict's {key} is not a dict")
        if any(k not in _new_stats() or not isinstance(v, (int, float)) for k, v in state["stats"].items()):
            raise ValueError(f"the state_dict's stats must be a dict of {', '.join(_new_stats())}")
        out: Dict[str, Any] = {}
        # "steps" (since training began) is newer than version 1's first states:
        # there the statistics' step count, which is the same number.
        for key, value in (("local_steps", state["local_steps"]),
                           ("steps", state.get("steps", state["stats"].get("steps", 0)))):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"the state_dict's {key} must be an integer >= 0, got {value!r}")
            out[key] = value
        for key, needed in (("global", True), ("delta", True), ("pending", False), ("start", self.overlap)):
            t = state[key]
            if t is None and not needed:
                out[key] = None
                continue
            if key == "pending" and not self.overlap:
                raise ValueError("the state_dict holds an update in flight, but this BlockMomentum has no overlap")
            out[key] = _model_tensor(key, t, self._n)
        if not isinstance(state["error_feedback"], list):
            raise ValueError("the state_dict's error_feedback is not a list")
        out["error_feedback"] = self._exchange.checked_states(state["error_feedback"])
        out["saved_by"] = _resume.checked_stamp(state)
        return out

    def close(self) -> None:
        """Waits for an exchange in flight, stops the background thread and
        closes the communicator this object made. No :meth:`sync`: call it
        first to keep the last block's steps."""
        if self._background is not None:
            if self._background.busy:
                self._count_wire(*self._background.wait())
            self._background.close()
        if self._owns_comm:
            self._exchange.comm.close()

    def __repr__(self) -> str:
        return (f"BlockMomentum(block_steps={self.block_steps}, sync_steps={self.sync_steps}, "
                f"codec='{self.codec.spec}', "
                f"block_momentum={self.block_momentum:g}, block_lr={self.block_lr:g}, nesterov={self.nesterov}, "
                f"overlap={self.overlap}, transport='{self.transport}', world_size={self.world_size}, "
                f"elements={self._n}, exact_below={self.exact_below})")

    # -- the block ------------------------------------------------------------

    def _end_block(self, drain: bool) -> None:
        stepped = self._local_steps > 0
        if not stepped and not self._pending:
            return
        with torch.no_grad():
            if self.overlap:
                self._end_block_overlapped(stepped, drain)
            else:
                self._local_update(self._update)
                self._before_exchange()
                self._count_wire(*self._average(self._update))
                self._filter(self._update)
                self._start_point(self._update)
                self._scatter_params(self._update)
        self._local_steps = 0

    def _end_block_overlapped(self, stepped: bool, drain: bool) -> None:
        """The block's update is exchanged while the next block runs and goes
        through the filter at that block's end, one block late. Meanwhile the
        next block starts from the start the ranks agree on so far plus this
        rank's own update, so its local progress goes on from where it was.
        (Starting from the agreed start alone, leaving the block's progress
        out until its average arrives, lost 10-60 points on digits.)"""
        if self._pending:  # the last block's update, exchanged meanwhile
            if self._background.busy:
                self._count_wire(*self._background.wait())
            self._filter(self._in_flight)
            self._pending = False
        if stepped:
            self._local_update(self._in_flight)
            self._before_exchange()
            if drain:
                self._count_wire(*self._average(self._in_flight))
                self._filter(self._in_flight)
                self._start_point(self._start)
            else:
                self._start_point(self._start)
                self._start.add_(self._in_flight)  # before the exchange overwrites it with the average
                self._pending = True
                self._background.submit(self._average_in_flight, self._global.device)
        else:
            self._start_point(self._start)
        self._scatter_params(self._start)

    def _before_exchange(self) -> None:
        if self._buffers:  # first: the communicator takes one call at a time
            self._average_buffers()
        self._stats["blocks"] += 1
        self._stats["payload_bytes"] += self._payload_bytes

    def _start_point(self, out: torch.Tensor) -> None:
        """out = where a block starts: W, or W + mu * Delta (nesterov)."""
        if self.nesterov:
            torch.mul(self._delta, self.block_momentum, out=out)
            out.add_(self._global)
        else:
            out.copy_(self._global)

    def _local_update(self, out: torch.Tensor) -> None:
        """out = W_local - (this block's start)."""
        if self.overlap:  # the start differs between ranks: kept
            start = self._start
        else:  # the same on every rank: recomputed, one model copy less
            self._start_point(out)
            start = out
        for p, lo, hi in zip(self._params, self._offsets, self._offsets[1:]):
            torch.sub(p.detach().reshape(-1), start[lo:hi], out=out[lo:hi])

    def _filter(self, g: torch.Tensor) -> None:
        """Delta = mu * Delta + zeta * G; W = W + Delta (g is consumed); then W must be finite."""
        if self.block_lr != 1.0:
            g.mul_(self.block_lr)
        self._delta.mul_(self.block_momentum).add_(g)
        self._global.add_(self._delta)
        self._check_global()

    def _check_global(self) -> None:
        """Raises FloatingPointError on every rank when W is not finite on any.

        A state restored with finite but absurd values (W or Delta near
        float32's limit) overflowed here and training went on to the end,
        exit 0, with a W of inf (issue 32); so does a diverging run. Every
        rank computes W from the same bits, but the ranks still agree on the
        answer (one float each, once per block), so that no rank trains on
        while another raises."""
        bad = self._exchange.ranks_where(not bool(torch.isfinite(self._global).all()), self._global.device)
        if bad:
            raise FloatingPointError(
                f"gradzip BlockMomentum: the global model W holds NaN or infinite values after the outer step "
                f"at step {self._steps} (on rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} of "
                f"{self.world_size}): "
                f"training diverged, or the state it was restored from holds values too large for float32 "
                f"(W, Delta or the update in flight near 3.4e38). Restore an earlier checkpoint; if it diverges "
                f"again, lower block_lr, block_momentum or the local learning rate")

    def _average(self, flat: torch.Tensor) -> Tuple[int, int]:
        """flat becomes the average over ranks (compressed, per bucket; with
        the layer filter, its exact parameters in fp32 and the others gathered
        end to end through the codec); returns (wire bytes, of which fp32)."""
        if self._split is None:
            return self._average_codec(flat), 0
        return _filters.exchange_parts(flat, self._split, self._average_codec,
                                       lambda e: self._exchange.average_exact_(e, "exact parameters"))

    def _average_codec(self, flat: torch.Tensor) -> int:
        wire = 0
        for i, lo in enumerate(range(0, flat.numel(), self.bucket_elements)):
            wire += self._exchange.average_(i, flat[lo:lo + self.bucket_elements])
        return wire

    def _average_in_flight(self) -> Tuple[int, int]:
        return self._average(self._in_flight)

    def _average_buffers(self) -> None:
        flat = torch.cat([b.reshape(-1) for b in self._buffers])
        sent = self._exchange.average_exact_(flat)
        self._count_wire(sent, sent)
        self._scatter(self._buffers, flat)

    def _count_wire(self, nbytes: int, uncompressed: int) -> None:
        self._stats["wire_bytes"] += nbytes
        self._stats["uncompressed_wire_bytes"] += uncompressed

    # -- flat <-> parameters ----------------------------------------------------

    def _gather_params(self, out: torch.Tensor) -> None:
        for p, lo, hi in zip(self._params, self._offsets, self._offsets[1:]):
            out[lo:hi].copy_(p.detach().reshape(-1))

    def _scatter_params(self, flat: torch.Tensor) -> None:
        self._scatter(self._params, flat)

    @staticmethod
    def _scatter(tensors: List[torch.Tensor], flat: torch.Tensor) -> None:
        lo = 0
        for t in tensors:
            hi = lo + t.numel()
            t.detach().copy_(flat[lo:hi].view_as(t))
            lo = hi

    def _structure(self) -> Dict[str, Any]:
        """What a checkpoint must agree on to be restored here."""
        return {"world_size": self.world_size, "elements": self._n, "codec": self.codec.spec,
                "algorithm": self.algorithm, "server_codec": self.server_codec,
                "bucket_elements": self.bucket_elements, "nesterov": self.nesterov,
                "overlap": self.overlap, "exact_below": self.exact_below}


def _model_tensor(key: str, t: Any, n: int) -> torch.Tensor:
    """t, if it is a float32 tensor of n finite values (a state_dict's W, Delta, ...)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != (n,):
        what = (f"a {t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor)
                else type(t).__name__)
        raise ValueError(f"the state_dict's {key} must be a float32 tensor of shape ({n},), got {what}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"the state_dict's {key} holds NaN or infinite values")
    return t


def _digest(checked: Dict[str, Any]) -> str:
    """SHA-256 of what every rank holds alike: W, Delta, the update in flight, the step in the block and
    the steps so far."""
    h = hashlib.sha256(f"{checked['local_steps']} {checked['steps']}".encode())
    for key in ("global", "delta", "pending"):
        t = checked[key]
        h.update(b"none" if t is None else t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _new_stats() -> Dict[str, Any]:
    return {"steps": 0, "blocks": 0, "payload_bytes": 0, "wire_bytes": 0, "uncompressed_wire_bytes": 0}


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_int(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _tensors_of(module_or_params: Any) -> "tuple[List[torch.Tensor], List[torch.Tensor]]":
    """The parameters to synchronize and the float32 buffers to average, checked."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module_or_params, DistributedDataParallel):
        raise ValueError("BlockMomentum replaces DDP's per-step allreduce: pass the model itself, not the "
                         "DistributedDataParallel wrapper (each rank trains a full copy between blocks)")
    if isinstance(module_or_params, torch.nn.Module):
        params = [p for p in module_or_params.parameters() if p.requires_grad]
        buffers = [b for b in module_or_params.buffers() if b.dtype == torch.float32]
    elif isinstance(module_or_params, torch.Tensor):
        raise ValueError("pass an nn.Module or an iterable of parameters, not a single tensor")
    else:
        try:
            params = list(module_or_params)
        except TypeError:
            raise ValueError(f"module_or_params must be an nn.Module or an iterable of parameters, got "
                             f"{type(module_or_params).__name__}") from None
        buffers = []
    if not params:
        raise ValueError("no parameters to synchronize (none given, or none requires grad)")
    seen = set()
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"parameter {i} is a {type(p).__name__}, not a tensor (param group dicts "
                             f"belong to the local optimizer)")
        if p.dtype != torch.float32:
            raise ValueError(f"parameter {i} is {p.dtype}: BlockMomentum exchanges float32 models (keep float32 "
                             f"master weights)")
        if p.device != params[0].device:
            raise ValueError(f"parameters on several devices ({params[0].device}, {p.device}): BlockMomentum "
                             f"keeps one flat model on one device")
        if id(p) in seen:
            raise ValueError(f"parameter {i} is given twice")
        seen.add(id(p))
    for b in buffers:
        if b.device != params[0].device:
            raise ValueError(f"a buffer is on {b.device}, the parameters on {params[0].device}")
    return params, buffers


def _check_optimizer_covers(optimizer: torch.optim.Optimizer, params: List[torch.Tensor]) -> None:
    mine = {id(p) for p in params}
    outside = sum(1 for g in optimizer.param_groups for p in g["params"] if id(p) not in mine)
    if outside:
        raise ValueError(f"the local optimizer trains {outside} parameter(s) that BlockMomentum does not "
                         f"synchronize: they would drift apart between ranks. Pass the same model or parameters")


def _connect(transport: str, process_group: Any, communicator: Any) -> Any:
    from .._core import IoError

    try:
        return _transports.connect(transport, process_group, communicator, None)
    except IoError as e:
        # Ranks that passed different transports (or groups) wait for each
        # other in different places of the rendezvous: say what to check.
        raise IoError(f"BlockMomentum: transport={transport!r} did not meet the other ranks of the group (every "
                      f"rank must pass the same transport and process group): {e}") from None
