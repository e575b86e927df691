"""Which optimizers are adaptive: one answer for the DDP hook's defaults and
BlockMomentum's ``auto`` (they used two tests, and BlockMomentum's missed
RMSprop, which has no ``betas``).
"""

from __future__ import annotations

from typing import Any

# torch.optim classes that divide by a running second moment (or an accumulator of squares).
_ADAPTIVE_OPTIMIZERS = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "Adagrad", "Adadelta", "RMSprop", "SparseAdam",
                        "Adafactor")


def is_adaptive(optimizer: Any) -> bool:
    """Whether `optimizer` divides by a running second moment: torch's Adam
    family, Adagrad, Adadelta, RMSprop, Adafactor (or a subclass), or any
    optimizer with ``betas`` in its defaults."""
    names = {c.__name__ for c in type(optimizer).__mro__ if c.__module__.startswith("torch.optim")}
    return bool(names & set(_ADAPTIVE_OPTIMIZERS)) or "betas" in getattr(optimizer, "defaults", {})
