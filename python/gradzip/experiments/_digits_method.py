"""What digits and its method families (``_digits_bmuf``, ``_digits_fsdp``)
share: the training settings and the contract of a method's setup. In a
module of its own so that the families depend on it, not on digits.py (which
picks a family by method name and imports it)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple


@dataclass
class Settings:
    """Training settings; the defaults are the ones BENCHMARKS.md reports."""

    epochs: int = 40
    batch_per_rank: int = 32
    lr: float = 0.1
    # 0.8, not 0.9: with 0.9 (an effective step of 1.0) onebit with blocks of
    # 512 diverged on this model while fp32 did not (docs/python.md).
    momentum: float = 0.8
    hidden: int = 128
    powersgd_start: int = 2  # the smallest PowerSGD allows with error feedback
    threads_per_rank: int = 1
    #: Evaluate the shared model every this many steps, when it changed since
    #: the last evaluation (0: only at the end); the accuracy curve goes to
    #: Result.extra["curve"] as (training seconds, step, accuracy), with the
    #: evaluations' time left out of the training time.
    eval_every: int = 0


@dataclass
class Method:
    """How one method trains: what the batches go through and what steps it,
    set up by ``digits._setup`` (DDP with or without a hook) or another family's
    setup (see FAMILIES)."""

    forward: Any                  # the module the batches go through (DDP, or the model itself)
    optimizer: Any                # zero_grad() and step()
    #: (steps) -> (payload, wire) bytes per step of this rank, called after training.
    bytes_per_step: Callable[[int], Tuple[float, float]]
    #: () -> context manager: the model every rank holds is in `model` inside it.
    shared_model: Callable[[], Any] = contextlib.nullcontext
    #: () -> a number that changes whenever the shared model does (evaluation
    #: points); None: it changes with every step.
    version: Optional[Callable[[], int]] = None
    finish: Callable[[], None] = lambda: None  # after the last step (e.g. end a partial block)
    extra: Dict[str, Any] = field(default_factory=dict)
