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
ENTRIES = ["hook", "adamw", "backend"]
# Every job of a stack, in two launches of 2 ranks (stack_workers.py runs a
# launch's jobs one after the other, each with a process group and store of
# its own): the uninterrupted runs, then the resumed ones, each from a copy
# of its run's folder, so that no resume runs in a process that trained the
# run it continues. (Importing a stack on both ranks costs more than a job:
# one launch per job made this file 24 launches.)
FULL = {"trainer": [(e, "full") for e in ENTRIES],
        "accelerate": [(e, "full") for e in ENTRIES + ["backend_rebuild"]],
        "lightning": [(e, "full") for e in ENTRIES] + [("hook", "top1")]}
RESUMED = {"trainer": [("hook", "plain"), ("adamw", "plain")] + [(e, "resume") for e in ENTRIES]
           + [("hook", "broken")],  # last: its ranks fail (as expected: the launch still ends 0)
           "accelerate": [(e, "resume") for e in ENTRIES + ["backend_rebuild"]],
           "lightning": [(e, "resume") for e in ENTRIES]}


class Job:
    def __init__(self, entry: str, mode: str, folder: Path) -> None:
        self.entry, self.mode, self.folder = entry, mode, folder
        self.results: Dict[int, "tuple[str, str]"] = {}
        self.out = ""  # the ranks' report lines, then each rank's stdout and stderr during the job
        self.launch_rc: "int | None" = None
        self.launch_tail = ""

    def ok(self) -> Dict[int, "tuple[str, str]"]:
        assert len(self.results) == 2 and self.launch_rc == 0, \
            f"{self.entry}/{self.mode}: launch rc {self.launch_rc}\n{self.out[-6000:]}\n{self.launch_tail}"
        return self.results


def launch(stack: str, jobs: "list[Job]") -> None:
    def reports(job: Job) -> "list[Path]":
        return sorted(job.folder.glob(f"{job.mode}-rank*.txt"))

    args = [a for j in jobs for a in (j.entry, j.mode, str(j.folder))]
    r = torchrun(WORKER, stack, *args, ranks=2, timeout=120 + 120 * len(jobs),
                 finished=lambda out: all(len(reports(j)) == 2 for j in jobs))
    for j in jobs:
        lines = "".join(p.read_text() for p in reports(j))
        j.results = {int(rank): (digest, gz) for rank, digest, gz in RESULT.findall(lines)}
        j.out = lines + "".join(p.read_text() for p in sorted(j.folder.glob(f"{j.mode}-rank*.out")))
        j.launch_rc = r.returncode
        j.launch_tail = f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    """Every job of a stack, run when the stack is first asked for: runs(stack)[entry, mode]."""
    made: Dict[str, Dict["tuple[str, str]", Job]] = {}

    def get(stack: str) -> Dict["tuple[str, str]", Job]:
        if stack not in made:
            base = tmp_path_factory.mktemp(stack)
            full = [Job(e, m, base / (e if m == "full" else f"{e}-{m}")) for e, m in FULL[stack]]
            for j in full:
                j.folder.mkdir()
            launch(stack, full)
            resumed = [Job(e, m, base / f"{e}-{m}") for e, m in RESUMED[stack]]
            for j in resumed:
                shutil.copytree(base / j.entry, j.folder)
            launch(stack, resumed)
            made[stack] = {(j.entry, j.mode): j for j in full + resumed}
        return made[stack]

    return get


@pytest.mark.parametrize("stack", ["trainer", "accelerate", "lightning"])
@pytest.mark.parametrize("entry", ENTRIES)
def test_resume_through_the_stack_is_bit_identical(stack: str, entry: str, runs) -> None:
    full = runs(stack)[entry, "full"].ok()
    assert full[0] == full[1], f"the uninterrupted run's ranks differ: {full}"
    resumed = runs(stack)[entry, "resume"].ok()
    assert resumed == full, f"{stack}/{entry}: resumed {resumed} != uninterrupted {full}"


