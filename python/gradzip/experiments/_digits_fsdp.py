"""FSDP2 in the digits experiment: methods ``fp32@fsdp`` and ``<codec spec>@fsdp``.

No DDP: every Linear layer and the whole model are ``fully_shard``-ed (each
rank holds a shard of every parameter and of its momentum), and the gradients
are reduce-scattered: by torch's own reduce-scatter for ``fp32@fsdp``, by
gradzip's compressed one (:func:`gradzip.torch.fsdp.register`) for a codec.

Bytes are the gradient reduce-scatter's only (FSDP's parameter all-gathers are
the same for every method): wire = what this rank sent; for fp32@fsdp the
uncompressed reduce-scatter's (P-1)/P of the padded fp32 gradient. The table's
wire ratio for these rows is against that, not against an allreduce.

    onebit@fsdp        topk:density=0.01@fsdp        fp32@fsdp
"""

from __future__ import annotations

import math
from typing import Any, Tuple

from ._digits_method import Method, Settings


def parse(method: str) -> str:
    """The codec spec of a method (``"fp32"``: torch's reduce-scatter)."""
    spec, _, rest = method.partition("@fsdp")
    if rest or not spec:
        raise ValueError(f"method {method!r}: write fp32@fsdp or <codec>@fsdp")
    return spec


def setup(method: str, model: Any, seed: int, settings: Settings) -> Method:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from gradzip.torch import fsdp as gz_fsdp

    spec = parse(method)
    ranks = dist.get_world_size()
    # What torch's reduce-scatter sends: dim 0 of each gradient padded to a
    # multiple of the world size, (P-1)/P of it, fp32.
    padded = sum(math.ceil(p.shape[0] / ranks) * ranks * (p.numel() // p.shape[0]) for p in model.parameters())
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum)
    dense_wire = 4.0 * padded * (ranks - 1) / ranks
    state = None if spec == "fp32" else gz_fsdp.register(model, codec=spec)

    def bytes_per_step(steps: int) -> Tuple[float, float]:
        if state is None:
            return 4.0 * padded, dense_wire
        wire = state.compression_stats()["wire_bytes"] / steps
        return wire * ranks / (ranks - 1), wire  # payload: every chunk's, this rank's own included

    return Method(model, opt, bytes_per_step,
                         extra={"collective": "reduce_scatter", "fp32_wire_bytes_per_step": dense_wire})
