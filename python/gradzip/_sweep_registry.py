"""The codec registry as the sweep sees it, and where the binaries are.

The registry is C++'s (compressors/registry.h): ``gradzip.codec_info()`` when
the compiled extension is installed, else the same list from
``gradzip-bench --list-codecs``, the binary the sweep drives anyway (so the
sweep also runs from a checkout whose extension is not built, as its own
tests do).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

#: The repository root when running from a checkout (python/gradzip/ -> ../..).
REPO_ROOT = Path(__file__).resolve().parents[2]


def find_binary(name: str, bin_dir: str | None = None) -> str | None:
    """`name` from bin_dir, $GRADZIP_BIN_DIR, ./build/bin, the checkout's
    build/bin, or PATH, in that order (None when nowhere)."""
    for d in (bin_dir, os.environ.get("GRADZIP_BIN_DIR"), "build/bin", str(REPO_ROOT / "build" / "bin")):
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.abspath(os.path.join(d, name))
    return shutil.which(name)


@functools.lru_cache(maxsize=None)
def registry() -> tuple[dict[str, Any], ...]:
    """Every codec: name, id, lossless, sparse, allgather_up_to_ranks, bench_specs."""
    try:
        from ._core import codec_info
    except ImportError:
        bench = find_binary("gradzip-bench")
        if bench is None:
            raise RuntimeError("the codec registry needs gradzip's extension or gradzip-bench (build the "
                               "project, or set GRADZIP_BIN_DIR)") from None
        out = subprocess.run([bench, "--list-codecs"], check=True, capture_output=True, text=True, timeout=60)
        return tuple(json.loads(out.stdout))
    return tuple(codec_info())


def codec_names() -> tuple[str, ...]:
    return tuple(c["name"] for c in registry())


def default_codecs() -> str:
    """Every codec's first benchmark spec, as a spec grid (gradzip-bench's default list)."""
    return ",".join(c["bench_specs"][0][1] for c in registry())
