"""examples/train_ddp.py, as a user runs it: 2 ranks under torchrun, a
checkpoint, and a resume that continues bit-identically."""

import pathlib
import re

from dist_util import torchrun

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_ddp.py"
LINE = re.compile(r"rank (\d): step (\d+), params ([0-9a-f]{16}), ([0-9.]+)x fewer bytes per step")


def _train(tmp: pathlib.Path, *args: str) -> dict:
    """{rank: (step, params fingerprint)} of one run."""
    def finished(out: str) -> bool:
        return sorted(m.group(1) for m in LINE.finditer(out)) == ["0", "1"]

    r = torchrun(SCRIPT, *args, finished=finished, cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert finished(r.stdout), r.stdout
    for m in LINE.finditer(r.stdout):
        assert float(m.group(4)) > 20, r.stdout  # onebit: ~28x fewer bytes than fp32
    return {int(m.group(1)): (int(m.group(2)), m.group(3)) for m in LINE.finditer(r.stdout)}


def test_resume_continues_bit_identically(tmp_path: pathlib.Path) -> None:
    # 36 steps cross an epoch (28 steps of 2 x 32 samples), and the stop at 15
    # is mid-epoch: the resumed run must replay the data order and skip the
    # batches it had done, besides restoring model, optimizer and residuals.
    straight = _train(tmp_path, "--steps", "36", "--checkpoint-dir", str(tmp_path / "a"))
    assert straight[0] == straight[1], straight  # every rank holds the same model
    first = _train(tmp_path, "--steps", "15", "--checkpoint-dir", str(tmp_path / "b"))
    assert first[0][0] == 15 and first[0][1] != straight[0][1]
    resumed = _train(tmp_path, "--steps", "36", "--checkpoint-dir", str(tmp_path / "b"), "--resume")
    assert resumed == straight, (resumed, straight)


def test_resume_without_a_checkpoint_says_so(tmp_path: pathlib.Path) -> None:
    r = torchrun(SCRIPT, "--steps", "5", "--checkpoint-dir", str(tmp_path / "none"), "--resume", cwd=tmp_path)
    assert r.returncode != 0
    assert "no checkpoint at" in r.stdout + r.stderr
