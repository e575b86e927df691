"""The process-group backend as an experiment method (lm and digits): ``backend``
is DDP without a hook on a ``dist.new_group(backend="gradzip")`` with the
default ``Policy()``, ``<spec>@backend[:min=N]`` the same with
``Policy(<spec>, min_elements=N)``."""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple


def belongs(method: str) -> bool:
    return method == "backend" or "@backend" in method


def setup(method: str, model: Any) -> Tuple[Any, Callable[[int], float], Callable[[], Dict[str, Any]]]:
    """(DDP over a new gradzip group, wire(steps): this rank's wire bytes over
    `steps` steps, extra(): the policy and the group's call counts)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradzip.torch.backend import Policy, compression_stats

    spec, _, rest = ("", "", "") if method == "backend" else method.partition("@backend")
    opts = dict(item.partition("=")[::2] for item in rest[1:].split(",")) if rest.startswith(":") else {}
    if (rest and not rest.startswith(":")) or set(opts) - {"min"}:
        raise ValueError(f"method {method!r}: write backend or <spec>@backend[:min=N]")
    kw: Dict[str, Any] = {"min_elements": int(opts["min"])} if "min" in opts else {}
    policy = Policy(spec, **kw) if spec else Policy(**kw)
    group = dist.new_group(backend="gradzip", pg_options=policy)
    ddp = DDP(model, process_group=group)
    p = dist.get_world_size()
    ring = 2.0 * (p - 1) / p
    dense = float(sum(q.numel() * q.element_size() for q in model.parameters()))

    def wire(steps: int) -> float:
        # The engine's bytes for what it compressed, and a ring allreduce of fp32 for
        # every gradient byte it kept exact (compression_stats counts only exact calls).
        s = compression_stats(group)
        return s["wire_bytes"] + ring * max(dense * steps - s["compressed_bytes"], 0.0)

    def extra() -> Dict[str, Any]:
        s = compression_stats(group)
        return {"policy": repr(policy), **{k: s[k] for k in ("compressed_calls", "exact_calls", "compressed_bytes")}}

    return ddp, wire, extra
