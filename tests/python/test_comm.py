"""gradzip.Communicator (UCX) from Python: 2 and 3 ranks in spawned processes."""

import pytest

import gradzip
from dist_util import run_ranks

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"] or not gradzip.BUILD["ucx"],
                                reason="this gradzip build has no UCX transport")


@pytest.fixture(scope="module", params=[2, 3], ids=lambda p: f"{p}ranks")
def suite(request):
    import comm_workers

    return run_ranks(comm_workers.comm_suite, request.param, timeout=240)


def test_ranks(suite):
    assert [r["rank_size"] for r in suite] == [(i, len(suite)) for i in range(len(suite))]
    assert "transport='ucx'" in suite[0]["repr"] and suite[0]["closed"] == "Communicator(closed)"


@pytest.mark.parametrize("algorithm", ["allgather", "scatter_reduce", "ring"])
def test_none_gives_the_exact_sum_and_average(suite, algorithm):
    for r in suite:
        assert r[f"none_sum/{algorithm}"] < 1e-5
        assert r[f"none_avg/{algorithm}"] < 1e-5
        assert r[f"stats/{algorithm}"]["algorithm"] == algorithm
        # wire_bytes counts every byte sent; the ranks share a node, so none went to another.
        stats = r[f"stats/{algorithm}"]
        assert stats["wire_bytes"] > 0 and stats["remote_bytes"] == 0


@pytest.mark.parametrize("spec", ["onebit", "topk:density=0.01", "fp16", "topk:density=0.05,select=sample"])
def test_every_rank_gets_the_same_bits(suite, spec):
    assert all(r[f"identical/{spec}"] for r in suite)
    assert all(r[f"identical/{spec}/ring"] for r in suite)
    assert suite[0][f"layout/{spec}"]["n"] == 4099


def test_scatter_reduce_is_the_documented_algorithm(suite):
    assert all(r["scatter_reduce_matches_model"] for r in suite)
    assert suite[0]["server_codec_spec/onebit"] == "fp16"
    assert suite[0]["server_codec_spec/onebit/same"] == "onebit:block=512"  # the codec itself, canonical


def test_state_dict_continues_bit_identically(suite):
    assert all(r["resume"] for r in suite)
    assert all(r["resume_v1"] for r in suite)  # a state dict gradzip.AllreduceState saved


@pytest.mark.parametrize("case", ["encode_then_allreduce", "allreduce_then_encode"])
def test_a_state_serves_either_encode_or_a_collective(suite, case):
    for r in suite:
        assert r[case] is not None and "Codec.encode" in r[case] and "collective" in r[case], r[case]


def test_disagreeing_ranks_get_a_clear_error(suite):
    for r in suite:
        assert r["disagree"] is not None and "disagree" in r["disagree"] and "codec" in r["disagree"]


def test_bad_input_is_refused(suite):
    assert "float32" in suite[0]["bad_dtype"]
    assert "valid codecs" in suite[0]["bad_server_codec/twobit"]
    assert "server_codec must be" in suite[0]["bad_server_codec/3"]


def test_from_env(suite):
    assert all(r["from_env"] < 1e-5 for r in suite)
