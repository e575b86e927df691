"""gradzip for PyTorch: a DDP communication hook that compresses gradients,
and block momentum (BMUF) for slow links.

Example::

    from gradzip.torch import CompressionState, compression_hook
    ddp_model.register_comm_hook(CompressionState(codec="onebit"), compression_hook)

See :class:`CompressionState` for the options (codec, warm-up, transport) and
:func:`compression_hook` for what happens to each bucket. Where even a
compressed exchange every step is too slow, :class:`BlockMomentum` exchanges
a compressed model update once every H local steps. For FSDP2
(``fully_shard``) models, :mod:`gradzip.torch.fsdp` compresses the gradient
reduce-scatter (``gradzip.torch.fsdp.register(model, codec="onebit")``).
Importing this package also registers the ``gradzip`` process-group backend
(:mod:`gradzip.torch.backend`): ``init_process_group("cpu:gradzip,cuda:gradzip")``
compresses the group's all_reduce calls and leaves every other collective to
gloo and NCCL.

For adaptive optimizers at high ratios, :class:`CompressedAdamW` (and
:class:`CompressedSGD`) exchange the compressed *momentum* after a
full-precision stage (the 1-bit Adam / 0/1 Adam family) instead of the
gradient.
"""

from . import backend
from .bmuf import BlockMomentum
from .compressed_momentum import CompressedAdamW, CompressedSGD
from .hook import CompressionState, compression_hook

backend.register()

__all__ = ["BlockMomentum", "CompressedAdamW", "CompressedSGD", "CompressionState", "compression_hook"]
