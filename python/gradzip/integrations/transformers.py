"""gradzip in a transformers ``Trainer``: one line.

    trainer = Trainer(model=model, args=args, train_dataset=ds)
    gradzip.integrations.transformers.compress(trainer, CompressionState())
    trainer.train()                                    # or train(resume_from_checkpoint=...)

``compress`` adds a callback that, when training begins, installs the
compression on the DDP model Trainer built (the hook; or
``register_ddp`` for a :class:`gradzip.torch.CompressedAdamW` passed as
``Trainer(optimizers=(opt, None))``; nothing for the backend, whose process
group compresses), writes every rank's gradzip state into each
``checkpoint-<step>`` folder Trainer saves, and reads it back when
``train(resume_from_checkpoint=...)`` resumes: training then continues
bit-identically. The backend route: call
``torch.distributed.init_process_group("cpu:gradzip,cuda:gradzip")`` before
``TrainingArguments`` (Trainer accepts a group that exists; its
``ddp_backend`` argument accepts no other backend than torch's own), and
pass :mod:`gradzip.torch.backend`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Optional

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..torch import checkpoint
from . import _install

__all__ = ["GradzipCallback", "compress"]


class GradzipCallback(TrainerCallback):
    """The callback :func:`compress` adds (use that: it also learns the
    checkpoint ``train()`` resumes from)."""

    def __init__(self, trainer: Any, compression: Any) -> None:
        _install.kind(compression)
        self.trainer = trainer
        self.compression = compression
        self.resume_from: Optional[str] = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _install.install(self.compression, self.trainer.model_wrapped)
        if self.resume_from is not None:  # after Trainer restored the optimizer: the rank files win
            _install.restore(self.resume_from, [_install.stateful(self.compression)], self.trainer.model_wrapped)
            self.resume_from = None

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        checkpoint.save(folder, _install.stateful(self.compression))


def compress(trainer: Any, compression: Any) -> GradzipCallback:
    """Compresses `trainer`'s gradient exchange with `compression` (a
    CompressionState, the CompressedAdamW/CompressedSGD given to Trainer as
    its optimizer, or gradzip.torch.backend) and carries its per-rank state
    through Trainer's checkpoints. Returns the callback it added."""
    callback = GradzipCallback(trainer, compression)
    trainer.add_callback(callback)
    train = trainer.train

    @functools.wraps(train)
    def train_resuming(resume_from_checkpoint: Any = None, *a: Any, **kw: Any) -> Any:
        if isinstance(resume_from_checkpoint, bool) and resume_from_checkpoint:
            callback.resume_from = get_last_checkpoint(trainer.args.output_dir)  # as Trainer resolves True
        elif resume_from_checkpoint:
            callback.resume_from = os.fspath(resume_from_checkpoint)
        return train(resume_from_checkpoint, *a, **kw)

    trainer.train = train_resuming
    return callback