def test_the_hook_state_is_what_makes_it_identical(runs) -> None:
    """The test above can fail: Trainer's own checkpoint without gradzip's
    files restarts the hook (step 0, warm-up again, no residuals) and ends
    elsewhere, the ranks still alike; every rank warns that it restarted."""
    full = runs("trainer")["hook", "full"].ok()
    job = runs("trainer")["hook", "plain"]
    plain = job.ok()
    assert plain[0] == plain[1]
    assert plain[0][0] != full[0][0]
    assert plain[0][1] == "step4"  # the hook saw only the resumed job's 4 steps
    # ... and says so, once per rank: the optimizer Trainer restored holds state, the hook does not
    assert job.out.count("RuntimeWarning: gradzip DDP hook: the optimizer already holds state at this process's "
                         "first backward") == 2, job.out[-4000:]


def test_one_copy_of_compressed_adamw_warns_on_every_rank(runs) -> None:
    """Trainer saved rank 0's CompressedAdamW state and loads it on both
    ranks: rank 1 must not raise (it did: "bound to rank 0/2"); the ranks
    agree, warn once each, continue with fresh error feedback, and stay
    identical."""
    full = runs("trainer")["adamw", "full"].ok()
    job = runs("trainer")["adamw", "plain"]
    plain = job.ok()
    assert plain[0] == plain[1] and plain[0][1] == full[0][1]
    assert plain[0][0] != full[0][0]  # the residuals are gone
    warned = re.findall(r"RuntimeWarning: gradzip CompressedAdamW: the restored checkpoint does not hold every "
                        r"rank's own error feedback", job.out)
    assert len(warned) == 2, job.out[-4000:]
    assert "this rank restored rank 0 of 2's" in job.out


def test_a_corrupt_rank_file_fails_every_rank_alike(runs) -> None:
    job = runs("trainer")["hook", "broken"]
    assert not job.results
    reported = "".join(p.read_text() for p in sorted(job.folder.glob("broken-rank*.txt")))
    errors = re.findall(r"^ERROR rank=(\d) (.*)$", reported, re.M)
    assert sorted(r for r, _ in errors) == ["0", "1"], job.out[-4000:] + job.launch_tail
    assert len({msg for _, msg in errors}) == 1, errors
    assert "a rank file is unusable" in errors[0][1]
    assert "rank 1 'gradzip-rank1-of-2.pt is not a readable gradzip rank file" in job.out


def test_lightning_rank_files_follow_the_checkpoint(runs) -> None:
    job = runs("lightning")["hook", "full"]
    job.ok()
    assert sorted(p.name for p in (job.folder / "gradzip" / "step-4").iterdir()) == \
        ["gradzip-rank0-of-2.pt", "gradzip-rank1-of-2.pt"]


def test_lightning_rank_files_go_with_the_checkpoints_lightning_removes(runs) -> None:
    # save_top_k=1 and save_last: Lightning removes step=4.ckpt after step 8 and writes last.ckpt
    # again; the rank files of step 4, which no kept checkpoint names, go with them (before: every
    # checkpoint's rank files stayed, a residual per rank per save).
    job = runs("lightning")["hook", "top1"]
    job.ok()
    assert sorted(p.name for p in job.folder.glob("*.ckpt")) == ["last.ckpt", "step=8.ckpt"]
    assert sorted(p.name for p in (job.folder / "gradzip").iterdir()) == ["step-8"]
    assert sorted(p.name for p in (job.folder / "gradzip" / "step-8").iterdir()) == \
        ["gradzip-rank0-of-2.pt", "gradzip-rank1-of-2.pt"]


def test_backend_under_a_rebuilding_ddp_warns_and_starts_fresh(runs) -> None:
    """DDP's default (find_unused_parameters=False) lays its buckets out
    again after the first step; the backend's residuals, keyed by call,
    would land on other parameters in a restarted job's first step. The
    integration refuses them with a warning instead, on every rank."""
    runs("accelerate")["backend_rebuild", "full"].ok()
    job = runs("accelerate")["backend_rebuild", "resume"]
    resumed = job.ok()
    assert resumed[0] == resumed[1]
    assert job.out.count("gradzip backend: not restoring the error feedback") == 2, job.out[-4000:]
