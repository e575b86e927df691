"""Every program in examples/ runs from the installed wheel with only what the
README tells a user to install: `pip install .[examples]`.

The venv here holds the wheel and exactly the distributions that its
`examples` extra requires, with their own requirements (resolved from their
metadata and linked from this environment, so torch is not downloaded a second
time), and nothing of the interpreter's or the checkout's. pip then confirms,
with no index to fall back on, that `gradzip[examples]` is satisfied there; an
example that imports something the extra does not name fails to run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from dist_util import torchrun
from test_wheel import _the_wheel

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXTRA = "examples"


def _closure(wheel: Path) -> set[str]:
    """Names of the distributions `pip install wheel[examples]` installs
    besides gradzip, found among this environment's installed ones."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line.split(":", 1)[1].strip() for line in z.read(meta).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    todo = [(Requirement(r), EXTRA) for r in requires]
    seen: set[str] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra or ""}):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        dist = metadata.distribution(req.name)  # PackageNotFoundError: this environment lacks it
        assert dist.version in req.specifier or not req.specifier, f"{req} but {dist.version} is installed"
        extras = sorted(req.extras)
        if name in seen and not extras:
            continue
        seen.add(name)
        for r in dist.requires or []:
            for e in extras or [""]:
                todo.append((Requirement(r), e))
    return seen


def _link(names: set[str], folder: Path, venv: Path) -> None:
    """Links each distribution's top-level files (packages, modules and its
    .dist-info) into `folder`, which a .pth file puts on the venv's path."""
    folder.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".."}:
            if not (folder / top).exists() and (base / top).exists():
                (folder / top).symlink_to(base / top)
    (site,) = list((venv / "lib").glob("python3*/site-packages"))
    (site / "zz_gradzip_examples_deps.pth").write_text(f"{folder}\n")


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    wheel = _the_wheel()
    root = tmp_path_factory.mktemp("examples")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check"]
    r = subprocess.run([*pip, "install", "-q", "--no-index", "--no-deps", str(wheel)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    _link(_closure(wheel), root / "deps", venv)
    # Nothing missing: pip, with no index, would have to fetch what is not there.
    r = subprocess.run([*pip, "install", "--no-index", "--dry-run", f"{wheel}[{EXTRA}]"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "Would install" not in r.stdout, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRADZIP_BIN_DIR", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    cwd = root / "elsewhere"
    cwd.mkdir()
    return {"py": py, "env": env, "cwd": cwd}


def test_the_venv_holds_only_the_extra(user: dict[str, object]) -> None:
    # The checks below mean something only if the venv cannot see the build's packages.
    r = subprocess.run([str(user["py"]), "-c", "import gradzip, pytest"], capture_output=True, text=True,
                       env=user["env"], cwd=user["cwd"], timeout=60)
    assert r.returncode != 0 and "No module named 'pytest'" in r.stderr, r.stdout + r.stderr


def test_every_example_has_a_run_here() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(RUNS), "a new example needs a run in RUNS"


def _ranks_printed(pattern: str) -> "callable":
    line = re.compile(pattern)
    return lambda out: sorted(m.group(1) for m in line.finditer(out)) == ["0", "1"]


# example -> (arguments, a line each rank prints when it finished)
RUNS = {
    "adamw.py": ((), r"rank (\d): 40 warm-up steps, then compressed: [0-9.]+x fewer bytes"),
    "backend.py": ((), r"rank (\d): parameters [0-9a-f]{16}, \d+ all_reduce calls compressed"),
    "ddp_hook.py": ((), r"rank (\d): [0-9.]+x fewer bytes per step"),
    "train_ddp.py": (("--steps", "6", "--save-every", "3", "--checkpoint-dir", "ckpt"),
                     r"rank (\d): step 6, params [0-9a-f]{16}"),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_example_runs_from_the_installed_wheel(user: dict[str, object], name: str) -> None:
    args, pattern = RUNS[name]
    finished = _ranks_printed(pattern)
    r = torchrun(EXAMPLES / name, *args, finished=finished, cwd=user["cwd"], python=user["py"], env=user["env"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert finished(r.stdout), r.stdout + r.stderr
