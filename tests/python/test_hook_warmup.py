"""The DDP hook's measured warm-up (CompressionState(warmup_until=...)):
fp32 steps until the relative change of the averaged gradient's norm EMA
stays below the tolerance for `patience` steps (at least warmup_steps, at
most warmup_max). The end step against a plain reference of the rule; the
ranks end it together and hold the same parameters; the steps and bytes are
counted; a checkpoint taken during or after the warm-up resumes bit-identically."""

import math
import pickle

import pytest

import gradzip
import warmup_workers
from dist_util import run_ranks
from gradzip.torch import CompressionState

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")

KW = {"warmup_until": 0.022, "warmup_patience": 2, "warmup_max": 12, "warmup_steps": 2}  # ends at 10


def reference_end(norms, tol, patience, least, cap):
    """The rule, plainly: the first step s (the first compressed one) with s >= cap,
    or s >= least and the EMA's relative change below tol for the last `patience` steps."""
    ema, calm = None, 0
    for s in range(1, len(norms) + 1):
        n = norms[s - 1]
        prev, ema = ema, n if ema is None else 0.9 * ema + 0.1 * n
        calm = calm + 1 if prev is not None and abs(ema - prev) / prev < tol else 0
        if s >= cap or (s >= least and calm >= patience):
            return s
    return None


@pytest.fixture(scope="module")
def whole():
    return run_ranks(warmup_workers.train, 2, KW, timeout=240)


def test_the_warmup_ends_where_the_reference_says(whole):
    norms = whole[0]["norms"]
    end = reference_end(norms, KW["warmup_until"], KW["warmup_patience"], KW["warmup_steps"], KW["warmup_max"])
    # The case is chosen so that the criterion, not a bound, ends the warm-up.
    assert end is not None and KW["warmup_steps"] + KW["warmup_patience"] <= end < KW["warmup_max"], end
    for r in whole:
        assert r["norms"] == norms  # every rank holds the same averaged gradient
        assert r["warm"] == [s < end for s in range(len(r["warm"]))], (r["warm"], end)
        assert r["stats"]["warmup_ended_at"] == end and r["stats"]["uncompressed_steps"] == end
        assert all(r["identical"])
        # The state's own norms: float32-rounded, summed per bucket: close to the reference's.
        hook_ema = r["hook"]["warmup"]["ema"]
        ema = norms[0]
        for n in norms[1:end]:
            ema = 0.9 * ema + 0.1 * n
        assert math.isclose(hook_ema, ema, rel_tol=1e-5)


def test_the_cap_ends_a_warmup_that_never_settles_and_bytes_are_counted():
    kw = {"warmup_until": 1e-9, "warmup_patience": 3, "warmup_max": 5}
    for r in run_ranks(warmup_workers.train, 2, kw, 8, timeout=240):
        assert r["warm"] == [True] * 5 + [False] * 3 and all(r["identical"])
        s = r["stats"]
        assert s["warmup_ended_at"] == 5 and s["uncompressed_steps"] == 5
        # 5 of 8 steps fp32 (a ring: 2(P-1)/P x dense = 1x on 2 ranks), 3 compressed.
        assert s["uncompressed_bytes_per_step"] == pytest.approx(s["dense_bytes_per_step"] * 5 / 8)
        assert 1.0 < s["wire_ratio"] < 8 / 5


@pytest.mark.parametrize("save_at", [3, 10, 12])  # during the warm-up, at its last step, after it
def test_resume_is_bit_identical(whole, save_at):
    saves = run_ranks(warmup_workers.train, 2, KW, 14, save_at, timeout=240)
    resumed = run_ranks(warmup_workers.train_resumed, 2, KW, [s["saved"] for s in saves], timeout=240)
    for a, b in zip(whole, resumed):
        assert a["final"] == b["final"] and all(b["identical"])
        assert a["stats"] == b["stats"]
        assert a["warm"][save_at:] == b["warm"]


def test_arguments_are_checked_and_pickled():
    for bad in ({"warmup_until": 0.0}, {"warmup_until": 1.5}, {"warmup_until": True}, {"warmup_patience": 0},
                {"warmup_max": 0}, {"warmup_until": 0.1, "warmup_steps": 10, "warmup_max": 5}):
        with pytest.raises(ValueError):
            CompressionState(**bad)
    state = pickle.loads(pickle.dumps(CompressionState(warmup_until=0.02, warmup_patience=3, warmup_max=20)))
    assert (state.warmup_until, state.warmup_patience, state.warmup_max) == (0.02, 3, 20)
    assert "warmup_until=0.02" in repr(state)
    with pytest.raises(ValueError, match="without warmup_until"):
        state.load_state_dict(CompressionState().state_dict())
    with pytest.raises(ValueError, match="with warmup_until"):
        CompressionState().load_state_dict(state.state_dict())
