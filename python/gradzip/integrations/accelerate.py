"""gradzip with Hugging Face Accelerate: one line after ``prepare``.

    model, opt, dl = accelerator.prepare(model, opt, dl)
    gradzip.integrations.accelerate.compress(accelerator, model, CompressionState())
    ...
    accelerator.save_state(folder)     # every rank also writes its gradzip file there
    accelerator.load_state(folder)     # every rank reads its own back

``compress`` installs the compression on the prepared DDP model (the hook;
``register_ddp`` for a :class:`gradzip.torch.CompressedAdamW` given to
``prepare``; nothing for the backend) and registers save and load hooks that
Accelerate runs on every rank. Accelerate restores the optimizer after the
load hook, from rank 0's copy; gradzip restores its rank files again at the
next step, so every rank continues with its own error feedback. Do not
also ``register_for_checkpointing`` the gradzip object: that saves rank 0's
copy only. The backend route: call
``torch.distributed.init_process_group("cpu:gradzip,cuda:gradzip")`` before
``Accelerator()`` (``InitProcessGroupKwargs(backend=...)`` accepts only
torch's own backends) and pass :mod:`gradzip.torch.backend`.
"""

from __future__ import annotations

from typing import Any

from ..torch import checkpoint
from . import _install

__all__ = ["compress"]


def compress(accelerator: Any, model: Any, compression: Any) -> None:
    """Compresses `model`'s gradient exchange with `compression` and carries
    its per-rank state through ``accelerator.save_state``/``load_state``."""
    _install.install(compression, model)
    obj = _install.stateful(compression)
    accelerator.register_save_state_pre_hook(lambda models, weights, output_dir: checkpoint.save(output_dir, obj))
    accelerator.register_load_state_pre_hook(lambda models, input_dir: _install.restore(input_dir, [obj], model))
