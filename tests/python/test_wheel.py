"""The wheel on its own, as a user gets it: installed into a fresh venv (the
only gradzip there is the wheel's), gradzip-run and gradzip-bench on that
venv's PATH as real executables, and gradzip-sweep run from an empty folder
with no checkout anywhere on its paths.

The wheel is the one the running gradzip was installed from (scripts/setup.sh
gz_python builds it into build/dist; its pip records the file in
direct_url.json), or $GZ_WHEEL."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

PROGRAMS = ("gradzip-run", "gradzip-bench", "gradzip-model")


def _the_wheel() -> Path:
    """The wheel file of the gradzip under test, checked against the hash pip recorded."""
    if os.environ.get("GZ_WHEEL"):
        return Path(os.environ["GZ_WHEEL"])
    direct = json.loads(metadata.distribution("gradzip").read_text("direct_url.json") or "{}")
    url = direct.get("url", "")
    wheel = Path(unquote(urlparse(url).path))
    if not url.endswith(".whl") or not wheel.is_file():
        pytest.fail(f"gradzip was not installed from a wheel file that still exists ({url or 'no direct_url.json'}): "
                    "install it with scripts/setup.sh gz_python (it builds build/dist/gradzip-*.whl), or set GZ_WHEEL")
    recorded = direct.get("archive_info", {}).get("hashes", {}).get("sha256")
    if recorded and hashlib.sha256(wheel.read_bytes()).hexdigest() != recorded:
        pytest.fail(f"{wheel} changed since gradzip was installed from it: run scripts/setup.sh gz_python again")
    return wheel


def _link_own_packages(venv: Path, folder: Path) -> None:
    """Makes this interpreter's packages (torch, numpy, matplotlib: wherever
    scripts/setup.sh put them) importable in `venv`, except gradzip: links to
    every entry of this environment's own site-packages but gradzip's, in a
    folder that a .pth file appends to the venv's path (after its own
    site-packages, so the wheel's gradzip comes first anyway)."""
    folder.mkdir()
    if sys.prefix != sys.base_prefix:  # this interpreter is a venv: its own packages are not the base's
        # Where pip installs (Debian's Python lists dist-packages folders in
        # site.getsitepackages() that a venv does not have).
        own_dirs = {Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
        for own in (d for d in own_dirs if d.is_dir() and d.is_relative_to(sys.prefix)):
            for entry in own.iterdir():
                if "gradzip" not in entry.name.lower() and not (folder / entry.name).exists():
                    (folder / entry.name).symlink_to(entry)
    (venv_site,) = [p for p in (venv / "lib").glob("python3*/site-packages")]
    (venv_site / "zz_gradzip_test_deps.pth").write_text(f"{folder}\n")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A new venv with the wheel installed; the environment its commands run
    in (PATH: the venv's bin and the system's, nothing of the build); an empty
    folder to run them in."""
    wheel = _the_wheel()
    root = tmp_path_factory.mktemp("wheel")
    venv = root / "venv"
    # The base interpreter's packages (--system-site-packages), no pip of its own: this one's installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    _link_own_packages(venv, root / "deps")
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-index",
                        "--disable-pip-version-check", str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRADZIP_BIN_DIR", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin",
                                   "/sbin", "/bin"])
    env["OMP_NUM_THREADS"] = "1"
    cwd = root / "elsewhere"
    cwd.mkdir()
    return {"venv": venv, "py": py, "env": env, "cwd": cwd}


def _run(fresh: dict[str, object], *cmd: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=fresh["env"],
                          cwd=fresh["cwd"])


def test_gradzip_comes_from_the_wheel_alone(fresh: dict[str, object]) -> None:
    r = _run(fresh, str(fresh["py"]), "-c",
             "import gradzip, gradzip.sweep._registry as r; print(gradzip.__file__); print(r.CHECKOUT)")
    assert r.returncode == 0, r.stderr
    where, checkout = r.stdout.split()
    assert Path(where).is_relative_to(fresh["venv"]), where
    assert checkout == "None"  # no checkout to fall back on


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_programs_are_real_executables_on_the_venvs_path(fresh: dict[str, object], name: str) -> None:
    found = shutil.which(name, path=fresh["env"]["PATH"])  # type: ignore[index]
    assert found == str(fresh["venv"] / "bin" / name), f"{name} on PATH: {found}"
    assert Path(found).read_bytes()[:4] == b"\x7fELF", f"{found} is not the program itself"
    r = _run(fresh, name, "--help", timeout=60)
    assert r.returncode == 0 and "usage:" in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_two_rank_bench_under_the_installed_launcher(fresh: dict[str, object]) -> None:
    # Both by name, as a user types them: gradzip-run finds gradzip-bench on PATH.
    r = _run(fresh, "gradzip-run", "-n", "2", "--", "gradzip-bench", "--codecs", "onebit", "--sizes", "4K",
             "--iters", "1", "--warmup", "0", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# OK" in r.stdout and "onebit:block=512" in r.stdout, r.stdout


def test_a_one_point_sweep_from_an_empty_folder(fresh: dict[str, object]) -> None:
    r = _run(fresh, "gradzip-sweep", "--links", "local", "--ranks", "2", "--codecs", "onebit", "--sizes", "64K",
             "--iters", "1", "--warmup", "0", "--out", "out", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = Path(fresh["cwd"]) / "out"  # type: ignore[arg-type]
    recs = json.loads((out / "points.json").read_text())
    by_codec = {r["codec"]: r for r in recs}
    # The point, the bench's own fp32 baseline, and the gloo baseline (the script the package ships).
    assert {"onebit", "none", "gloo"} <= set(by_codec), sorted(by_codec)
    assert all(r["ok"] and r["elements"] == 65536 and r["ranks"] == 2 for r in recs), recs
    assert by_codec["onebit"]["ratio"] > 20
    assert len((out / "points.csv").read_text().splitlines()) == 1 + len(recs)
    assert "onebit" in (out / "report.md").read_text()
    for png in ("speedup_vs_size.png", "error_vs_ratio.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    # Every program the sweep started came from the venv.
    commands = [line[4:].split() for line in (out / "sweep.log").read_text().splitlines()
                if line.startswith("### /")]
    assert len(commands) == 2, commands
    bin_dir = fresh["venv"] / "bin"  # type: ignore[operator]
    for cmd in commands:
        assert cmd[0] == str(bin_dir / "gradzip-run"), cmd
        program = cmd[cmd.index("--") + 1:]
        assert program[0] == str(bin_dir / "gradzip-bench") or (
            program[0] == str(fresh["py"]) and Path(program[1]).is_relative_to(fresh["venv"])), cmd
