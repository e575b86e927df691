"""Resuming on 2 real ranks: whose per-rank state each rank restored, the
ranks' agreement about it (_resume.py), and gradzip's per-rank files
(gradzip.torch.checkpoint) with each way a file can be missing, stale or
hostile. The stacks themselves: test_stacks.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import resume_workers as w  # noqa: E402
from dist_util import run_ranks  # noqa: E402


def test_a_foreign_state_is_dropped_alike_on_every_rank() -> None:
    for r in run_ranks(w.one_copy, 2):
        assert r["own_equals_uninterrupted"]
        assert not r["one_copy_equals_uninterrupted"]  # the residuals were dropped, not applied elsewhere
        assert r["identical"]
        assert len(r["warned"]) == 1 and "every rank continues with fresh error feedback" in r["warned"][0]
    r1 = run_ranks(w.one_copy, 2)[1]
    assert "this rank restored rank 0 of 2's" in r1["warned"][0]


def test_a_state_restored_on_some_ranks_only_fails_every_rank() -> None:
    errors = run_ranks(w.some_ranks_only, 2)
    assert errors[0] == errors[1], errors
    assert "restore the hook's state_dict on all of them or none" in errors[0]
    assert "restored a checkpoint: rank 0 'yes'; rank 1 'no'" in errors[0]


def test_rank_files_round_trip_bit_identically(tmp_path) -> None:
    out = run_ranks(w.rank_files, 2, str(tmp_path), "ok")
    for r in out:
        assert r["restored"] is True and r["warned"] == []
        assert r["equals_uninterrupted"] and r["identical"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gradzip-rank0-of-2.pt", "gradzip-rank1-of-2.pt"]


@pytest.mark.parametrize("case,says", [("missing", "this one: missing"),
                                       ("world", "it holds files of world size 4")])
def test_a_missing_rank_file_restores_nothing_anywhere(tmp_path, case: str, says: str) -> None:
    out = run_ranks(w.rank_files, 2, str(tmp_path), case)
    for r in out:
        assert r["restored"] is False
        assert len(r["warned"]) == 1 and "nothing is restored" in r["warned"][0]
        assert not r["equals_uninterrupted"] and r["identical"]
    assert says in out[1]["warned"][0]


@pytest.mark.parametrize("case,says", [
    ("forged", "rank 1 'gradzip-rank1-of-2.pt says it is rank 0 of 2'"),
    ("pickle", "rank 1 'gradzip-rank1-of-2.pt is not a readable gradzip rank file (UnpicklingError"),
    ("garbled", "a rank could not restore its file"),
    ("kinds", "holds ['CompressionState']; asked to restore ['CompressionState', 'CompressedSGD']"),
])
def test_a_hostile_rank_file_fails_every_rank_alike(tmp_path, case: str, says: str) -> None:
    out = run_ranks(w.rank_files, 2, str(tmp_path), case)
    assert out[0]["error"] == out[1]["error"], out
    assert says in out[0]["error"], out[0]["error"]


def test_torch_distributed_checkpoint_keeps_every_ranks_state(tmp_path) -> None:
    for r in run_ranks(w.dcp_round_trip, 2, str(tmp_path)):
        assert r["warned"] == [] and r["equals_uninterrupted"] and r["identical"]


def test_fsdp_restored_from_one_copy_warns_and_stays_alike() -> None:
    for r in run_ranks(w.fsdp_one_copy, 2):
        assert r["own_equal"] and r["own_warned"] == [] and r["own_identical"]
        assert not r["one_copy_equal"] and r["one_copy_identical"]
        assert len(r["one_copy_warned"]) == 1 and "FSDP reduce-scatter" in r["one_copy_warned"][0]


def test_block_momentum_restored_from_one_copy_warns_and_stays_alike() -> None:
    for r in run_ranks(w.bmuf_one_copy, 2):
        assert r["own_warned"] == [] and r["own_equal"] and r["own_identical"]
        assert not r["one_copy_equal"] and r["one_copy_identical"]
        assert len(r["one_copy_warned"]) == 1 and "BlockMomentum" in r["one_copy_warned"][0]


def test_a_dcp_checkpoint_without_gradzip_warns_and_starts_fresh(tmp_path) -> None:
    for r in run_ranks(w.dcp_partial, 2, str(tmp_path)):
        assert r["identical"]
        assert len(r["warned"]) == 1 and "nothing is restored" in r["warned"][0], r["warned"]
