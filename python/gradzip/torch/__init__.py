"""gradzip for PyTorch: a DDP communication hook that compresses gradients.

Example::

    from gradzip.torch import CompressionState, compression_hook
    ddp_model.register_comm_hook(CompressionState(codec="onebit"), compression_hook)

See :class:`CompressionState` for the options (codec, warm-up, transport) and
:func:`compression_hook` for what happens to each bucket.
"""

from .hook import CompressionState, compression_hook

__all__ = ["CompressionState", "compression_hook"]
