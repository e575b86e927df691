"""The digits convergence experiment, shortened: fp32, onebit and topk(0.01)
with error feedback, one seed, 4 CPU ranks (bench/digits_convergence.py runs
every method over five seeds for BENCHMARKS.md)."""

import pytest

pytest.importorskip("sklearn", reason="the digits data set ships with scikit-learn")

from gradzip.experiments import digits, two_phase  # noqa: E402

# Points of test accuracy a method may lose against fp32 on the same seed.
# Measured (docs/python.md): over seeds 0-9, onebit and topk(0.01) with error
# feedback ended between -0.56 and +0.56 points of fp32 (one test sample is
# 0.28 points); 1.5 leaves room for other CPUs' float rounding.
MARGIN_POINTS = 1.5


@pytest.fixture(scope="module")
def results():
    runs = digits.run(["fp32", "onebit", "topk:density=0.01"], seeds=[0], ranks=4, timeout=900)
    return {r["method"]: r for r in runs}


def test_fp32_learns_the_digits(results):
    assert results["fp32"]["test_accuracy"] > 0.95


@pytest.mark.parametrize("method", ["onebit", "topk:density=0.01"])
def test_compressed_training_matches_fp32_with_20x_fewer_bytes(results, method):
    fp32, r = results["fp32"], results[method]
    assert 100 * (r["test_accuracy"] - fp32["test_accuracy"]) >= -MARGIN_POINTS, (r, fp32)
    assert r["payload_bytes_per_step"] * 20 <= fp32["payload_bytes_per_step"]
    assert r["extra"]["identical_on_all_ranks"]
    assert r["steps"] == fp32["steps"]


def test_a_onebit_second_phase_delays_the_gradient_and_fp16_does_not():
    """gradzip.experiments.two_phase, shortened (docs/comm.md, "The server phase")."""
    rows = {r["algorithm"]: r for r in two_phase.measure(ranks=4, seed=2, epochs=10)}
    allgather, fp16 = rows["allgather"], rows["scatter_reduce (fp16 sums)"]
    onebit, no_ef = rows["scatter_reduce (onebit sums)"], rows["scatter_reduce (onebit sums, ef=off)"]
    assert abs(fp16["h"][0] - allgather["h"][0]) < 0.03 and abs(fp16["delay"] - allgather["delay"]) < 0.15, rows
    assert onebit["h"][0] < allgather["h"][0] - 0.07 and onebit["delay"] > allgather["delay"] + 0.3, rows
    assert onebit["noise"] > allgather["noise"] + 0.05, rows
    assert no_ef["gain"] < 0.8 < allgather["gain"], rows  # no server EF: a part never arrives
