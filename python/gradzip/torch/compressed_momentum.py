"""Compressed momentum: optimizers that own the communication and exchange
their *momentum*, compressed, instead of the gradient (the 1-bit Adam / 0/1
Adam family: Tang et al., arXiv 2102.02888; Lu et al., 2202.06009).

Why: Adam divides each coordinate by its own running second moment, so a
gradient error that is small in norm can be large after that division, and
error feedback repays it only later. Compressing the gradient before Adam
lost 8-18% of a transformer's validation loss at 12-20x (issue 22). The
momentum is a smoothed quantity; with the variance frozen after a
full-precision stage, the update is linear in it, so error feedback on it
(worker and server side) cancels the compression error over steps.

Two stages, the same on every rank:

1. Full precision: the gradient is averaged in fp32 (by DDP through
   :meth:`register_ddp`'s hook, or by the optimizer itself), and the
   optimizer is plain AdamW (``CompressedAdamW``) or momentum SGD
   (``CompressedSGD``). For AdamW the stage ends on a measured criterion:
   every ``check_every`` steps the relative L1 change of the bias-corrected
   second moment since the last check; the first check at or after
   ``min_warmup_steps`` where it is at most ``variance_tolerance`` ends it,
   and ``max_warmup_steps`` ends it anyway. All ranks hold the same variance
   (it comes from averaged gradients), so they decide alike.
2. Compressed: the variance is frozen (AdamW); DDP's hook now returns the
   gradient untouched (no allreduce); each rank folds its *own* gradient into
   the momentum, m_r = beta1 * m + (1 - beta1) * g_r, and the ranks average
   the m_r with gradzip's two-phase allreduce (``scatter_reduce``: each rank
   encodes its momentum with the codec and worker-side error feedback, sums
   its chunk, re-encodes the sum with ``server_codec`` and server-side error
   feedback, and gathers the chunks: (P-1)/P payloads each way, 2(P-1)/P in
   all). The decoded average, the same bits on every rank, is the momentum.

Ranks end every step with the same parameters. :meth:`state_dict` holds the
whole state of this rank (the residuals differ between ranks); a restore
continues bit-identically.
"""

import logging
import math
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .. import _core
from ..codec import Codec, server_codec_arg
from . import _agreement, _resume, _stats, _transports

__all__ = ["CompressedAdamW", "CompressedSGD"]

logger = logging.getLogger(__name__)

_STATE_VERSION = 1


