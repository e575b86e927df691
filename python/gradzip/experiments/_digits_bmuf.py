"""Block momentum in the digits experiment: methods ``<codec spec>@bmuf:h=H[,...]``.

No DDP: each rank trains its own copy of the model with the experiment's
SGD (lr, momentum) and :class:`gradzip.torch.BlockMomentum` exchanges the
compressed model update every H steps. Options after ``bmuf:``, comma
separated: ``h`` (block steps, required), ``mu`` (block momentum, default
1 - 1/P), ``lr`` (block learning rate, default 1), ``sync`` (sync_steps: the
first N steps each end a block, default 0), ``nesterov=on|off``
(default on), ``overlap=on|off`` (default off), ``algorithm`` (default auto),
``server`` (scatter_reduce's server codec, a spec without commas),
``exact=N|off`` (the layer filter, BlockMomentum's ``exact_below``; the
DDP hook's ``@hook:exact=`` in the LM experiment reads it alike),
``transport=gradzip|torch``: gradzip's own UCX connections (default here:
the transport BENCHMARKS.md section 7 was measured over) or the gloo group
itself (BlockMomentum's own default).

    onebit@bmuf:h=16                  topk:density=0.01@bmuf:h=4,overlap=on
    onebit@bmuf:h=16,algorithm=scatter_reduce,server=onebit
    qsgd:bits=4@bmuf:h=16,transport=torch     onebit@bmuf:h=16,exact=1024
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from ._digits_method import Method, Settings

_ON_OFF = {"on": True, "off": False}
_TRANSPORTS = ("gradzip", "torch")


def exact_below_of(method: str, value: str) -> Optional[int]:
    """A method's ``exact=N|off`` option: the layer filter's exact_below (None: off)."""
    if value == "off":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"method {method!r}: exact= takes an element count or off, got {value!r}") from None


def parse(method: str) -> Tuple[str, Dict[str, Any]]:
    """(codec spec, BlockMomentum keyword arguments) of a method string."""
    spec, _, rest = method.partition("@bmuf")
    if not rest.startswith(":"):
        raise ValueError(f"method {method!r}: write <codec>@bmuf:h=H[,mu=..,lr=..,nesterov=on|off,overlap=on|off,"
                         f"transport=gradzip|torch]")
    kwargs: Dict[str, Any] = {"transport": "gradzip"}
    for item in rest[1:].split(","):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"method {method!r}: {item!r} is not key=value")
        if key == "h":
            kwargs["block_steps"] = int(value)
        elif key == "mu":
            kwargs["block_momentum"] = float(value)
        elif key == "lr":
            kwargs["block_lr"] = float(value)
        elif key == "sync":
            kwargs["sync_steps"] = int(value)
        elif key in ("nesterov", "overlap") and value in _ON_OFF:
            kwargs[key] = _ON_OFF[value]
        elif key == "algorithm":
            kwargs["algorithm"] = value
        elif key == "server":
            kwargs["server_codec"] = value
        elif key == "transport" and value in _TRANSPORTS:
            kwargs["transport"] = value
        elif key == "exact":
            kwargs["exact_below"] = exact_below_of(method, value)
        else:
            raise ValueError(f"method {method!r}: unknown option {item!r} (h, mu, lr, sync, nesterov=on|off, "
                             f"overlap=on|off, algorithm, server, exact=N|off, transport=gradzip|torch)")
    if "block_steps" not in kwargs:
        raise ValueError(f"method {method!r}: h=H (block steps) is required")
    return spec, kwargs


def setup(method: str, model: Any, seed: int, settings: Settings) -> Method:
    import torch

    from gradzip.torch import BlockMomentum

    spec, kwargs = parse(method)
    local = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum)
    opt = BlockMomentum(model, local, codec=spec, **kwargs)

    def bytes_per_step(steps: int) -> Tuple[float, float]:
        s = opt.compression_stats()
        return s["payload_bytes_per_block"] * s["blocks"] / steps, s["wire_bytes_per_step"]

    def finish() -> None:
        opt.sync()
        opt.close()

    return Method(model, opt, bytes_per_step, shared_model=opt.global_model,
                         version=lambda: opt.compression_stats()["blocks"], finish=finish,
                         extra={"block_steps": opt.block_steps, "block_momentum": opt.block_momentum,
                                "block_lr": opt.block_lr, "nesterov": opt.nesterov, "overlap": opt.overlap,
                                "transport": opt.transport, "exact_below": opt.exact_below})

