"""The statistics every entry point reports, defined once.

Each entry point's ``compression_stats()`` holds these three keys, with one
meaning everywhere, beside keys of its own:

- ``wire_bytes``: what this rank sent over the network since it was built
  (or since the checkpoint it restored), as the communicator counts it;
  steps that sent uncompressed count at what they sent (modelled as torch
  sends it: a ring allreduce sends 2(P-1)/P of the buffer).
- ``baseline_wire_bytes``: what the uncompressed collective it replaces
  would have sent from this rank for the same work: fp32 DDP's ring
  allreduce of the gradient (the hook, the compressed optimizers,
  BlockMomentum per local step), torch's reduce-scatter of the same tensors
  (FSDP2), a ring allreduce of the tensors it compressed (the backend).
- ``wire_ratio``: baseline_wire_bytes / wire_bytes (nan before anything was
  sent): how many times fewer bytes than the uncompressed run.
"""

import math
from typing import Dict

KEYS = ("wire_bytes", "baseline_wire_bytes", "wire_ratio")


def ring(nbytes: float, world_size: int) -> float:
    """Bytes one rank sends in a ring allreduce of `nbytes`: 2(P-1)/P of it."""
    p = max(int(world_size), 1)
    return nbytes * 2 * (p - 1) / p


def core(wire_bytes: float, baseline_wire_bytes: float) -> Dict[str, float]:
    """The three shared keys."""
    return {"wire_bytes": float(wire_bytes), "baseline_wire_bytes": float(baseline_wire_bytes),
            "wire_ratio": baseline_wire_bytes / wire_bytes if wire_bytes else math.nan}
