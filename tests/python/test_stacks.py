"""gradzip inside the real training stacks (transformers Trainer, Accelerate,
Lightning, from PyPI as the setup installs them), on 2 CPU ranks under
torchrun: train 8 steps saving through the stack at step 4, then resume a
copy of that checkpoint in a new job and train to step 8. With gradzip's
integration every rank must end bit-identical to the uninterrupted run,
for the hook, CompressedAdamW and the backend. Without it, the resume must
neither crash nor split the ranks; a corrupt rank file must fail every rank
with the same error."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Dict

import pytest

from dist_util import torchrun

pytest.importorskip("torch")
for _stack in ("transformers", "accelerate", "lightning"):
    pytest.importorskip(_stack, reason=f"{_stack} is installed by scripts/setup.sh; this run lacks it")

WORKER = Path(__file__).with_name("stack_workers.py")
RESULT = re.compile(r"^RESULT rank=(\d) digest=(\w+) gz=(\S+)$", re.M)


def run(stack: str, entry: str, mode: str, folder: Path) -> "tuple[Dict[int, tuple[str, str]], str]":
    r = torchrun(WORKER, stack, entry, mode, str(folder), ranks=2, timeout=300,
                 finished=lambda out: len(list(folder.glob(f"{mode}-rank*.txt"))) == 2)
    lines = "".join(p.read_text() for p in sorted(folder.glob(f"{mode}-rank*.txt")))
    results = {int(rank): (digest, gz) for rank, digest, gz in RESULT.findall(lines)}
    if mode != "broken":
        assert r.returncode == 0 and len(results) == 2, \
            f"{stack}/{entry}/{mode}: rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return results, lines + r.stdout + r.stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory):
    """One uninterrupted run per (stack, entry), made when first asked for."""
    made: Dict[tuple, "tuple[Path, Dict[int, tuple[str, str]]]"] = {}

    def get(stack: str, entry: str) -> "tuple[Path, Dict[int, tuple[str, str]]]":
        if (stack, entry) not in made:
            folder = tmp_path_factory.mktemp(f"{stack}-{entry}")
            made[(stack, entry)] = (folder, run(stack, entry, "full", folder)[0])
        return made[(stack, entry)]

    return get


def resumed_copy(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "resumed"
    shutil.copytree(folder, copy)
    return copy


@pytest.mark.parametrize("stack", ["trainer", "accelerate", "lightning"])
@pytest.mark.parametrize("entry", ["hook", "adamw", "backend"])
def test_resume_through_the_stack_is_bit_identical(stack: str, entry: str, uninterrupted, tmp_path: Path) -> None:
    folder, full = uninterrupted(stack, entry)
    assert full[0] == full[1], f"the uninterrupted run's ranks differ: {full}"
    resumed, _ = run(stack, entry, "resume", resumed_copy(folder, tmp_path))
    assert resumed == full, f"{stack}/{entry}: resumed {resumed} != uninterrupted {full}"


def test_the_hook_state_is_what_makes_it_identical(uninterrupted, tmp_path: Path) -> None:
    """The test above can fail: Trainer's own checkpoint without gradzip's
    files restarts the hook (step 0, warm-up again, no residuals) and ends
    elsewhere, the ranks still alike; every rank warns that it restarted."""
    folder, full = uninterrupted("trainer", "hook")
    plain, out = run("trainer", "hook", "plain", resumed_copy(folder, tmp_path))
    assert plain[0] == plain[1]
    assert plain[0][0] != full[0][0]
    assert plain[0][1] == "step4"  # the hook saw only the resumed job's 4 steps
    # ... and says so, once per rank: the optimizer Trainer restored holds state, the hook does not
    assert out.count("RuntimeWarning: gradzip DDP hook: the optimizer already holds state at this process's "
                     "first backward") == 2


def test_one_copy_of_compressed_adamw_warns_on_every_rank(uninterrupted, tmp_path: Path) -> None:
    """Trainer saved rank 0's CompressedAdamW state and loads it on both
    ranks: rank 1 must not raise (it did: "bound to rank 0/2"); the ranks
    agree, warn once each, continue with fresh error feedback, and stay
    identical."""
    folder, full = uninterrupted("trainer", "adamw")
    plain, out = run("trainer", "adamw", "plain", resumed_copy(folder, tmp_path))
    assert plain[0] == plain[1] and plain[0][1] == full[0][1]
    assert plain[0][0] != full[0][0]  # the residuals are gone
    warned = re.findall(r"RuntimeWarning: gradzip CompressedAdamW: the restored checkpoint does not hold every "
                        r"rank's own error feedback", out)
    assert len(warned) == 2, out[-4000:]
    assert "this rank restored rank 0 of 2's" in out


def test_a_corrupt_rank_file_fails_every_rank_alike(uninterrupted, tmp_path: Path) -> None:
    folder, _ = uninterrupted("trainer", "hook")
    copy = resumed_copy(folder, tmp_path)
    results, out = run("trainer", "hook", "broken", copy)
    assert not results
    reported = "".join(p.read_text() for p in sorted(copy.glob("broken-rank*.txt")))
    errors = re.findall(r"^ERROR rank=(\d) (.*)$", reported, re.M)
    assert sorted(r for r, _ in errors) == ["0", "1"], out[-4000:]
    assert len({msg for _, msg in errors}) == 1, errors
    assert "a rank file is unusable" in errors[0][1]
    assert "rank 1 'gradzip-rank1-of-2.pt is not a readable gradzip rank file" in out


def test_lightning_rank_files_follow_the_checkpoint(uninterrupted) -> None:
    folder, _ = uninterrupted("lightning", "hook")
    assert sorted(p.name for p in (folder / "gradzip" / "step-4").iterdir()) == \
        ["gradzip-rank0-of-2.pt", "gradzip-rank1-of-2.pt"]


def test_lightning_rank_files_go_with_the_checkpoints_lightning_removes(tmp_path: Path) -> None:
    # save_top_k=1 and save_last: Lightning removes step=4.ckpt after step 8 and writes last.ckpt
    # again; the rank files of step 4, which no kept checkpoint names, go with them (before: every
    # checkpoint's rank files stayed, a residual per rank per save).
    run("lightning", "hook", "top1", tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["last.ckpt", "step=8.ckpt"]
    assert sorted(p.name for p in (tmp_path / "gradzip").iterdir()) == ["step-8"]
    assert sorted(p.name for p in (tmp_path / "gradzip" / "step-8").iterdir()) == \
        ["gradzip-rank0-of-2.pt", "gradzip-rank1-of-2.pt"]


def test_backend_under_a_rebuilding_ddp_warns_and_starts_fresh(uninterrupted, tmp_path: Path) -> None:
    """DDP's default (find_unused_parameters=False) lays its buckets out
    again after the first step; the backend's residuals, keyed by call,
    would land on other parameters in a restarted job's first step. The
    integration refuses them with a warning instead, on every rank."""
    folder, _ = uninterrupted("accelerate", "backend_rebuild")
    resumed, out = run("accelerate", "backend_rebuild", "resume", resumed_copy(folder, tmp_path))
    assert resumed[0] == resumed[1]
    assert out.count("gradzip backend: not restoring the error feedback") == 2, out[-4000:]

