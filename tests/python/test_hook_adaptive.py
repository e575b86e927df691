"""The DDP hook's defaults under an adaptive optimizer (adaptive="auto"):
the hook sees the optimizer's first step, and from the next step on onebit
and top-k run without error feedback (onebit's chunk sums as qsgd 4-bit);
SGD keeps the old defaults; the ranks agree on the decision, hold the same
parameters after every step, and a checkpoint resumes bit-identically."""

import logging
import pickle

import pytest
import torch

import adaptive_workers
import gradzip
from dist_util import run_ranks
from gradzip.torch import CompressionState
from gradzip.torch.hook import is_adaptive

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")

ONEBIT_NO_EF = gradzip.Codec("onebit:block=128,ef=off").spec  # the adaptive defaults
QSGD4 = gradzip.Codec("qsgd:bits=4").spec


def test_adaptive_optimizers_are_recognised():
    w = [torch.nn.Parameter(torch.zeros(3))]
    for opt in (torch.optim.Adam(w), torch.optim.AdamW(w), torch.optim.RMSprop(w), torch.optim.Adagrad(w)):
        assert is_adaptive(opt), type(opt).__name__
    assert not is_adaptive(torch.optim.SGD(w, lr=0.1, momentum=0.9))


def test_adaptive_is_checked_and_pickled():
    with pytest.raises(ValueError, match="adaptive"):
        CompressionState(adaptive="yes")
    assert CompressionState(codec="onebit", adaptive=True).codec.spec == ONEBIT_NO_EF
    assert CompressionState(codec="onebit", adaptive=True).server_codec == QSGD4
    assert CompressionState(codec="onebit:ef=on", adaptive=True).codec.spec == gradzip.Codec("onebit:block=128").spec
    assert CompressionState(codec="onebit:block=256", adaptive=True).codec.spec == gradzip.Codec(
        "onebit:block=256,ef=off").spec  # a block size given is kept
    assert CompressionState(codec="onebit", adaptive=True, server_codec="fp16").server_codec == "fp16"
    assert CompressionState(codec="qsgd:bits=4", adaptive=True).codec.spec == QSGD4  # keeps its error feedback
    assert CompressionState(codec="onebit", adaptive=False).codec.spec == gradzip.Codec("onebit").spec
    for kwargs in ({"codec": "onebit"}, {"codec": "onebit:ef=on", "adaptive": True}, {"adaptive": False},
                   {"codec": "onebit:block=512", "adaptive": True}):
        state = CompressionState(**kwargs)
        copy = pickle.loads(pickle.dumps(state))
        assert (copy.adaptive, copy.codec.spec, copy.server_codec) == (state.adaptive, state.codec.spec,
                                                                        state.server_codec), kwargs


@pytest.fixture(scope="module")
def runs():
    out = {}
    for kind in ("adamw", "sgd"):
        out[kind] = run_ranks(adaptive_workers.train, 2, kind, timeout=240)
    out["topk-adamw"] = run_ranks(adaptive_workers.train, 2, "adamw", "topk:density=0.05", timeout=240)
    out["ef-on-adamw"] = run_ranks(adaptive_workers.train, 2, "adamw", "onebit:ef=on", timeout=240)
    return out


def test_an_adaptive_optimizer_turns_error_feedback_off_after_its_first_step(runs):
    for kind in ("adamw",):
        for r in runs[kind]:
            assert all(r["identical"]), kind
            assert r["algorithm"] == "allgather"  # it sends less on 2 ranks
            # Step 1 runs with the default (the optimizer has not stepped yet), then without error feedback.
            assert r["specs"][0] == gradzip.Codec("onebit").spec
            assert set(r["specs"][1:]) == {ONEBIT_NO_EF}, r["specs"]
            assert r["server"] == QSGD4 and "adaptive=True" in r["repr"]
            assert r["adaptive"] is True
    for r in runs["topk-adamw"]:
        assert r["specs"][-1] == gradzip.Codec("topk:density=0.05,ef=off").spec and all(r["identical"])


