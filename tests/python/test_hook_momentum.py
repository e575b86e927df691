"""The DDP hook's momentum correction (CompressionState(momentum_correction=
"auto"), DGC's): under momentum SGD, onebit and top-k with error feedback
compress each rank's local momentum and the hook returns S_t - beta S_{t-1}.
Against a plain reference of the rule around the uncorrected hook, bit for
bit; ranks identical after every step; on only where it applies; a
checkpoint resumes bit-identically (into a fresh DDP, whose first step has
the provisional bucket layout)."""

import pickle

import pytest

import gradzip
import momentum_workers
from dist_util import run_ranks
from gradzip.torch import CompressionState

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")

# onebit's block given: the default "onebit" switches to blocks of 128 when the correction starts
# (test_onebit_blocks_of_128_under_the_correction), which the reference would not follow.
CODECS = ["onebit:block=128", "topk:density=0.1"]


@pytest.fixture(scope="module", params=CODECS)
def runs(request):
    codec = request.param
    return codec, {mode: run_ranks(momentum_workers.train, 2, codec, mode, timeout=240)
                   for mode in ("auto", "reference", "off")}


def test_the_correction_is_the_reference_rule_bit_for_bit(runs):
    codec, by_mode = runs
    for auto, ref, off in zip(by_mode["auto"], by_mode["reference"], by_mode["off"]):
        assert auto["beta"] == momentum_workers.BETA and off["beta"] is None
        assert all(auto["identical"]) and all(ref["identical"])
        assert auto["params"] == ref["params"]  # every step
        # It changes what the hook does (the test can fail): step 0 is before the decision.
        assert auto["params"][0] == off["params"][0] and auto["final"] != off["final"]


@pytest.mark.parametrize("optimizer", ["adamw", "plain", "nesterov"])
def test_off_where_it_does_not_apply(optimizer):
    for r in run_ranks(momentum_workers.train, 2, "onebit", "auto", 3, None, None, optimizer, timeout=240):
        assert r["beta"] is None and all(r["identical"])


def test_off_without_error_feedback_and_for_other_codecs():
    for codec in ("onebit:ef=off", "fp16"):
        for r in run_ranks(momentum_workers.train, 2, codec, "auto", 3, timeout=240):
            assert r["beta"] is None


def test_a_given_beta_starts_at_step_zero():
    on = run_ranks(momentum_workers.train, 2, "onebit:block=128", "beta", 3, timeout=240)
    auto = run_ranks(momentum_workers.train, 2, "onebit:block=128", "auto", 3, timeout=240)
    for a, b in zip(on, auto):
        assert a["beta"] == momentum_workers.BETA and all(a["identical"])
        assert a["params"][0] == b["params"][0]  # u_0 = g_0 and S_{-1} = 0: step 0 is the plain step
        assert a["final"] != b["final"]  # the correction's u and S start one step earlier


def test_onebit_blocks_of_128_under_the_correction():
    for r in run_ranks(momentum_workers.train, 2, "onebit", "auto", 3, timeout=240):
        assert r["beta"] == momentum_workers.BETA and r["spec"] == "onebit:block=128" and all(r["identical"])
    for r in run_ranks(momentum_workers.train, 2, "onebit", "off", 2, timeout=240):
        assert r["spec"] == "onebit:block=512"


@pytest.mark.parametrize("save_at", [1, 4])  # before the correction starts (step 1), and during it
@pytest.mark.parametrize("codec", ["onebit", "topk:density=0.1"])
def test_resume_is_bit_identical(codec, save_at):
    whole = run_ranks(momentum_workers.train, 2, codec, "auto", 8, timeout=240)
    saves = run_ranks(momentum_workers.train, 2, codec, "auto", 8, save_at, timeout=240)
    resumed = run_ranks(momentum_workers.train_resumed, 2, codec, "auto", 8, [s["saved"] for s in saves],
                        timeout=240)
    for a, b in zip(whole, resumed):
        assert a["final"] == b["final"] and all(b["identical"]) and b["beta"] == momentum_workers.BETA
        assert a["stats"] == b["stats"]


def test_arguments_are_checked_and_pickled():
    for bad in (0.0, 1.0, -0.5, "on", [0.9]):
        with pytest.raises(ValueError, match="momentum_correction"):
            CompressionState("onebit", momentum_correction=bad)
    # Booleans read as CompressedSGD's on/off (one meaning per argument name):
    # on takes the optimizer's momentum ("auto"), off is None.
    assert CompressionState("onebit", momentum_correction=True).momentum_correction == "auto"
    assert CompressionState("onebit", momentum_correction=False).momentum_correction is None
    state = pickle.loads(pickle.dumps(CompressionState("onebit", momentum_correction=0.9, adaptive=False)))
    assert state.momentum_correction == 0.9 and state._mc is not None and state._mc.beta == 0.9
    assert state.codec.spec == "onebit:block=128"  # the pickle keeps "no block given" (canonical specs name one)
    assert pickle.loads(pickle.dumps(CompressionState("onebit:block=512", momentum_correction=0.9,
                                                      adaptive=False))).codec.spec == "onebit:block=512"
    off = pickle.loads(pickle.dumps(CompressionState("onebit", momentum_correction=None)))
    assert off.momentum_correction is None and off._mc is None
    assert CompressionState("onebit", adaptive=True, momentum_correction=0.9)._mc is None  # adaptive: never
    saved = CompressionState("onebit", momentum_correction=0.9, adaptive=False).state_dict()
    assert "momentum_correction" in saved
    with pytest.raises(ValueError, match="momentum correction on"):
        CompressionState("onebit", momentum_correction=None, adaptive=False).load_state_dict(saved)
    bad = dict(saved, momentum_correction={"beta": 0.9, "keys": [0], "u": [], "s": []})
    with pytest.raises(ValueError, match="malformed"):
        CompressionState("onebit", momentum_correction=0.9, adaptive=False).load_state_dict(bad)
