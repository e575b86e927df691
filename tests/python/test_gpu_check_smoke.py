"""scripts/gpu-check.sh's torch checks (tests/python/gpu_torch_check.py) run
on host tensors here: a check that would fail for a reason of its own (a
wrong argument, an API it misuses) fails in CI, not in the few minutes of a
lent GPU. The GPU run is the one that proves the CUDA paths."""

import json
import os
import pathlib
import subprocess
import sys

import gradzip
import pytest

SCRIPT = pathlib.Path(__file__).with_name("gpu_torch_check.py")


@pytest.mark.skipif(not gradzip.BUILD["ucx"], reason="this gradzip build has no UCX transport (the checks' ranks use it)")
def test_every_torch_check_runs_on_host_tensors(tmp_path):
    out = tmp_path / "checks.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--json", str(out)], capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    results = json.loads(out.read_text())
    listed = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True,
                            check=True).stdout.split()
    assert sorted(results) == sorted(listed)
    for name, r in results.items():
        assert r["verdict"] == ("SKIP" if "nccl" in name else "PASS"), (name, r)