class _CompressedMomentum(torch.optim.Optimizer):
    """What both optimizers share: flat fp32 buffers, the two stages, the
    exchange and the checkpoint. Subclasses give the update (`_update`)."""

    _KIND = ""

    def __init__(self, params: Iterable[Any], defaults: Dict[str, Any], *, codec: Union[str, Codec],
                 server_codec: Optional[str], warmup_codec: Optional[str], process_group: Any, transport: str,
                 bucket_elements: int, sparsity_warmup: int = 0, sparsity_start: float = 0.25,
                 sparsity_stages: int = 4, clip_norm: Optional[float] = None) -> None:
        super().__init__(params, defaults)
        if not isinstance(bucket_elements, int) or isinstance(bucket_elements, bool) or bucket_elements < 1:
            raise ValueError(f"bucket_elements must be an integer >= 1, got {bucket_elements!r}")
        _transports.check(transport, None)
        self.codec = codec if isinstance(codec, Codec) else Codec(codec)
        # Server-side error feedback re-encodes each chunk sum with the codec
        # itself by default ("same"): 2(P-1)/P payloads per rank (the engine's
        # default, fp16 sums for onebit, would be 16x onebit's payload on the
        # way back). Kept resolved: the spec the server phase runs.
        self.server_codec = Codec(_core.server_codec_spec(self.codec.spec, server_codec_arg(server_codec))).spec
        # The full-precision stage's gradient exchange: None (or "none") is
        # fp32 (DDP's allreduce); a codec sends it two-phase with error feedback.
        self.warmup_codec = None if warmup_codec in (None, "none") else Codec(warmup_codec)
        # DGC's sparsity warm-up: top-k's density decays exponentially from
        # sparsity_start to the codec's own over the first sparsity_warmup
        # compressed steps, in sparsity_stages equal stages.
        for name, v, low in (("sparsity_warmup", sparsity_warmup, 0), ("sparsity_stages", sparsity_stages, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        self.sparsity_warmup = sparsity_warmup
        self.sparsity_start = float(sparsity_start)
        self.sparsity_stages = sparsity_stages
        if sparsity_warmup:
            final = _topk_density(self.codec)
            if final is None:
                raise ValueError(f"sparsity_warmup needs a top-k codec with a density (topk:density=D), got "
                                 f"{self.codec.spec!r}")
            if not (final <= self.sparsity_start <= 1.0):
                raise ValueError(f"sparsity_start must be in [{final:g}, 1] (the codec's density to all), got "
                                 f"{sparsity_start!r}")
        # Local gradient clipping (DGC): the gradient's L2 norm is clipped at
        # clip_norm when averaged (full-precision stage), and each rank's own
        # at clip_norm / sqrt(P) when it is not (compressed stage).
        if clip_norm is not None and not (clip_norm > 0.0 and math.isfinite(clip_norm)):
            raise ValueError(f"clip_norm must be a positive number or None, got {clip_norm!r}")
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self._codecs: Dict[str, Codec] = {self.codec.spec: self.codec}
        self.process_group = process_group
        self.transport = transport
        self.bucket_elements = bucket_elements
        params_ = [p for g in self.param_groups for p in g["params"]]
        if not params_:
            raise ValueError("no parameters to optimize")
        seen = set()
        for i, p in enumerate(params_):
            if p.dtype != torch.float32:
                raise ValueError(f"parameter {i} is {p.dtype}: compressed momentum keeps float32 parameters")
            if p.device != params_[0].device:
                raise ValueError("parameters on several devices: compressed momentum keeps one flat buffer")
            if id(p) in seen:
                raise ValueError(f"parameter {i} is given twice")
            seen.add(id(p))
        self._params = params_
        self._offsets = [0]
        for p in params_:
            self._offsets.append(self._offsets[-1] + p.numel())
        self._n = self._offsets[-1]
        dev = params_[0].device
        self._m = torch.zeros(self._n, dtype=torch.float32, device=dev)
        self._g = torch.zeros(self._n, dtype=torch.float32, device=dev)
        self._step = 0
        self._frozen_at = 0  # the step the compressed stage began after; 0: still full precision
        self._ddp_averages = False  # register_ddp: DDP's hook averages warm-up gradients
        self._comm: Any = None
        self._ef: List[Any] = []
        self._warmup_ef: List[Any] = []
        self._stats = {"wire_bytes": 0.0, "dense_wire_bytes": 0.0, "compressed_steps": 0}
        self._resume = _resume.Resume()  # whose per-rank state was restored (_resume.py)
        self._resume_pending: Optional[Dict[str, Any]] = None  # from gradzip's rank file: again at the next step
        self._world = dist.get_world_size(process_group) if dist.is_initialized() else 1
        if dist.is_initialized() and self._world > 1:  # every rank starts from rank 0's parameters
            with torch.no_grad():
                flat = torch.cat([p.detach().reshape(-1) for p in params_])
                dist.broadcast(flat, src=dist.get_global_rank(process_group, 0) if process_group else 0,
                               group=process_group)
                self._scatter(flat)

    # -- public ---------------------------------------------------------------

    @property
    def compressing(self) -> bool:
        """True once the full-precision stage has ended."""
        return self._frozen_at > 0

    def register_ddp(self, ddp_model: Any) -> None:
        """Registers the hook this optimizer needs on a DistributedDataParallel
        model: in the full-precision stage it averages the gradients as DDP
        does (fp32 allreduce, overlapped with backward); afterwards it returns
        each rank's own gradient untouched, for :meth:`step` to fold into the
        momentum and exchange compressed."""
        self._ddp_averages = self.warmup_codec is None
        ddp_model.register_comm_hook(self, _ddp_hook)

    def compression_stats(self) -> Dict[str, float]:
        """This rank's bytes over the steps so far.

        Returns a dict with: steps; warmup_steps (full-precision steps so far);
        wire_bytes (what this rank sent: fp32 warm-up steps modelled as a ring
        allreduce, 2(P-1)/P x 4n, and compressed steps as the communicator
        counts them); fp32_wire_bytes (what fp32 DDP's ring allreduce sends
        over the same steps, also as baseline_wire_bytes, the key every entry
        point reports: ``_stats.py``); wire_ratio (their quotient); and
        compressed_wire_bytes_per_step (what one compressed step sends).
        """
        s = self._stats
        p = max(self._world, 1)
        fp32 = _stats.ring(4.0 * self._n, p) * self._step
        wire = s["wire_bytes"] + s["dense_wire_bytes"]
        cs = s["compressed_steps"]
        return {
            "steps": self._step,
            "warmup_steps": max(self._frozen_at, 0) if self.compressing else self._step,
            **_stats.core(wire, fp32),
            "fp32_wire_bytes": fp32,
            "compressed_wire_bytes_per_step": s["wire_bytes"] / cs if cs else math.nan,
        }

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if self._resume_pending is not None:  # restored from gradzip's rank file: again, over what a stack restored
            pending, self._resume_pending = self._resume_pending, None
            self.load_state_dict(pending)
        if not self._resume.settled:
            self._settle()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p, lo, hi in zip(self._params, self._offsets, self._offsets[1:]):
            if p.grad is None:
                self._g[lo:hi].zero_()
            else:
                self._g[lo:hi].copy_(p.grad.reshape(-1))
        self._step += 1
        p_ranks = max(self._world, 1)
        if self._full_precision_at(self._step):
            if self.warmup_codec is not None:
                self._stats["dense_wire_bytes"] += self._exchange(self._g, self.warmup_codec, self._warmup_ef)
            else:
                if not self._ddp_averages and p_ranks > 1:
                    dist.all_reduce(self._g, group=self.process_group)
                    self._g.mul_(1.0 / p_ranks)
                self._stats["dense_wire_bytes"] += 4.0 * self._n * 2 * (p_ranks - 1) / p_ranks
            self._clip(self._g, 1.0)
            self._full_precision_step(self._g)
            if not self.compressing and self._should_freeze():
                self._freeze()
            elif self.compressing:
                self._refreshed()
        else:
            self._clip(self._g, 1.0 / math.sqrt(p_ranks))
            self._compressed_step(self._g)
        return loss

    # -- checkpoints ----------------------------------------------------------

    def _rank(self) -> Optional[int]:
        return dist.get_rank(self.process_group) if dist.is_initialized() else None

    def _settle(self) -> None:
        """The first step after a start or a restore: the ranks agree whose
        per-rank state each restored (_resume.py). Anything but every rank's
        own drops, on every rank, the error feedback and the rank's own
        momentum (which restarts from the shared one)."""
        def agree(fields: List[Tuple[str, str]], round: str, mismatch: str) -> None:
            if self._world > 1 and dist.is_initialized():
                _agreement.agree(self.process_group, fields, "optimizer", round, mismatch)

        if self._resume.settle(agree, type(self).__name__):
            self._ef, self._warmup_ef = [], []
            self._drop_rank_state()

    def _drop_rank_state(self) -> None:
        """Per-rank buffers beyond the error feedback (subclasses)."""

    def state_dict(self) -> Dict[str, Any]:  # type: ignore[override]
        """This rank's whole state: hyperparameters, step, stage, the flat
        moment buffers, the error feedback of every bucket, the statistics,
        and who saved it (``saved_by``: the error feedback is this rank's)."""
        return {
            "version": _STATE_VERSION,
            "kind": self._KIND,
            "saved_by": _resume.saved_by(self._rank(), self._world),
            "codec": self.codec.spec,
            "server_codec": self.server_codec,
            "warmup_codec": self.warmup_codec.spec if self.warmup_codec is not None else None,
            "elements": self._n,
            "world_size": self._world,
            "sparsity": [self.sparsity_warmup, self.sparsity_start, self.sparsity_stages],
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups],
            "step": self._step,
            "frozen_at": self._frozen_at,
            "buffers": {k: v.clone() for k, v in self._buffers().items()},
            "error_feedback": [ef.state_dict() for ef in self._ef],
            "warmup_error_feedback": [ef.state_dict() for ef in self._warmup_ef],
            "stats": dict(self._stats),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:  # type: ignore[override]
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION or state.get("kind") != self._KIND:
            raise ValueError(f"not a gradzip {type(self).__name__} state_dict (version {_STATE_VERSION})")
        stamp = _resume.checked_stamp(state)
        for key, mine in (("codec", self.codec.spec), ("server_codec", self.server_codec), ("elements", self._n),
                          ("warmup_codec", self.warmup_codec.spec if self.warmup_codec is not None else None),
                          ("sparsity", [self.sparsity_warmup, self.sparsity_start, self.sparsity_stages])):
            if state.get(key, [0, 0.25, 4] if key == "sparsity" else None) != mine:
                raise ValueError(f"the state_dict was saved with {key}={state.get(key)!r}, this optimizer has "
                                 f"{mine!r}")
        if len(state["param_groups"]) != len(self.param_groups):
            raise ValueError("the state_dict has another number of parameter groups")
        for g, saved in zip(self.param_groups, state["param_groups"]):
            g.update(saved)
        self._step = int(state["step"])
        self._frozen_at = int(state["frozen_at"])
        mine_b = self._buffers(create=True)
        for k, v in state["buffers"].items():
            mine_b[k].copy_(v)
        import gradzip

        self._ef, self._warmup_ef = [], []
        for mine_ef, key in ((self._ef, "error_feedback"), (self._warmup_ef, "warmup_error_feedback")):
            for saved in state[key]:
                ef = gradzip.ErrorFeedback()
                ef.load_state_dict(saved)
                mine_ef.append(ef)
        self._stats = dict(state["stats"])
        # Another rank's or world size's error feedback (a stack saved rank 0's copy): dropped at the next step
        # by every rank alike (_resume.py). A state of no stamp is judged by its world size.
        saved_world = state.get("world_size")
        self._resume.loaded(stamp, saved_world if isinstance(saved_world, int) else None, self._rank(),
                            self._world)

    # -- the stages -------------------------------------------------------------

    def _full_precision_at(self, step: int) -> bool:
        """Whether `step` (1-based) averages the gradient uncompressed (or
        with the warm-up codec): the warm-up, and the variance refreshes."""
        return not self.compressing

    def _refreshed(self) -> None:
        """After a full-precision step in the compressed stage."""

    def _full_precision_step(self, g: torch.Tensor) -> None:
        raise NotImplementedError

    def _should_freeze(self) -> bool:
        raise NotImplementedError

    def _freeze(self) -> None:
        self._frozen_at = self._step
        logger.info("gradzip %s: full-precision stage ended after %d steps; momentum now travels as %s "
                    "(server %s)", type(self).__name__, self._step, self.codec.spec, self.server_codec)

    def _compressed_step(self, g: torch.Tensor) -> None:
        raise NotImplementedError

    def _buffers(self, create: bool = False) -> Dict[str, torch.Tensor]:
        return {"m": self._m}

    def _average_compressed_(self, flat: torch.Tensor) -> None:
        """flat (this rank's momentum) becomes the ranks' average, two-phase
        compressed, at the sparsity warm-up's density for this compressed step."""
        codec, server = self._codec_at(int(self._stats["compressed_steps"]))
        self._stats["wire_bytes"] += self._exchange(flat, codec, self._ef, server)
        self._stats["compressed_steps"] += 1

    def density_at(self, compressed_step: int) -> Optional[float]:
        """Top-k's density at the `compressed_step`-th (0-based) compressed
        step: sparsity_start x (d / sparsity_start)^(s / stages) in stage s of
        the sparsity warm-up, d (the codec's) after it; None for other codecs."""
        final = _topk_density(self.codec)
        if final is None or compressed_step >= self.sparsity_warmup:
            return final
        stage = compressed_step * self.sparsity_stages // self.sparsity_warmup
        return self.sparsity_start * (final / self.sparsity_start) ** (stage / self.sparsity_stages)

    def _codec_at(self, compressed_step: int) -> Tuple[Codec, str]:
        """(codec, server codec spec) of a compressed step: the codec's own
        after the sparsity warm-up; during it, top-k at density_at(), and the
        server codec too when it is the codec itself (the default), or a
        top-k server codec's density scaled by the same factor."""
        if compressed_step >= self.sparsity_warmup:
            return self.codec, self.server_codec
        density = self.density_at(compressed_step)
        spec = _with_density(self.codec.spec, density)  # type: ignore[arg-type]
        if self.server_codec == self.codec.spec:
            return self._codec(spec), spec
        server = _topk_density(self._codec(self.server_codec))
        if server is None:
            return self._codec(spec), self.server_codec
        # A top-k server codec of its own density scales with the codec's.
        scale = density / _topk_density(self.codec)  # type: ignore[operator]
        return self._codec(spec), _with_density(self.server_codec, min(1.0, server * scale))

    def _codec(self, spec: str) -> Codec:
        """The Codec of a canonical spec (built once)."""
        if spec not in self._codecs:
            self._codecs[spec] = Codec(spec)
        return self._codecs[spec]

    def _clip(self, g: torch.Tensor, scale: float) -> None:
        """g's L2 norm clipped at clip_norm x scale (no-op without clip_norm)."""
        if self.clip_norm is None:
            return
        norm = float(torch.linalg.vector_norm(g))
        limit = self.clip_norm * scale
        if norm > limit:
            g.mul_(limit / norm)

    def _sent_mask(self) -> torch.Tensor:
        """After a compressed exchange: True where this rank sent its whole
        accumulated value (the worker residual is exactly zero there: top-k's
        sent coordinates). DGC's momentum factor masking zeroes the local
        momentum there."""
        masks = []
        for ef in self._ef:
            worker, _ = ef.residuals()
            masks.append(torch.from_numpy(worker == 0))
        if not masks:  # one rank: nothing travels, everything counts as sent
            return torch.ones(self._n, dtype=torch.bool, device=self._m.device)
        return torch.cat(masks).to(self._m.device)

    def _exchange(self, flat: torch.Tensor, codec: Codec, efs: List[Any], server: Optional[str] = None) -> float:
        """flat becomes the ranks' average through gradzip's two-phase allreduce
        (scatter_reduce; the chunk sums re-encoded with `server`, default the
        codec itself), per bucket with the error feedback in `efs`. Returns
        the wire bytes."""
        import gradzip

        if self._world <= 1:
            return 0.0
        if self._comm is None:
            self._comm = _transports.connect(self.transport, self.process_group, None, None)
        buckets = list(range(0, self._n, self.bucket_elements))
        while len(efs) < len(buckets):
            efs.append(gradzip.ErrorFeedback())
        sent = 0.0
        for i, lo in enumerate(buckets):
            if efs[i].bound and efs[i].spec != codec.spec:  # the sparsity warm-up's next density
                efs[i].respec(codec.spec)
            stats = self._comm.allreduce(flat[lo:lo + self.bucket_elements], codec, efs[i], op="avg",
                                         algorithm="scatter_reduce", server_codec=server or codec.spec)
            sent += stats["wire_bytes"]
        return sent

    def _groups(self) -> List[Tuple[Dict[str, Any], int, int]]:
        """(param group, lo, hi): each group's parameters are contiguous in the flat buffers."""
        out, i = [], 0
        for g in self.param_groups:
            k = len(g["params"])
            out.append((g, self._offsets[i], self._offsets[i + k]))
            i += k
        return out

    def _scatter(self, flat: torch.Tensor) -> None:
        for p, lo, hi in zip(self._params, self._offsets, self._offsets[1:]):
            p.copy_(flat[lo:hi].view_as(p))

    def _apply(self, direction: torch.Tensor, lr_scale: float = 1.0) -> None:
        """p = p * (1 - lr * wd) - lr * direction, per group (decoupled weight decay)."""
        for p, lo, hi, g in self._param_slices():
            lr = g["lr"] * lr_scale
            if g["weight_decay"]:
                p.mul_(1.0 - g["lr"] * g["weight_decay"])
            p.add_(direction[lo:hi].view_as(p), alpha=-lr)

    def _param_slices(self) -> List[Tuple[torch.Tensor, int, int, Dict[str, Any]]]:
        out, i = [], 0
        for g in self.param_groups:
            for p in g["params"]:
                out.append((p, self._offsets[i], self._offsets[i + 1], g))
                i += 1
        return out


class CompressedAdamW(_CompressedMomentum):
    """AdamW whose momentum travels compressed after a full-precision stage
    (0/1 Adam's and 1-bit Adam's method, with any gradzip codec).

    Use it with DDP (its gradient allreduce is taken over by the optimizer's
    hook) or on a plain model::

        ddp = DistributedDataParallel(model)
        opt = CompressedAdamW(ddp.parameters(), lr=3e-3, weight_decay=0.1, codec="onebit")
        opt.register_ddp(ddp)        # fp32 gradients while warming up, none afterwards
        for x, y in batches:
            opt.zero_grad(); loss_fn(ddp(x), y).backward(); opt.step()

    Without DDP (each rank holds the model; rank 0's parameters are broadcast
    at construction) leave out ``register_ddp``: the optimizer averages the
    warm-up gradients itself.

    The update, in float32, elementwise, with t the step and bc_i = 1 - beta_i^t:

    - full precision (g averaged over ranks): m = beta1 m + (1 - beta1) g;
      v = beta2 v + (1 - beta2) g^2; p = p (1 - lr wd) - lr (m / bc1) /
      (sqrt(v / bc2) + eps): torch.optim.AdamW's update.
    - compressed (g this rank's): m = avg_ranks(beta1 m + (1 - beta1) g),
      compressed; p = p (1 - lr wd) - lr (m / bc1) / d, with d = sqrt(v /
      (1 - beta2^c)) + eps frozen at the end of the full-precision stage
      (and refrozen by each refresh), c the updates v holds (one per
      full-precision step: a refresh is bias-corrected by v's own count,
      not by the step).

    Args:
        params: float32 parameters (or param groups with their own lr and
            weight_decay), on one device.
        lr, betas, eps, weight_decay: as torch.optim.AdamW (weight_decay
            default 0.01).
        codec: the momentum's gradzip codec spec (default ``"onebit"``).
        server_codec: what the second phase re-encodes each chunk sum with
            (server-side error feedback): ``"same"`` (default), the codec
            itself; None, the engine's default (fp16 for onebit); or a spec.
        warmup_codec: how the full-precision stage averages the gradient:
            a gradzip spec, sent two-phase with error feedback (default
            ``"fp8:format=e5m2"``: 4x fewer bytes than fp32), or None
            for fp32 (DDP's allreduce through :meth:`register_ddp`'s hook).
            Adam's steps in this stage see each coordinate of what this
            codec delivers, so it must keep small coordinates: e5m2 spans
            2^31 within a block of 512, e4m3 (``"fp8"``, the former
            default) 2^17, below which they arrive as zeros or as error
            feedback's bursts (the LM's seed 1: e4m3 +13%, e5m2 -1.8%, fp32
            -0.0%; BENCHMARKS.md section 11).
        min_warmup_steps, max_warmup_steps: bounds of the full-precision
            stage. Defaults (None): they follow the learning rate. While
            the learning rate rises (a scheduler's warm-up) the stage goes
            on, and it lasts at least LR_RISE_FACTOR (4) times the steps it
            rose, and 40; the maximum is 100 or that minimum, whichever is
            larger. A variance frozen early holds the large gradients of the
            start and shrinks every later step: against fp32 at its best
            learning rate on a 4000-step run with a 100-step warm-up, a stage
            of 40 steps ended +2.3%, 200 steps +0.41%, 400 steps +0.01% (at
            17.4x; BENCHMARKS.md section 11, "Against the tuned fp32").
            Without a scheduler's warm-up the defaults are 40 and 100, as
            before. A bound given is kept as given and the stage no longer
            waits for the learning rate to stop rising (a minimum given
            alone lifts the default maximum to it). The stage's bytes count
            against the run's ratio.
        variance_tolerance: the full-precision stage ends at the first check
            where the bias-corrected second moment changed by at most this
            fraction (L1) since the previous check (default 0.5: its start-up
            transient is over; on the LM experiment that is step 20-30, and
            a short stage with refreshes ended better than one of 320 steps
            that waited for 0.05: BENCHMARKS.md).
        check_every: steps between checks (default 10).
        variance_refresh: R > 0: one full-precision step (the warm-up codec)
            at R, 3R, 7R, 15R, ... steps after the freeze updates the
            variance and refreezes it (0/1 Adam's doubling intervals);
            0: frozen for good (1-bit Adam). Default 20.
        process_group: the ranks (default WORLD); transport: ``"torch"``
            (the group itself) or ``"gradzip"`` (UCX/NCCL).
        bucket_elements: the momentum travels in buffers of at most this many
            elements, each with its own error feedback (default 2**24).
        compress: what travels in the compressed stage. ``"momentum"``
            (default): each rank's momentum, whose decoded average replaces
            it (with top-k the averaged momentum is sparse: the coordinates
            not sent drop to zero). ``"innovation"``: each rank keeps its own
            momentum m_r = beta1 m_r + (1 - beta1) g_r (from the shared one at
            the freeze) and sends its change d_r = (1 - beta1)(g_r - m_r) with
            error feedback; the shared momentum m += avg_ranks C(d_r). What is
            not sent now is sent later, so m follows the ranks' average
            momentum, every coordinate dense (stale where not sent), which is
            what Adam's per-coordinate division needs (EF21 / LoCo's idea for
            top-k). One more buffer of n floats per rank. ``"update"``: DGC's
            momentum correction with Adam's preconditioner: each rank keeps
            its own momentum m_r of its own gradients and sends its step
            x_r = lr (m_r / bc1) / d with error feedback; p = p (1 - lr wd) -
            avg_ranks C(x_r): what is not sent now is applied later.
        sparsity_warmup, sparsity_start, sparsity_stages: DGC's sparsity
            warm-up for a ``topk:density=D`` codec: over the first
            sparsity_warmup compressed steps the density decays
            exponentially from sparsity_start (default 0.25) to D in
            sparsity_stages equal stages (default 4; stage s:
            sparsity_start x (D / sparsity_start)^(s / stages)); the server
            codec follows when it is the codec. The error feedback's
            residuals carry across each change. 0 (default): none.
        factor_masking: with compress="update", DGC's momentum factor
            masking: this rank's own momentum is zeroed where it sent.
        local_variance: with compress="update", each rank's step uses the
            second moment of its own gradients, updated every step (never
            frozen: a coordinate whose gradient was tiny through the
            full-precision stage does not take a huge step when it grows);
            the ranks' parameters stay identical (only the decoded average
            of the steps is applied).
        clip_norm: DGC's local gradient clipping: the averaged gradient's L2
            norm is clipped at clip_norm in full-precision steps, each
            rank's own at clip_norm / sqrt(P) in compressed steps (None:
            none, the default).

    Raises:
        ValueError: a bad argument (the message says why).
    """

    _KIND = "adamw"
    DEFAULT_MIN_WARMUP = 40
    DEFAULT_MAX_WARMUP = 100
    #: The full-precision stage lasts at least this many times the steps the learning rate rose.
    LR_RISE_FACTOR = 4

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, *, codec: Union[str, Codec] = "onebit",
                 server_codec: Optional[str] = "same", warmup_codec: Optional[str] = "fp8:format=e5m2",
                 min_warmup_steps: Optional[int] = None, max_warmup_steps: Optional[int] = None,
                 variance_tolerance: float = 0.5, check_every: int = 10, variance_refresh: int = 20,
                 process_group: Any = None, transport: str = "torch", bucket_elements: int = 1 << 24,
                 compress: str = "momentum", sparsity_warmup: int = 0, sparsity_start: float = 0.25,
                 sparsity_stages: int = 4, clip_norm: Optional[float] = None, factor_masking: bool = False,
                 local_variance: bool = False) -> None:
        if compress not in ("momentum", "innovation", "update"):
            raise ValueError(f"compress must be 'momentum', 'innovation' or 'update', got {compress!r}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas!r}")
        # Bounds left to their defaults follow the learning rate's rise (_warmup_bounds).
        self._auto_min, self._auto_max = min_warmup_steps is None, max_warmup_steps is None
        if max_warmup_steps is None:
            max_warmup_steps = self.DEFAULT_MAX_WARMUP
        if min_warmup_steps is None:  # the default, within a smaller maximum the caller gave
            min_warmup_steps = min(self.DEFAULT_MIN_WARMUP, max_warmup_steps)
        for name, v in (("min_warmup_steps", min_warmup_steps), ("max_warmup_steps", max_warmup_steps),
                        ("check_every", check_every)):
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "check_every" else 0):
                raise ValueError(f"{name} must be a non-negative integer (check_every >= 1), got {v!r}")
        if min_warmup_steps > max_warmup_steps:
            raise ValueError(f"min_warmup_steps ({min_warmup_steps}) > max_warmup_steps ({max_warmup_steps})")
        if not (variance_tolerance >= 0.0):
            raise ValueError(f"variance_tolerance must be >= 0, got {variance_tolerance!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay), codec=codec,
                         server_codec=server_codec, warmup_codec=warmup_codec, process_group=process_group,
                         transport=transport, bucket_elements=bucket_elements, sparsity_warmup=sparsity_warmup,
                         sparsity_start=sparsity_start, sparsity_stages=sparsity_stages, clip_norm=clip_norm)
        self.compress = compress
        self.factor_masking = bool(factor_masking)
        if local_variance and compress != "update":
            raise ValueError("local_variance needs compress='update' (each rank's own step)")
        self.local_variance = bool(local_variance)
        self.min_warmup_steps = min_warmup_steps
        self.max_warmup_steps = max_warmup_steps
        self.variance_tolerance = float(variance_tolerance)
        self.check_every = check_every
        if not isinstance(variance_refresh, int) or isinstance(variance_refresh, bool) or variance_refresh < 0:
            raise ValueError(f"variance_refresh must be an integer >= 0, got {variance_refresh!r}")
        self.variance_refresh = variance_refresh
        self._v = torch.zeros_like(self._m)
        self._v_count = 0  # the updates v holds (its bias correction is 1 - beta2^count)
        self._denom = torch.empty(0, device=self._m.device)  # frozen sqrt(v / bc2) + eps
        self._mloc = torch.empty(0, device=self._m.device)  # innovation: this rank's own momentum
        self._snapshot = torch.empty(0, device=self._m.device)  # v / bc2 at the last check
        self.variance_change = math.nan  # at the last check
        self._lr_rise = 0  # full-precision steps whose learning rate was above the previous step's
        self._last_lr: Optional[float] = None

    def _warmup_bounds(self) -> Tuple[int, int, bool]:
        """(min, max, rising): the stage's bounds now, and whether the learning rate
        rose at this step (a default bound waits for it to stop rising)."""
        lr = float(self.param_groups[0]["lr"])
        rising = self._last_lr is not None and lr > self._last_lr
        self._lr_rise += rising
        self._last_lr = lr
        low, high = self.min_warmup_steps, self.max_warmup_steps
        lifted = max(self.DEFAULT_MIN_WARMUP, self.LR_RISE_FACTOR * self._lr_rise)
        if self._auto_min:
            low = lifted if self._auto_max else min(lifted, high)
        if self._auto_max:
            high = max(high, low)
        return low, high, rising and self._auto_min and self._auto_max

    def _betas(self) -> Tuple[float, float]:
        b = self.param_groups[0]["betas"]
        return float(b[0]), float(b[1])

    def _full_precision_step(self, g: torch.Tensor) -> None:
        b1, b2 = self._betas()
        t = self._step
        if self.compress == "update" and self.compressing:
            # A variance refresh in update mode: the variance from the averaged
            # gradient, then the step as a compressed one (the ranks' own
            # momenta take the averaged gradient).
            self._v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            self._v_count += 1
            self._set_denom()
            self._update_step(g)
            return
        if self._mloc.numel():  # a variance refresh in innovation mode: the ranks' own momenta too
            self._mloc.mul_(b1).add_(g, alpha=1.0 - b1)
        self._m.mul_(b1).add_(g, alpha=1.0 - b1)
        self._v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        self._v_count += 1
        bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** self._v_count
        direction = self._g  # g is consumed
        for grp, lo, hi in self._groups():
            torch.div(self._v[lo:hi], bc2, out=direction[lo:hi]).sqrt_().add_(grp["eps"])
            torch.div(self._m[lo:hi], direction[lo:hi], out=direction[lo:hi])
        self._apply(direction, 1.0 / bc1)

    def _should_freeze(self) -> bool:
        t = self._step
        low, high, rising = self._warmup_bounds()
        if rising:
            return False
        if t >= high:
            return True
        if t % self.check_every:
            return False
        _, b2 = self._betas()
        v_hat = self._v / (1.0 - b2 ** t)
        if self._snapshot.numel():
            self.variance_change = float((v_hat - self._snapshot).abs().sum() / v_hat.abs().sum().clamp_min(1e-30))
        self._snapshot = v_hat
        return t >= low and self.variance_change <= self.variance_tolerance

    def _freeze(self) -> None:
        self._denom = torch.empty_like(self._v)
        self._set_denom()
        self._snapshot = torch.empty(0, device=self._m.device)
        if self.compress in ("innovation", "update"):
            self._mloc = self._m.clone()
        super()._freeze()

    def _full_precision_at(self, step: int) -> bool:
        """The warm-up; then, with variance_refresh R, the steps R, 3R, 7R,
        15R, ... after the freeze (0/1 Adam's doubling intervals): one
        full-precision step each, which updates the variance and refreezes it."""
        if not self.compressing:
            return True
        if not self.variance_refresh:
            return False
        k = (step - self._frozen_at) // self.variance_refresh + 1
        return (step - self._frozen_at) % self.variance_refresh == 0 and k & (k - 1) == 0

    def _refreshed(self) -> None:
        self._set_denom()

    def _set_denom(self) -> None:
        """d = sqrt(v / (1 - beta2^count)) + eps: v bias-corrected by the updates it holds."""
        _, b2 = self._betas()
        bc2 = 1.0 - b2 ** max(self._v_count, 1)
        for grp, lo, hi in self._groups():
            torch.div(self._v[lo:hi], bc2, out=self._denom[lo:hi]).sqrt_().add_(grp["eps"])

    def _count_v_updates(self) -> int:
        """The updates v holds after self._step steps, for a state_dict saved
        before v counted them: every step while warming up (and with
        local_variance), one per refresh step after the freeze."""
        if not self._frozen_at or self.local_variance:
            return self._step
        return self._frozen_at + sum(self._full_precision_at(t) for t in range(self._frozen_at + 1, self._step + 1))

    def _descend_frozen(self, direction: torch.Tensor) -> None:
        """p = p (1 - lr wd) - lr (m / bc1) / d; `direction` is scratch."""
        b1, _ = self._betas()
        torch.div(self._m, self._denom, out=direction)
        self._apply(direction, 1.0 / (1.0 - b1 ** self._step))

    def _compressed_step(self, g: torch.Tensor) -> None:
        b1, _ = self._betas()
        if self.compress == "update":
            self._update_step(g)
            return
        if self.compress == "innovation":
            # This rank's own momentum m_r = beta1 m_r + (1 - beta1) g_r moves
            # by d_r = (1 - beta1)(g_r - m_r); the shared momentum by the
            # ranks' average of C(d_r) (error feedback: what is not sent now
            # is sent later, the sum exact). Coordinates not sent keep their
            # shared momentum; the sent ones catch up with the ranks' own.
            g.sub_(self._mloc).mul_(1.0 - b1)
            self._mloc.add_(g)
            self._average_compressed_(g)
            self._m.add_(g)
        else:
            self._m.mul_(b1).add_(g, alpha=1.0 - b1)
            self._average_compressed_(self._m)
        self._descend_frozen(self._g)

    def _update_step(self, g: torch.Tensor) -> None:
        """update mode: DGC's momentum correction with Adam's frozen
        preconditioner. This rank's own momentum m_r = beta1 m_r + (1 -
        beta1) g_r; its step x_r = lr (m_r / bc1) / d is sent with error
        feedback (what is not sent now is applied later, not dropped);
        p = p (1 - lr wd) - avg_ranks C(x_r); with factor masking m_r = 0
        where this rank sent."""
        b1, b2 = self._betas()
        self._mloc.mul_(b1).add_(g, alpha=1.0 - b1)
        if self.local_variance:  # this rank's own Adam: the variance of its own gradients, never frozen
            self._v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            self._v_count += 1
            self._set_denom()
        bc1 = 1.0 - b1 ** self._step
        torch.div(self._mloc, self._denom, out=g)
        for grp, lo, hi in self._groups():
            g[lo:hi].mul_(grp["lr"] / bc1)
        self._average_compressed_(g)
        if self.factor_masking:
            self._mloc.masked_fill_(self._sent_mask(), 0.0)
        for p, lo, hi, grp in self._param_slices():
            if grp["weight_decay"]:
                p.mul_(1.0 - grp["lr"] * grp["weight_decay"])
            p.sub_(g[lo:hi].view_as(p))

    def _buffers(self, create: bool = False) -> Dict[str, torch.Tensor]:
        if create and self._frozen_at and self._denom.numel() != self._n:
            self._denom = torch.empty_like(self._v)
        if create and self._frozen_at and self.compress != "momentum" and self._mloc.numel() != self._n:
            self._mloc = torch.empty_like(self._v)
        out = {"m": self._m, "v": self._v}
        if self._denom.numel():
            out["denom"] = self._denom
        if self._mloc.numel():
            out["m_local"] = self._mloc
        return out

    def _drop_rank_state(self) -> None:
        # This rank's own momentum restarts from the shared one (the own variance of local_variance, which
        # has no shared counterpart, keeps the restored rank's).
        if self._mloc.numel():
            self._mloc.copy_(self._m)

    def state_dict(self) -> Dict[str, Any]:  # type: ignore[override]
        state = super().state_dict()
        state["compress"] = self.compress
        state["factor_masking"] = self.factor_masking
        state["local_variance"] = self.local_variance
        state["snapshot"] = self._snapshot.clone()
        state["variance_change"] = self.variance_change
        state["v_count"] = self._v_count
        state["lr_rise"] = [self._lr_rise, self._last_lr]
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:  # type: ignore[override]
        for key, default in (("compress", "momentum"), ("local_variance", False), ("factor_masking", False)):
            if isinstance(state, dict) and state.get(key, default) != getattr(self, key):
                raise ValueError(f"the state_dict was saved with {key}={state.get(key, default)!r}, this "
                                 f"optimizer has {getattr(self, key)!r}")
        super().load_state_dict(state)
        self._snapshot = state["snapshot"].clone().to(self._m.device)
        self.variance_change = float(state["variance_change"])
        self._v_count = int(state["v_count"]) if "v_count" in state else self._count_v_updates()
        rise, last = state.get("lr_rise", [0, None])  # states saved before the rule: counted from here on
        self._lr_rise, self._last_lr = int(rise), None if last is None else float(last)
        if not self._frozen_at:
            self._denom = torch.empty(0, device=self._m.device)
            self._mloc = torch.empty(0, device=self._m.device)


