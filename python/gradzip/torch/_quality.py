"""What keeps training quality, as measured: the codec the DDP hook and the
process-group backend default to, which optimizers are adaptive, and which
codec families lose quality under them. One place, so that the hook's and
the backend's defaults, the hook's warning and BlockMomentum's ``auto`` all
read the same answer.
"""

from __future__ import annotations

import logging
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

# Codec families that lose quality with an adaptive optimizer even with the hook's
# adaptive defaults, and what was measured (issue 31, the LM experiment, AdamW,
# 4 ranks, vs fp32's validation loss; wire bytes vs fp32 DDP).
LOSSY_UNDER_ADAPTIVE = {
    "onebit": "onebit ended +4.6% above fp32's validation loss (11.4x fewer bytes)",
    "topk": "topk:density=0.01 ended +16.0% above fp32's validation loss (20.7x fewer bytes)",
}
_KEEPS = "CompressedAdamW(codec='onebit') ended -3.6% at 15.1x"

logger = logging.getLogger("gradzip.torch.hook")  # the warning is the hook's
_warned = False


def is_adaptive(optimizer: Any) -> bool:
    """Whether `optimizer` divides by a running second moment: torch's Adam
    family, Adagrad, Adadelta, RMSprop, Adafactor (or a subclass), or any
    optimizer with ``betas`` in its defaults."""
    names = {c.__name__ for c in type(optimizer).__mro__ if c.__module__.startswith("torch.optim")}
    return bool(names & set(_ADAPTIVE_OPTIMIZERS)) or "betas" in getattr(optimizer, "defaults", {})


def warn_adaptive(codec_spec: str, codec_name: str) -> bool:
    """Logs, once per process, that `codec_spec` loses quality under an adaptive
    optimizer and names the method that keeps it. Whether it logged now."""
    global _warned
    measured = LOSSY_UNDER_ADAPTIVE.get(codec_name)
    if measured is None or _warned:
        return False
    _warned = True
    logger.warning("gradzip: the DDP hook's codec %r loses quality under an adaptive optimizer (Adam, AdamW, ...): "
                   "on the LM experiment with AdamW the hook's %s, where %s (BENCHMARKS.md section 11). "
                   "gradzip.torch.CompressedAdamW keeps AdamW's quality at a high ratio; the hook's default "
                   "codec (%s, 7.7x) ended -3.2%% at 4 ranks and -0.5%% at 8 (means over seeds).",
                   codec_spec, measured, _KEEPS, DEFAULT_CODEC)
    return True
