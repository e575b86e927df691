"""The DDP hook on models kept in bfloat16 and float16: 2 CPU ranks over gloo.

DDP's buckets then have the model's dtype; the hook compresses them (the
exact float32 widening, float32 residuals) and writes the average back
rounded once. All checks run in one set of processes (ddp_workers.sixteen_bit_suite).
"""

import pytest

import ddp_workers
from dist_util import run_ranks

DTYPES = ["bfloat16", "float16"]
CODECS = ["onebit", "topk:density=0.01", "fp8", "onebit:ef=off"]


@pytest.fixture(scope="module")
def suite():
    return run_ranks(ddp_workers.sixteen_bit_suite, 2, timeout=300)


@pytest.mark.parametrize("dtype", DTYPES)
def test_none_codec_equals_ddp_without_a_hook(suite, dtype):
    assert all(r[f"none_equal/{dtype}"] for r in suite)
    assert suite[0][f"none_stats/{dtype}"]["ratio"] == 1.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("codec", CODECS)
def test_every_rank_ends_with_the_same_16bit_parameters(suite, dtype, codec):
    assert all(r[f"identical/{dtype}/{codec}"] for r in suite)
    assert all(r[f"finite/{dtype}/{codec}"] for r in suite)
    assert suite[0][f"dtype/{dtype}/{codec}"] == f"torch.{dtype}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("codec", ["onebit", "topk:density=0.01", "fp8"])
def test_training_stays_close_to_the_uncompressed_16bit_run(suite, dtype, codec):
    drift = suite[0][f"drift/{dtype}/{codec}"]
    assert drift < 0.1, drift


@pytest.mark.parametrize("dtype", DTYPES)
def test_bytes_count_two_per_element(suite, dtype):
    # A 16-bit bucket is 2 bytes per element dense; onebit sends about 1 bit + scales.
    stats = suite[0][f"stats/{dtype}/onebit"]
    assert 10 <= stats["ratio"] <= 16, stats


@pytest.mark.parametrize("dtype", DTYPES)
def test_resume_is_bit_identical(suite, dtype):
    assert all(r[f"resume/{dtype}"] for r in suite)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradzip_transport(suite, dtype):
    if f"gz/identical/{dtype}" not in suite[0]:
        pytest.skip("gradzip was built without UCX")
    assert all(r[f"gz/identical/{dtype}"] for r in suite)
    assert suite[0][f"gz/drift/{dtype}"] < 0.1


def test_ranks_with_different_dtypes_fail_naming_it(suite):
    for r in suite:
        assert "dtype" in r["mixed"] and "bfloat16" in r["mixed"] and "float32" in r["mixed"], r["mixed"]
