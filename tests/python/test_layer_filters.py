"""Layer filters (exact_below, the DDP hook's policy: _filters.py) in FSDP2's
reduce-scatter and in BlockMomentum: the exact parameters are the fp32
average bit for bit, the others the codec's path on those parameters alone
bit for bit; resume, the ranks' agreement, bad values, wire bytes."""

import pytest
import torch

import gradzip
import layer_filter_workers as w
from dist_util import run_ranks
from gradzip.torch import BlockMomentum, CompressionState, _filters
from gradzip.torch import fsdp as gz_fsdp

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")

BAD = [-1, True, 1.5, "64"]


def _message(make):
    with pytest.raises(ValueError) as e:
        make()
    return str(e.value)


@pytest.mark.parametrize("bad", BAD)
def test_bad_exact_below_is_refused_alike_everywhere(bad):
    model = torch.nn.Linear(4, 3)
    plain = _message(lambda: _filters.check(bad))
    assert "exact_below" in plain and repr(bad) in plain
    assert _message(lambda: gz_fsdp.FSDPCompressionState(exact_below=bad)) == plain
    # Checked before BlockMomentum meets the other ranks (no process group here).
    assert _message(lambda: BlockMomentum(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                          exact_below=bad)) == plain
    # The hook also takes "auto" (decided with the optimizer), and says so.
    hook = _message(lambda: CompressionState(exact_below=bad))
    assert hook == _message(lambda: _filters.check(bad, auto=True))
    assert hook == plain.replace("must be None", "must be 'auto', None")


def test_auto_is_the_hooks_alone():
    assert CompressionState(exact_below="auto").exact_below == "auto"
    assert _filters.check("auto", auto=True) == "auto"
    for make in (lambda: _filters.check("auto"), lambda: gz_fsdp.FSDPCompressionState(exact_below="auto")):
        with pytest.raises(ValueError, match="exact_below must be None"):
            make()


def test_split_of_a_flat_model_and_of_shards():
    split = _filters.split_flat([(40, 40), (40,), (40,), (30, 40), (20, 30)], exact_below=1000)
    assert split.compressed == [(0, 1600), (1680, 1200)] and split.exact == [(1600, 80), (2880, 600)]
    assert _filters.split_flat([(40, 40)], exact_below=1000) is None  # nothing exact: sent whole
    assert _filters.split_flat([(40,)], exact_below=None) is None
    # Shards: the elements are the shard's, the kind the whole parameter's; empty shards take no run.
    shards = _filters.split_runs([((64, 33), 0, 1056), ((64,), 1056, 0), ((47, 64), 1056, 1536)], 1000)
    assert shards is None  # the empty bias shard leaves nothing exact
    shards = _filters.split_runs([((64, 33), 0, 1056), ((64,), 1056, 32), ((47, 64), 1088, 1536)], 2000)
    assert shards.exact == [(1056, 32)] and shards.compressed == [(0, 1056), (1088, 1536)]


def test_none_codec_turns_the_filter_off_and_it_pickles():
    import pickle

    assert gz_fsdp.FSDPCompressionState("none", exact_below=64).exact_below is None
    copy = pickle.loads(pickle.dumps(gz_fsdp.FSDPCompressionState("onebit", exact_below=64)))
    assert copy.exact_below == 64


# -- FSDP2 ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fsdp_collective():
    return run_ranks(w.fsdp_collective, 2, timeout=240)


@pytest.fixture(scope="module")
def fsdp():
    pytest.importorskip("torch.distributed.fsdp")
    return run_ranks(w.fsdp_suite, 2, timeout=300)


def test_fsdp_exact_shards_are_torchs_reduce_scatter_and_the_rest_the_codecs_alone(fsdp_collective):
    for r in fsdp_collective:
        assert r["exact_equal"]  # torch's fp32 reduce-scatter of the exact pieces, bit for bit
        assert r["lossy_equal"]  # an unfiltered onebit state on the compressed pieces alone, bit for bit
        assert r["lossy_differs"]
        s = r["stats"]
        assert s["exact_wire_bytes"] == 3 * 4 * r["exact_elements"]  # 3 calls, (P-1)/P of 2 chunks, fp32
        assert s["wire_bytes"] == s["exact_wire_bytes"] + r["alone_stats"]["wire_bytes"]
        assert s["dense_bytes"] > r["alone_stats"]["dense_bytes"]


