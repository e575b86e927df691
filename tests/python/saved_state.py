"""A collective's saved error feedback, written byte by byte from its format
(gz::ErrorFeedback::save, comm/engine/error_feedback.cc), so that tests can load a
state with no ranks running and put into one what a damaged or edited file
would hold."""

import struct

import gradzip


def saved_state(spec: bytes = b"onebit", n: int = 8, residual: float = 0.5, world: int = 1, count=None) -> bytes:
    """The saved state of rank 0 of `world` under allgather: n residuals of `residual`."""
    count = n if count is None else count
    body = struct.pack("<III", 0x46455A47, 2, len(spec)) + spec
    body += struct.pack("<QIIBQQ", n, 0, world, 1, count, 0)
    body += struct.pack(f"<{count}f", *([residual] * count))
    return body + struct.pack("<Q", gradzip._core._checksum64(body))
