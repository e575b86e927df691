"""The DDP hook's layer filter (exact_below): biases and norm weights are
averaged exactly, matrices through the codec, the ranks hold the same
gradients, and the uncompressed steps and bytes are reported and counted."""

import pytest

import filter_workers
import gradzip
from dist_util import run_ranks
from gradzip.torch import CompressionState, _filters, _layout

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")


def test_split_keeps_vectors_and_small_tensors_apart():
    seg = _layout.Segment([0, 1, 2, 3], [12, 40, 1600, 40], ef=None)
    shapes = [(3, 4), (40,), (40, 40), (40,)]
    split = _filters.split_of(seg, shapes, exact_below=100)
    assert split.exact == [(0, 52), (1652, 40)]  # the 12-element matrix, then the two vectors
    assert split.compressed == [(52, 1600)]
    assert split.n_exact == 92 and split.n_compressed == 1600
    assert _filters.split_of(seg, shapes, exact_below=None) is None
    only_matrices = _layout.Segment([2], [1600], ef=None)
    assert _filters.split_of(only_matrices, shapes, exact_below=100) is None


def test_exact_below_is_checked_and_pickled():
    with pytest.raises(ValueError, match="exact_below"):
        CompressionState(exact_below=-1)
    import pickle

    copy = pickle.loads(pickle.dumps(CompressionState(codec="onebit", exact_below=64)))
    assert copy.exact_below == 64
    assert CompressionState(codec="none", exact_below=64).exact_below is None


@pytest.fixture(scope="module")
def three_ranks():
    return run_ranks(filter_workers.suite, 3, timeout=240)


def test_filtered_parameters_are_averaged_exactly(three_ranks):
    for r in three_ranks:
        f, u = r["filtered"], r["unfiltered"]
        assert f["identical"] and u["identical"]
        assert f["exact_err"] < 1e-6, f
        assert u["exact_err"] > 1e-4, u  # without the filter the vectors go through onebit
        assert f["lossy_err"] > 1e-4  # the matrices still do


def test_uncompressed_steps_and_bytes_are_reported_and_counted(three_ranks):
    f, u = three_ranks[0]["filtered"]["stats"], three_ranks[0]["unfiltered"]["stats"]
    assert f["uncompressed_steps"] == 2 and u["uncompressed_steps"] == 0
    assert f["uncompressed_bytes_per_step"] > 0 and u["uncompressed_bytes_per_step"] == 0
    assert f["uncompressed_bytes_per_step"] < f["wire_bytes_per_step"]
    assert f["wire_ratio"] < u["wire_ratio"]  # warm-up and exact bytes are in the ratio


def test_auto_is_checked_decided_with_the_optimizer_and_pickled():
    import pickle

    with pytest.raises(ValueError, match="exact_below"):
        CompressionState(exact_below="yes")
    topk = "topk:density=0.01"
    assert CompressionState(codec=topk).exact_below == "auto"  # the default
    assert CompressionState(codec=topk)._exact is None  # decided with the optimizer
    assert CompressionState(codec=topk, adaptive=True)._exact == 1024
    assert CompressionState(codec=topk, adaptive=False)._exact is None
    assert CompressionState(codec=topk, adaptive=True, exact_below=None)._exact is None
    assert CompressionState(codec=topk, adaptive=True, exact_below=64)._exact == 64
    assert CompressionState(codec="qsgd:bits=4", adaptive=True)._exact is None  # top-k only
    copy = pickle.loads(pickle.dumps(CompressionState(codec=topk, adaptive=True)))
    assert (copy.exact_below, copy._exact) == ("auto", 1024)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_auto_filters_top_k_under_adamw_only(kind):
    """Under AdamW the default top-k averages the small parameters exactly
    from the decision on (and counts their bytes); under SGD, or with
    exact_below=None, they go through top-k like the rest."""
    auto = run_ranks(filter_workers.adaptive_suite, 2, kind, timeout=240)
    off = run_ranks(filter_workers.adaptive_suite, 2, kind, "topk:density=0.05", None, timeout=240)
    for a, o in zip(auto, off):
        assert a["identical"] and o["identical"]
        assert o["small_err"] > 1e-4 and o["big_err"] > 1e-4 and o["exact"] is None
        assert o["stats"]["uncompressed_bytes_per_step"] == 0
        assert a["big_err"] > 1e-4  # the 40 x 40 matrix stays in top-k
        if kind == "adamw":
            assert a["exact"] == 1024 and a["small_err"] < 1e-6, a
            assert a["stats"]["uncompressed_bytes_per_step"] > 0
            assert a["stats"]["wire_ratio"] < o["stats"]["wire_ratio"]  # the exact bytes are counted
        else:
            assert a["exact"] is None and a["small_err"] > 1e-4
