"""gradzip in a Lightning ``Trainer``: one callback.

    trainer = L.Trainer(strategy="ddp", callbacks=[GradzipCallback(CompressionState())])
    trainer.fit(model)                       # or fit(model, ckpt_path=...)

The callback installs the compression on the DDP model when fitting starts
(the hook, on CPU as on CUDA; Lightning's own ``ddp_comm_hook`` argument
registers on CUDA only), or ``register_ddp`` on the
:class:`gradzip.torch.CompressedAdamW` that ``configure_optimizers`` returns
(pass ``GradzipCallback("optimizer")``), or nothing for the backend
(``DDPStrategy(process_group_backend="cpu:gradzip,cuda:gradzip")``, pass
:mod:`gradzip.torch.backend`). On every checkpoint, each rank writes its
gradzip state into ``<checkpoint dir>/gradzip/step-<n>/`` and the checkpoint
records that folder; ``fit(ckpt_path=...)`` reads every rank's own file back,
and training continues bit-identically. When Lightning removes a checkpoint
(``ModelCheckpoint``'s ``save_top_k``, a ``last.ckpt`` written again), rank 0
removes the rank files no remaining checkpoint of this run names, so the
folder holds as many as the checkpoints kept (the files sit where the
checkpoints do: a folder every rank reaches, as Lightning's resume needs).
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List, Optional

import lightning.pytorch as pl

from ..torch import checkpoint
from . import _install

__all__ = ["GradzipCallback"]

OPTIMIZER = "optimizer"


class GradzipCallback(pl.Callback):
    """Installs gradzip compression and carries its per-rank state through
    Lightning's checkpoints. `compression`: a CompressionState, the
    gradzip.torch.backend module, or ``"optimizer"`` (the CompressedAdamW /
    CompressedSGD that configure_optimizers returns)."""

    def __init__(self, compression: Any) -> None:
        if compression != OPTIMIZER:
            _install.kind(compression)
        self.compression = compression
        self._restored: Optional[str] = None

    def _objects(self, trainer: "pl.Trainer") -> List[Any]:
        if self.compression != OPTIMIZER:
            return [_install.stateful(self.compression)]
        found = []
        for opt in trainer.optimizers:
            try:
                if _install.kind(opt) == _install.OPTIMIZER:
                    found.append(_install.stateful(opt))
            except TypeError:
                continue
        if not found:
            raise TypeError("GradzipCallback('optimizer'): configure_optimizers returned no CompressedAdamW or "
                            "CompressedSGD")
        return found

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        for obj in self._objects(trainer):
            _install.install(obj, trainer.strategy.model)
        _follow_removals(trainer.strategy.checkpoint_io)

    def _folder(self, trainer: "pl.Trainer") -> str:
        cb = trainer.checkpoint_callback
        root = getattr(cb, "dirpath", None) or trainer.default_root_dir
        return os.path.join(root, "gradzip", f"step-{trainer.global_step}")

    def on_save_checkpoint(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           checkpoint_dict: Dict[str, Any]) -> None:
        folder = self._folder(trainer)
        checkpoint.save(folder, *self._objects(trainer))  # every rank: Lightning builds the dict on each
        checkpoint_dict["gradzip"] = {"rank_files": folder}  # rank 0's copy is the one written

    def on_load_checkpoint(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           checkpoint_dict: Dict[str, Any]) -> None:
        entry = checkpoint_dict.get("gradzip")
        folder = entry.get("rank_files") if isinstance(entry, dict) else None
        self._restored = folder if isinstance(folder, str) else ""

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # After Lightning restored the optimizers (rank 0's copy): every rank reads its own file.
        if self._restored is None:
            return
        folder, self._restored = self._restored, None
        if not folder:  # a checkpoint saved without this callback: the objects' own resume agreement decides
            return
        _install.restore(folder, self._objects(trainer), trainer.strategy.model)


def _follow_removals(io: Any) -> None:
    """Makes the strategy's CheckpointIO (which writes and removes every
    checkpoint file, on rank 0) remove a checkpoint's rank-file folder with
    the last checkpoint that names it. Once per CheckpointIO; its own
    save_checkpoint/remove_checkpoint run first, unchanged."""
    if getattr(io, "_gradzip_follows", False):
        return
    save, remove = io.save_checkpoint, io.remove_checkpoint
    named: Dict[str, str] = {}  # checkpoint path -> the rank-file folder it names (this run's saves)

    def drop(folder: Optional[str]) -> None:
        # Only gradzip's own step folders, and only when no kept checkpoint names them.
        if not folder or folder in named.values():
            return
        if os.path.basename(os.path.dirname(folder)) == "gradzip" and os.path.basename(folder).startswith("step-"):
            shutil.rmtree(folder, ignore_errors=True)

    def save_checkpoint(checkpoint: Dict[str, Any], path: Any, *args: Any, **kwargs: Any) -> None:
        save(checkpoint, path, *args, **kwargs)
        entry = checkpoint.get("gradzip") if isinstance(checkpoint, dict) else None
        folder = entry.get("rank_files") if isinstance(entry, dict) else None
        if isinstance(folder, str):
            before = named.get(str(path))
            named[str(path)] = folder
            drop(before)  # a path written again (last.ckpt): its former folder, unless another names it

    def remove_checkpoint(path: Any, *args: Any, **kwargs: Any) -> None:
        remove(path, *args, **kwargs)
        drop(named.pop(str(path), None))

    io.save_checkpoint, io.remove_checkpoint = save_checkpoint, remove_checkpoint
    io._gradzip_follows = True
