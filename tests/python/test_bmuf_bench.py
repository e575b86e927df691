"""bench/bmuf_digits.py without running anything: the method grid, the
method strings, and time to accuracy from mean curves (synthetic records)."""

import importlib.util
from pathlib import Path

import pytest

from gradzip.experiments import _digits_bmuf, digits

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bmuf_digits.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bmuf_digits", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_method_lists_keep_specs_with_commas_together():
    assert digits._split_methods("fp32,topk:density=0.01,ef=off,onebit@bmuf:h=16,mu=0.5,overlap=on,"
                                 "none@bmuf:h=4,onebit") == [
        "fp32", "topk:density=0.01,ef=off", "onebit@bmuf:h=16,mu=0.5,overlap=on", "none@bmuf:h=4", "onebit"]


def test_bmuf_method_strings():
    assert _digits_bmuf.parse("topk:density=0.01@bmuf:h=16,mu=0.5,lr=0.8,nesterov=off,overlap=on") == (
        "topk:density=0.01", {"block_steps": 16, "block_momentum": 0.5, "block_lr": 0.8, "nesterov": False,
                              "overlap": True, "transport": "gradzip"})
    assert _digits_bmuf.parse("qsgd:bits=4@bmuf:h=16,transport=torch") == (
        "qsgd:bits=4", {"block_steps": 16, "transport": "torch"})
    for bad, match in [("onebit@bmuf", "write <codec>@bmuf:h=H"), ("onebit@bmuf:mu=0.5", "h=H"),
                       ("onebit@bmuf:h=4,speed=2", "unknown option"), ("onebit@bmuf:h=4,overlap=maybe", "unknown"),
                       ("onebit@bmuf:h=4,transport=mpi", "unknown option"), ("onebit@bmuf:h", "not key=value")]:
        with pytest.raises(ValueError, match=match):
            _digits_bmuf.parse(bad)


def test_the_grid(bench):
    args = bench.parse_args(["--codecs", "none,topk:density=0.01,ef=off", "--block-steps", "4,16",
                             "--block-momentum", "default,0.5", "--overlap-codecs", "onebit"])
    methods = bench.methods(args)
    assert methods[:2] == ["fp32", "onebit"]
    assert "topk:density=0.01,ef=off@bmuf:h=16" in methods
    assert "none@bmuf:h=4,mu=0.5" in methods
    assert methods[-2:] == ["onebit@bmuf:h=4,mu=0.5,overlap=on", "onebit@bmuf:h=16,mu=0.5,overlap=on"]
    assert len(methods) == 2 + 2 * 2 * 2 + 2
    args = bench.parse_args(["--codecs", "onebit", "--block-steps", "16", "--block-momentum", "0.5",
                             "--transport", "torch"])
    assert bench.methods(args) == ["fp32", "onebit", "onebit@bmuf:h=16,mu=0.5,transport=torch",
                                   "onebit@bmuf:h=16,mu=0.5,overlap=on,transport=torch"]


def _record(method, seed, acc, curve, steps=40, wire=100.0):
    result = {"method": method, "seed": seed, "ranks": 4, "steps": steps, "test_accuracy": acc,
              "train_loss": 0.0, "payload_bytes_per_step": wire, "wire_bytes_per_step": wire,
              "fp32_bytes_per_step": 400.0, "seconds": curve[-1][0],
              "extra": {"curve": curve, "identical_on_all_ranks": True}}
    return {"codec": method, "seed": seed, "epochs": 4, "result": result}


def test_time_to_accuracy_from_mean_curves(bench):
    records = [
        # The reference reaches its mean final accuracy (0.9) at step 30 on the mean curve.
        _record("fp32", 0, 0.92, [(1.0, 10, 0.5), (2.0, 20, 0.85), (3.0, 30, 0.92), (4.0, 40, 0.92)], wire=600),
        _record("fp32", 1, 0.88, [(1.2, 10, 0.5), (2.2, 20, 0.87), (3.2, 30, 0.88), (4.2, 40, 0.88)], wire=600),
        # Evaluated at other steps (block ends); seed 1 lacks step 16, so it is left out.
        _record("m", 0, 0.90, [(0.1, 8, 0.6), (0.2, 16, 0.95), (0.3, 24, 0.91), (0.4, 40, 0.90)], wire=6),
        _record("m", 1, 0.90, [(0.1, 8, 0.6), (0.3, 24, 0.89), (0.5, 40, 0.90)], wire=6),
    ]
    rows, target = bench.summarize(records, ["fp32", "m"], "fp32")
    assert target == pytest.approx(0.90)
    fp32, m = rows
    assert fp32["time_to_target"] == pytest.approx(3.1)
    assert [s for _, _, s in m["curve"]] == [8, 24, 40]
    assert m["time_to_target"] == pytest.approx(0.3)  # step 24: (0.91 + 0.89) / 2 = 0.90
    assert m["steps_to_target"] == 24 and fp32["steps_to_target"] == 30
    assert m["time_speedup"] == pytest.approx(3.1 / 0.3)
    assert m["steps_per_epoch"] == 10 and m["wire_bytes_per_epoch"] == 60
    assert m["bytes_ratio"] == pytest.approx(100)
    assert bench.time_to(m["curve"], 0.99) is None