def test_sgd_and_an_explicit_error_feedback_keep_the_codec(runs):
    for kind in ("sgd", "ef-on-adamw"):
        for r in runs[kind]:
            assert all(r["identical"]), kind
            # after the first step onebit runs in blocks of 128: under momentum SGD for the momentum
            # correction (test_hook_momentum.py), under AdamW as the adaptive default
            assert r["specs"][0] == gradzip.Codec("onebit").spec, r["specs"]
            assert set(r["specs"][1:]) == {gradzip.Codec("onebit:block=128").spec}, (kind, r["specs"])
            assert r["server"] == (None if kind == "sgd" else QSGD4)  # the server codec is the adaptive default
    assert "adaptive=False" in runs["sgd"][0]["repr"]


def test_a_lossy_codec_under_an_adaptive_optimizer_warns_once_on_every_rank():
    seen = run_ranks(adaptive_workers.warnings_seen, 2, timeout=240)
    for rank in seen:
        for case in ("onebit/adamw", "topk/rmsprop"):
            assert len(rank[case]) == 1, (case, rank)
            assert "gradzip.torch.CompressedAdamW" in rank[case][0] and "%" in rank[case][0], rank[case]
        assert "'onebit" in rank["onebit/adamw"][0] and "'topk" in rank["topk/rmsprop"][0]
        assert rank["onebit/adamw again"] == []  # once per process
        assert rank["onebit/sgd"] == []  # error feedback keeps SGD's quality
        assert rank["default/adamw"] == []  # qsgd 4-bit keeps AdamW's


def test_adaptive_given_warns_at_construction(caplog, monkeypatch):
    from gradzip.torch import _quality

    monkeypatch.setattr(_quality, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="gradzip.torch.hook"):
        CompressionState(codec="qsgd:bits=4", adaptive=True)
        CompressionState(codec="onebit", adaptive=False)
        assert caplog.records == []
        CompressionState(codec="onebit", adaptive=True)
        CompressionState(codec="topk:density=0.01", adaptive=True)
    assert len(caplog.records) == 1 and "CompressedAdamW" in caplog.records[0].getMessage()


def test_the_warned_codecs_are_ones_whose_optimizer_the_hook_watches():
    # The hook sees the optimizer only for the codecs whose defaults depend on it
    # (adaptive="auto"); a lossy family outside them would never be warned about.
    from gradzip.torch import _quality, hook

    assert set(_quality.LOSSY_UNDER_ADAPTIVE) <= set(hook._ADAPTIVE_CODECS)
    assert _quality.DEFAULT_CODEC.split(":")[0] not in _quality.LOSSY_UNDER_ADAPTIVE


def test_ranks_that_decide_differently_raise_instead_of_hanging():
    with pytest.raises(Exception, match="adaptive optimizer"):
        run_ranks(adaptive_workers.train, 2, ["adamw", "sgd"], timeout=120)


@pytest.mark.parametrize("save_at", [1, 3])  # 1: saved before the hook decided; 3: after
def test_resume_is_bit_identical(runs, save_at):
    saves = run_ranks(adaptive_workers.train, 2, "adamw", "onebit", 6, save_at, timeout=240)
    resumed = run_ranks(adaptive_workers.train_resumed, 2, [s["saved"] for s in saves], timeout=240)
    for whole, again in zip(runs["adamw"], resumed):
        assert whole["final"] == again["final"]
        assert again["specs"][-1] == ONEBIT_NO_EF and all(again["identical"])


def test_from_5_ranks_onebit_runs_two_phase_with_qsgd_chunk_sums():
    # allgather sends (P-1) c bytes per element, scatter_reduce (P-1)/P (c + s): with qsgd 4-bit
    # chunk sums (s = 0.52, c = 0.14) scatter_reduce sends fewer from 5 ranks; the engine's auto weighs
    # the server codec the hook sends with (the C++ rule, not one of the hook's own).
    for r in run_ranks(adaptive_workers.train, 5, "adamw", "onebit", 3, timeout=240):
        assert r["algorithm"] == "scatter_reduce" and r["server"] == QSGD4
        assert all(r["identical"])