class CompressedSGD(_CompressedMomentum):
    """Momentum SGD whose momentum travels compressed after ``warmup_steps``
    full-precision steps (1-bit SGD with momentum's exchange moved after the
    momentum update, as in 1-bit Adam).

    The update (float32): full precision, g averaged: m = mu m + g + wd p;
    compressed, g this rank's: m = avg_ranks(mu m + g + wd p), compressed;
    then p = p - lr m. Usage and the other arguments as
    :class:`CompressedAdamW`.

    ``momentum_correction=True`` is Deep Gradient Compression (Lin et al.,
    arXiv 1712.01887) for top-k: the momentum stays each rank's own, u = mu
    u + g + wd p (g clipped locally with ``clip_norm``), the exchange's
    worker error feedback is DGC's accumulator v (v += u; top-k of v is
    sent, v = 0 there), the decoded average is the step, p = p - lr
    avg_ranks(sent); and with ``factor_masking`` (default True) u = 0 where
    this rank sent (DGC's momentum factor masking: the worker residual is
    exactly zero at those coordinates). ``sparsity_warmup`` as for
    :class:`CompressedAdamW`.
    """

    _KIND = "sgd"

    def __init__(self, params: Iterable[Any], lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.0,
                 *, codec: Union[str, Codec] = "onebit", server_codec: Optional[str] = "same", warmup_steps: int = 10,
                 warmup_codec: Optional[str] = None, process_group: Any = None, transport: str = "torch",
                 bucket_elements: int = 1 << 24, momentum_correction: bool = False, factor_masking: bool = True,
                 sparsity_warmup: int = 0, sparsity_start: float = 0.25, sparsity_stages: int = 4,
                 clip_norm: Optional[float] = None) -> None:
        if not (0.0 <= momentum < 1.0):
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay), codec=codec,
                         server_codec=server_codec, warmup_codec=warmup_codec, process_group=process_group,
                         transport=transport, bucket_elements=bucket_elements, sparsity_warmup=sparsity_warmup,
                         sparsity_start=sparsity_start, sparsity_stages=sparsity_stages, clip_norm=clip_norm)
        self.momentum_correction = bool(momentum_correction)
        self.factor_masking = bool(factor_masking)
        self.warmup_steps = warmup_steps
        if warmup_steps == 0:
            self._frozen_at = -1  # compressed from the first step

    @property
    def compressing(self) -> bool:
        return self._frozen_at != 0

    def _momentum(self, g: torch.Tensor) -> None:
        for p, lo, hi, grp in self._param_slices():
            if grp["weight_decay"]:
                g[lo:hi].add_(p.reshape(-1), alpha=grp["weight_decay"])
        for grp, lo, hi in self._groups():
            self._m[lo:hi].mul_(grp["momentum"]).add_(g[lo:hi])

    def _full_precision_step(self, g: torch.Tensor) -> None:
        self._momentum(g)
        self._descend()

    def _descend(self) -> None:
        for p, lo, hi, grp in self._param_slices():
            p.add_(self._m[lo:hi].view_as(p), alpha=-grp["lr"])

    def _should_freeze(self) -> bool:
        return self._step >= self.warmup_steps

    def _compressed_step(self, g: torch.Tensor) -> None:
        self._momentum(g)
        if not self.momentum_correction:
            self._average_compressed_(self._m)
            self._descend()
            return
        # DGC: the momentum stays this rank's (u = mu u + g); the exchange's
        # error feedback accumulates it (v = v + u) and sends top-k of v; the
        # decoded average is the step. Factor masking: u = 0 where v was sent.
        g.copy_(self._m)
        self._average_compressed_(g)
        if self.factor_masking:
            self._m.masked_fill_(self._sent_mask(), 0.0)
        for p, lo, hi, grp in self._param_slices():
            p.add_(g[lo:hi].view_as(p), alpha=-grp["lr"])

    def state_dict(self) -> Dict[str, Any]:  # type: ignore[override]
        state = super().state_dict()
        state["dgc"] = [self.momentum_correction, self.factor_masking]
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:  # type: ignore[override]
        mine = [self.momentum_correction, self.factor_masking]
        if isinstance(state, dict) and state.get("dgc", [False, True]) != mine:
            raise ValueError(f"the state_dict was saved with momentum_correction, factor_masking = "
                             f"{state.get('dgc', [False, True])!r}, this optimizer has {mine!r}")
        super().load_state_dict(state)


def _ddp_hook(opt: _CompressedMomentum, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """register_ddp's hook: DDP's own averaging while the optimizer is in full
    precision; the local gradient, untouched, afterwards."""
    buffer = bucket.buffer()
    if not opt._full_precision_at(opt._step + 1) or opt._world <= 1 or not opt._ddp_averages:
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(buffer)
        return fut
    buffer.mul_(1.0 / opt._world)
    work = dist.all_reduce(buffer, group=opt.process_group, async_op=True)
    return work.get_future().then(lambda f: f.value()[0])


# -- top-k density and error-feedback helpers (DGC's sparsity warm-up, factor masking) --


def _topk_density(codec: Codec) -> Optional[float]:
    """The density of a ``topk:density=...`` codec; None for any other codec (or ``k=``)."""
    if codec.name != "topk" or codec.params["k"]:
        return None
    return float(codec.params["density"])


def _with_density(spec: str, density: float) -> str:
    """`spec` (a canonical topk spec with a density) with another density, canonical."""
    return _core.respec(spec, f"density={density:.6g}")
