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
and training continues bit-identically.
"""

from __future__ import annotations

import os
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
