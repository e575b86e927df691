"""gradzip inside the training stacks: one line installs compression and
carries its per-rank state through the stack's own checkpoints.

- :mod:`gradzip.integrations.transformers`: ``compress(trainer, state)``
  for a transformers ``Trainer``;
- :mod:`gradzip.integrations.accelerate`: ``compress(accelerator, model, state)``
  after ``accelerator.prepare``;
- :mod:`gradzip.integrations.lightning`: ``GradzipCallback(state)`` for a
  Lightning ``Trainer``;
- :mod:`gradzip.integrations.torchft`: ``ProcessGroupGradzip(policy)`` as
  torchft's ``Manager(pg=...)``: replicas that come and go, every
  ``manager.allreduce`` compressed (DDP, LocalSGD, DiLoCo), error feedback
  kept by the replicas that stay.

``state`` is what compresses: a :class:`gradzip.torch.CompressionState`
(the DDP hook), a :class:`gradzip.torch.CompressedAdamW` or
:class:`~gradzip.torch.CompressedSGD` (the stack's optimizer), or the
:mod:`gradzip.torch.backend` module (a process group made with
``init_process_group("cpu:gradzip,cuda:gradzip")`` before the stack starts).
Each stack saves one copy of its state, rank 0's; gradzip's error feedback
differs on every rank, so each rank also writes its own file into the
stack's checkpoint folder (:mod:`gradzip.torch.checkpoint`) and reads it
back on resume. Importing this package imports none of the stacks.
"""

__all__ = ["accelerate", "lightning", "torchft", "transformers"]
