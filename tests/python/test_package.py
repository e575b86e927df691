"""The installed package: stubs, import order, the README's DDP example."""

import pathlib
import re
import subprocess
import sys

import pytest

import gradzip
from dist_util import torchrun

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_hook.py"


def test_version_matches_cmake():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"project\(gradzip VERSION ([0-9.]+)", cmake).group(1) == gradzip.__version__


def test_the_installed_package_is_tested():
    # Not the sources: the installed package holds the built extension.
    assert (pathlib.Path(gradzip.__file__).parent / "_core.pyi").exists() or pytest.fail("no stub installed")
    assert not str(pathlib.Path(gradzip.__file__)).startswith(str(ROOT / "python"))


def test_stub_covers_the_extension():
    stub = (pathlib.Path(gradzip.__file__).parent / "_core.pyi").read_text()
    assert (pathlib.Path(gradzip.__file__).parent / "py.typed").exists()
    for name in ("class Codec", "def encode_into", "def decode_accumulate_into", "def max_payload_bytes",
                 "class InvalidArgument", "class PayloadError", "def canonical_spec", "def payload_info"):
        assert name in stub, name
    if gradzip.BUILD["comm"]:
        for name in ("class Communicator", "class ErrorFeedback", "def allreduce", "def from_store"):
            assert name in stub, name


@pytest.mark.parametrize("order", ["import gradzip; import torch", "import torch; import gradzip"])
def test_gradzip_and_torch_import_in_either_order(order):
    # gradzip._core and torch share the CUDA runtime and NCCL (see gradzip/_preload.py).
    r = subprocess.run([sys.executable, "-c", order + "; print(gradzip.Codec('onebit'))"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_readme_ddp_example_runs():
    def finished(out: str) -> bool:
        return sorted(re.findall(r"rank (\d): [0-9.]+x fewer bytes per step", out)) == ["0", "1"]

    r = torchrun(EXAMPLE, finished=finished, cwd=ROOT, timeout=180)
    ratios = re.findall(r"rank (\d): ([0-9.]+)x fewer bytes per step", r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert finished(r.stdout), r.stdout
    assert all(float(x) > 20 for _, x in ratios), r.stdout


def test_readme_quotes_the_example():
    readme = (ROOT / "README.md").read_text()
    assert "examples/ddp_hook.py" in readme, "README.md must show examples/ddp_hook.py"
    body = EXAMPLE.read_text().strip()
    assert body in readme, "README.md's DDP example differs from examples/ddp_hook.py: copy the file into it"


@pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")
def test_transports_come_from_the_registry():
    # One key in BUILD per registered transport (comm/transports/registry.h), and the same answer
    # from transport_available; an unknown name is refused naming the valid ones.
    names = gradzip.transport_names()
    assert names and len(set(names)) == len(names)
    for name in names:
        assert gradzip.BUILD[name] == gradzip.transport_available(name), name
    with pytest.raises(gradzip.InvalidArgument, match="unknown transport 'tcp'; valid: " + ", ".join(names)):
        gradzip.transport_available("tcp")
    with pytest.raises(gradzip.InvalidArgument, match="unknown transport 'tcp'"):
        gradzip.Communicator.from_env("tcp")
    # Communicator.from_torch's default for a group: the transport the registry names for its backend.
    assert gradzip._core.transport_for_torch_backend("nccl") == "nccl"
    assert gradzip._core.transport_for_torch_backend("gloo") == "ucx"
    assert gradzip._core.transport_takes_device_memory("nccl") and not gradzip._core.transport_takes_device_memory("ucx")
    with pytest.raises(gradzip.InvalidArgument, match="unknown transport 'tcp'"):
        gradzip._core.transport_takes_device_memory("tcp")
