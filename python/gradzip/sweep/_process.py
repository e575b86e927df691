"""Stopping a program the sweep or an experiment started (gradzip-run and
what it runs): a leaf, so that both can use it without importing each other."""

from __future__ import annotations

import os
import signal
import subprocess


def stop(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM to the subprocess (gradzip-run forwards it and tears down), then
    SIGKILL to its whole session after the grace period."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
