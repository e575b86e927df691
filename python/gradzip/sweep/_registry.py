"""The codec registry as the sweep sees it, and where its programs are.

The registry is C++'s (compressors/registry.h): ``gradzip.codec_info()`` when
the compiled extension is installed, else the same list from
``gradzip-bench --list-codecs``, the binary the sweep drives anyway (so the
sweep also runs from a checkout whose extension is not built, as its own
tests do).

The programs (gradzip-run, gradzip-bench) are the ones that came with this
gradzip: the installed wheel's (pip put them in its scripts folder, e.g.
venv/bin, and its RECORD says where), or, for a checkout's python/gradzip,
the checkout's build/bin. An explicit folder (--bin-dir, $GRADZIP_BIN_DIR)
replaces both; PATH is the last resort.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

PROGRAMS = ("gradzip-run", "gradzip-bench")

_HERE = Path(__file__).resolve()
#: The checkout this module runs from (python/gradzip/sweep/ -> ../../..), or None when it is installed.
CHECKOUT: Path | None = _HERE.parents[3] if (_HERE.parents[3] / "CMakeLists.txt").is_file() and \
    _HERE.parents[1] == _HERE.parents[3] / "python" / "gradzip" else None


@functools.lru_cache(maxsize=None)
def installed_programs() -> dict[str, Path]:
    """The programs the gradzip distribution installed, by name (from its RECORD).
    The distribution that holds this very file, else (an editable install) the
    first one on sys.path."""
    from importlib import metadata

    dists = list(metadata.distributions(name="gradzip"))

    def holds_this_file(d: metadata.Distribution) -> bool:
        return any(f.name == _HERE.name and Path(str(d.locate_file(f))).resolve() == _HERE for f in d.files or ())

    dists.sort(key=lambda d: not holds_this_file(d))
    if not dists:
        return {}
    return {f.name: Path(str(dists[0].locate_file(f))).resolve() for f in dists[0].files or ()
            if f.name in PROGRAMS}


def program_candidates(name: str, bin_dir: str | None = None) -> list[tuple[str, Path | None]]:
    """Where `name` may be, in order: (the place, `name`'s path there or None).
    An explicit folder (--bin-dir, else $GRADZIP_BIN_DIR) is the only place: a
    program from elsewhere must not stand in for the one asked for. Otherwise
    this checkout's build/bin (when this module runs from one), the programs
    installed with this gradzip, then PATH."""
    explicit = bin_dir or os.environ.get("GRADZIP_BIN_DIR")
    if explicit:
        return [(f"{'--bin-dir' if bin_dir else '$GRADZIP_BIN_DIR'} {explicit}", Path(explicit) / name)]
    places: list[tuple[str, Path | None]] = []
    if CHECKOUT is not None:
        places.append(("this checkout's build/bin", CHECKOUT / "build" / "bin" / name))
    places.append(("the programs installed with the gradzip package", installed_programs().get(name)))
    on_path = shutil.which(name)
    places.append(("PATH", Path(on_path) if on_path else None))
    return places


def find_program(name: str, bin_dir: str | None = None) -> tuple[str | None, list[str]]:
    """(absolute path of `name` or None, the places looked in before: for the error)."""
    looked = []
    for where, path in program_candidates(name, bin_dir):
        if path is not None and path.is_file() and os.access(path, os.X_OK):
            return str(path.absolute()), looked
        looked.append(f"{where} ({path})" if path is not None else where)
    return None, looked


def find_binary(name: str, bin_dir: str | None = None) -> str | None:
    """`name` as find_program finds it (None when nowhere)."""
    return find_program(name, bin_dir)[0]


@functools.lru_cache(maxsize=None)
def registry() -> tuple[dict[str, Any], ...]:
    """Every codec: name, id, lossless, sparse, allgather_up_to_ranks, bench_specs."""
    try:
        from .._core import codec_info
    except ImportError:
        bench = find_binary("gradzip-bench")
        if bench is None:
            raise RuntimeError("the codec registry needs gradzip's extension or gradzip-bench (pip install "
                               "gradzip, build the project, or set GRADZIP_BIN_DIR)") from None
        out = subprocess.run([bench, "--list-codecs"], check=True, capture_output=True, text=True, timeout=60)
        return tuple(json.loads(out.stdout))
    return tuple(codec_info())


def codec_names() -> tuple[str, ...]:
    return tuple(c["name"] for c in registry())


def default_codecs() -> str:
    """Every codec's first benchmark spec, as a spec grid (gradzip-bench's default list)."""
    return ",".join(c["bench_specs"][0][1] for c in registry())


@functools.lru_cache(maxsize=None)
def core() -> Any:
    """gradzip's compiled extension with its communication part (the one
    source of algorithm names, counts and links: comm/algorithms/registry.h,
    common/units.h), or None when it is not installed."""
    try:
        from .. import _core
    except ImportError:
        return None
    return _core if hasattr(_core, "allreduce_algorithm_names") else None


_PARSE_FLAGS = {"grid": "--expand-grid", "count": "--parse-count", "link": "--parse-link"}


def parse(kind: str, text: str) -> Any:
    """gradzip's own parser of `kind` on `text`, the one every tool uses:
    "grid" (compressors/spec.cc: the specs as the grid writes them), "count"
    (an element count) or "link" ({"rate_bps", "delay_ns"}; common/units.h).
    The extension's binding, else gradzip-bench's --expand-grid /
    --parse-count / --parse-link. ValueError with the parser's message."""
    c = core()
    if c is not None:
        fn = {"grid": lambda t: list(c.expand_spec_grid(t, canonical=False)), "count": c.parse_count,
              "link": c.parse_link}[kind]
        try:
            return fn(text)
        except ValueError as e:  # InvalidArgument, or std::invalid_argument as ValueError
            raise ValueError(str(e)) from None
    bench = find_binary("gradzip-bench")
    if bench is None:
        raise RuntimeError("parsing a sweep setting needs gradzip's extension or gradzip-bench (pip install "
                           "gradzip, build the project, or set GRADZIP_BIN_DIR)")
    r = subprocess.run([bench, _PARSE_FLAGS[kind], text], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise ValueError(r.stderr.strip().removeprefix("gradzip-bench: ") or f"gradzip-bench exited {r.returncode}")
    return json.loads(r.stdout)


@functools.lru_cache(maxsize=None)
def algorithm_names() -> tuple[str, ...]:
    """What --algorithms takes: 'auto' and the registry's allreduce algorithms
    (gradzip.allreduce_algorithm_names(), else gradzip-bench --list-algorithms)."""
    c = core()
    if c is not None:
        return tuple(c.allreduce_algorithm_names())
    bench = find_binary("gradzip-bench")
    if bench is None:
        raise RuntimeError("the algorithm registry needs gradzip's extension or gradzip-bench (pip install "
                           "gradzip, build the project, or set GRADZIP_BIN_DIR)")
    out = subprocess.run([bench, "--list-algorithms"], check=True, capture_output=True, text=True, timeout=60)
    return tuple(json.loads(out.stdout))
