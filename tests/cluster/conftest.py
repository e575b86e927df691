"""Makes this checkout's gradzip.sweep importable: the sweep is pure Python, so
its tests run with or without the compiled gradzip package installed."""

from __future__ import annotations

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "gradzip"

try:
    import gradzip

    if str(PKG) not in gradzip.__path__:
        gradzip.__path__.insert(0, str(PKG))
except ImportError:  # not installed (or its extension is not built): the sweep needs neither
    _stub = types.ModuleType("gradzip")
    _stub.__path__ = [str(PKG)]
    sys.modules["gradzip"] = _stub
