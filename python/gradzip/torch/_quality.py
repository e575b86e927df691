"""What keeps training quality, as measured: the codec the DDP hook and the
process-group backend default to, and which optimizers are adaptive. One
place, so that the hook's and the backend's defaults and BlockMomentum's
``auto`` read the same answer.
"""

from __future__ import annotations

from typing import Any

# The default codec of CompressionState() and Policy() (and so of GRADZIP_POLICY
# without codec=): qsgd 4-bit, 7.7x fewer wire bytes than fp32 DDP. On the LM
# experiment with AdamW, vs fp32's validation loss: the hook -3.2% and the backend
# -4.4% at 4 ranks (means of 3 seeds, worst -1.1%), -0.5% and -2.1% at 8 ranks
# (5 seeds; worst seeds +8.8% and +1.3%); digits with momentum SGD: fp32's accuracy
# on every seed. onebit, the former default, ended +4.6% (hook) and +8.4% (backend)
# at 4 ranks. BENCHMARKS.md section 11, "Defaults that keep AdamW's quality".
DEFAULT_CODEC = "qsgd:bits=4"

# torch.optim classes that divide by a running second moment (or an accumulator of squares).
_ADAPTIVE_OPTIMIZERS = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "Adagrad", "Adadelta", "RMSprop", "SparseAdam",
                        "Adafactor")


def is_adaptive(optimizer: Any) -> bool:
    """Whether `optimizer` divides by a running second moment: torch's Adam
    family, Adagrad, Adadelta, RMSprop, Adafactor (or a subclass), or any
    optimizer with ``betas`` in its defaults."""
    names = {c.__name__ for c in type(optimizer).__mro__ if c.__module__.startswith("torch.optim")}
    return bool(names & set(_ADAPTIVE_OPTIMIZERS)) or "betas" in getattr(optimizer, "defaults", {})

