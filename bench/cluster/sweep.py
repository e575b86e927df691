#!/usr/bin/env python3
"""Runs this checkout's gradzip.sweep, whether or not the gradzip package is
installed (the sweep is pure Python; it drives build/bin/gradzip-run and
gradzip-bench). Same arguments as `python -m gradzip.sweep`:

    sudo python3 bench/cluster/sweep.py --config bench/cluster/headline.toml
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "python" / "gradzip"


def use_checkout() -> None:
    """Makes `gradzip.<module>` resolve to this checkout's python/gradzip first."""
    try:
        import gradzip  # the installed package, if any

        if str(PKG) not in gradzip.__path__:
            gradzip.__path__.insert(0, str(PKG))
    except ImportError:  # not installed, or its compiled part is missing: the pure-Python part is enough
        stub = types.ModuleType("gradzip")
        stub.__path__ = [str(PKG)]
        sys.modules["gradzip"] = stub


if __name__ == "__main__":
    use_checkout()
    from gradzip.sweep import main

    sys.exit(main())