def test_fsdp_filtered_gradients_and_bytes(fsdp):
    for r in fsdp:
        assert r["exact_equal"] and r["lossy_differs"]
        assert not r["unfiltered_exact_equal"]  # without the filter the biases go through onebit
        f, u = r["stats"], r["unfiltered_stats"]
        assert 0 < f["exact_wire_bytes"] < f["wire_bytes"] and u["exact_wire_bytes"] == 0
        assert f["calls"] == u["calls"] == 3 and f["dense_bytes"] == u["dense_bytes"]
        assert f["wire_ratio"] < u["wire_ratio"]  # the exact bytes are counted


def test_fsdp_filtered_checkpoint_resumes_bit_identically(fsdp):
    for r in fsdp:
        assert r["resume_equal"] and r["resume_without_state_differs"]
        assert "exact_below=1000" in r["restore_other_filter"] and "64" in r["restore_other_filter"]
        assert r["pickled_exact_below"] == w.EXACT_BELOW


def test_fsdp_mismatched_exact_below_fails_alike_on_every_rank():
    pytest.importorskip("torch.distributed.fsdp")
    errors = run_ranks(w.fsdp_mismatch, 2, timeout=120)
    assert "exact_below" in errors[0] and "1000" in errors[0] and "None" in errors[0], errors[0]
    assert errors[0] == errors[1]


# -- BlockMomentum --------------------------------------------------------------


@pytest.fixture(scope="module")
def bmuf():
    return run_ranks(w.bmuf_suite, 3, timeout=300)


def test_bmuf_exact_parameters_are_the_fp32_average_and_the_rest_the_codecs_alone(bmuf):
    for r in bmuf:
        assert all(r["exact_equal"]), r["exact_equal"]
        assert all(r["lossy_equal"]), r["lossy_equal"]  # error feedback carried per part over 4 blocks
        assert all(r["identical"])


def test_bmuf_exact_bytes_are_counted(bmuf):
    for r in bmuf:
        f, u = r["stats"], r["unfiltered_stats"]
        assert 0 < f["uncompressed_bytes_per_step"] < f["wire_bytes_per_step"]
        assert u["uncompressed_bytes_per_step"] == 0
        assert f["wire_ratio"] < u["wire_ratio"]
        assert f["payload_bytes_per_block"] > u["payload_bytes_per_block"]


def test_bmuf_filter_with_overlap(bmuf):
    for r in bmuf:
        assert r["overlap_identical"]
        s = r["overlap_stats"]
        assert s["blocks"] == 4 and 0 < s["uncompressed_bytes_per_step"] < s["wire_bytes_per_step"]


def test_bmuf_filtered_checkpoint_resumes_bit_identically(bmuf):
    for r in bmuf:
        assert r["resume_equal"]
        assert "exact_below" in r["restore_other_filter"]


def test_bmuf_mismatched_exact_below_fails_alike_on_every_rank():
    errors = run_ranks(w.bmuf_mismatch, 2, timeout=120)
    assert "exact_below" in errors[0] and "disagree" in errors[0], errors[0]
    assert all("exact_below" in e and "disagree" in e for e in errors)


def test_experiments_read_exact_alike_for_bmuf_and_the_hook():
    from gradzip.experiments import _digits_bmuf

    spec, kw = _digits_bmuf.parse("onebit@bmuf:h=4,mu=0,algorithm=scatter_reduce,server=onebit,exact=1024")
    assert spec == "onebit" and kw["exact_below"] == 1024 and kw["block_steps"] == 4
    assert _digits_bmuf.parse("onebit@bmuf:h=4,exact=off")[1]["exact_below"] is None
    with pytest.raises(ValueError, match="exact= takes an element count or off"):
        _digits_bmuf.parse("onebit@bmuf:h=4,exact=lots")
