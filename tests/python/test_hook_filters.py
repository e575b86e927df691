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
