"""What the integrations share: which kind of gradzip object compresses,
installing it on a DDP model, and the object whose state travels."""

from __future__ import annotations

import types
import warnings
from typing import Any, List

import torch.distributed as dist

HOOK, OPTIMIZER, BACKEND = "hook", "optimizer", "backend"


def kind(obj: Any) -> str:
    """HOOK, OPTIMIZER or BACKEND; TypeError for anything else."""
    from gradzip.torch import CompressedAdamW, CompressedSGD, CompressionState, backend

    obj = _inner(obj)
    if isinstance(obj, CompressionState):
        return HOOK
    if isinstance(obj, (CompressedAdamW, CompressedSGD)):
        return OPTIMIZER
    if obj is backend or (isinstance(obj, types.ModuleType) and obj.__name__ == backend.__name__):
        return BACKEND
    raise TypeError("gradzip integrations take a CompressionState, a CompressedAdamW or CompressedSGD, or the "
                    f"gradzip.torch.backend module; got {type(obj).__name__}")


def _inner(optimizer: Any) -> Any:
    """The optimizer a stack wrapped (Accelerate's AcceleratedOptimizer, Lightning's)."""
    while not isinstance(optimizer, types.ModuleType) and hasattr(optimizer, "optimizer") \
            and not hasattr(optimizer, "register_ddp"):
        optimizer = optimizer.optimizer
    return optimizer


def install(obj: Any, model: Any) -> None:
    """Puts `obj` to work on `model` (a DistributedDataParallel, or anything
    else in a one-process run, which is left alone). Once per model: a
    second call (a second ``train()``) does nothing."""
    from torch.nn.parallel import DistributedDataParallel

    from gradzip.torch import compression_hook

    k, obj = kind(obj), _inner(obj)
    if k == BACKEND:
        if dist.is_initialized() and "gradzip" not in str(dist.get_backend()):
            warnings.warn(f"gradzip integration given the backend, but the default process group's backend is "
                          f"{dist.get_backend()!r}: nothing is compressed. Call "
                          "init_process_group('cpu:gradzip,cuda:gradzip') before the stack starts.",
                          RuntimeWarning, stacklevel=3)
        return
    if not isinstance(model, DistributedDataParallel):
        return
    if getattr(model, "_gradzip_installed", None) is obj:
        return
    if k == HOOK:
        model.register_comm_hook(obj, compression_hook)
    else:
        obj.register_ddp(model)
    model._gradzip_installed = obj


def stateful(obj: Any) -> Any:
    """The object whose state_dict travels: the object itself (the backend
    module has module-level state_dict/load_state_dict)."""
    kind(obj)
    return _inner(obj)


def rebuilds_buckets(model: Any) -> bool:
    """Whether DDP lays its buckets out again after the first step (by the
    order gradients became ready): DDP does unless find_unused_parameters=True
    (and static_graph is off)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return False
    return bool(getattr(model, "static_graph", False)) or not model.find_unused_parameters


def restore(folder: str, objects: List[Any], model: Any) -> bool:
    """checkpoint.load of `objects` from `folder`, after the stack restored
    its own state; for the backend under a DDP that lays its buckets out
    again, warns and leaves the backend's error feedback fresh instead."""
    from gradzip.torch import checkpoint

    if any(kind(o) == BACKEND for o in objects) and rebuilds_buckets(model):
        # The backend keys its residuals by call and size: the saved run's are laid out by DDP's rebuilt
        # buckets, and a restarted DDP's first step reduces its first layout (registration order). Applying
        # them would add each residual to other parameters' gradients.
        warnings.warn("gradzip backend: not restoring the error feedback, whose layout is DDP's rebuilt buckets; "
                      "a restarted DDP's first step uses another layout. Every rank continues with fresh error "
                      "feedback. For a bit-identical resume build DDP with find_unused_parameters=True (one "
                      "layout), or compress with the hook (CompressionState), which follows parameters.",
                      RuntimeWarning, stacklevel=3)
        return False
    return checkpoint.load(folder, *objects)
