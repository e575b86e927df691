"""Tuning before comparing (gradzip.experiments._tune): the grid, its widening
at an edge, the seeds at each best and at fp32's best, the tables against fp32
at its best learning rate, the records file that resumes a run and refuses
another run's records; and `python -m gradzip.experiments.lm --tune` end to end
on 2 ranks with a tiny model."""

import json
import math
import subprocess
import sys

import pytest

import gradzip
from gradzip.experiments import _tune


def curve_loss(best_lr):
    """A synthetic run's final loss: a parabola in log2(lr) with its minimum at best_lr, plus a seed offset."""
    def loss(method, seed, lr):
        return 2.0 + 0.1 * (math.log2(lr / best_lr[method])) ** 2 + 0.01 * seed
    return loss


class Experiment:
    """A training function for the tuner that records what it was asked to train."""

    def __init__(self, loss):
        self.loss, self.calls = loss, []

    def __call__(self, runs):
        self.calls.append(list(runs))
        return [{"method": m, "seed": s, "lr": lr, "val_loss": self.loss(m, s, lr)} for m, s, lr in runs]


def test_grid_parsing():
    assert _tune.parse_lrs("4e-3,1e-3,2e-3,2e-3") == [1e-3, 2e-3, 4e-3]
    assert _tune.parse_lrs("grid:3e-3") == pytest.approx([7.5e-4, 1.5e-3, 3e-3, 6e-3, 1.2e-2])
    assert _tune.parse_lrs("grid:1:4") == [0.25, 0.5, 1.0, 2.0]
    for bad in ("0", "-1e-3", "nan", "grid:", "grid:1:2:3", "x"):
        with pytest.raises(ValueError):
            _tune.parse_lrs(bad)


def test_each_method_at_its_best_and_at_fp32s():
    exp = Experiment(curve_loss({"fp32": 4e-3, "codec": 1e-3}))
    tuned = _tune.tune(["fp32", "codec"], [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2], [0, 1, 2], exp, _tune.LOSS, {})
    assert tuned.best == {"fp32": 4e-3, "codec": 1e-3}
    assert tuned.edge == {"fp32": None, "codec": None}  # codec's best was at the low edge: widened once
    # First the grid on seed 0, then the widening, then seeds 1 and 2 at each best and at fp32's.
    assert [len(c) for c in exp.calls] == [10, 1, 6]
    assert exp.calls[1] == [("codec", 0, 5e-4)]
    assert {("codec", 1, 4e-3), ("codec", 2, 1e-3), ("fp32", 2, 4e-3)} <= set(exp.calls[2])
    assert tuned.base_values == pytest.approx([2.0, 2.01, 2.02])
    assert tuned.spread == pytest.approx(100 * (2.02 / 2.0 - 1))
    own = {r.method: r for r in tuned.own}
    assert own["codec"].delta_mean == pytest.approx(0.0) and own["codec"].verdict == "tie"
    at_base = {r.method: r for r in tuned.at_base}
    worse = 0.1 * math.log2(4) ** 2  # codec two factors of 2 from its best at fp32's rate
    assert at_base["codec"].lr == 4e-3 and at_base["codec"].verdict == "worse"
    assert at_base["codec"].delta_worst == pytest.approx(100 * ((2.0 + worse) / 2.0 - 1))
    text = tuned.markdown([("extra", lambda r: r.method.upper())])
    assert "| codec | 0.001 | 2.0000 / 2.0100 / 2.0200 | 2.0100 | +0.00% | +0.00% | tie | CODEC |" in text
    assert "| codec | 0.004 | 2.4000 / 2.4100 / 2.4200 | 2.4100 | +19.90% | +20.00% | no: worse | CODEC |" in text
    assert "fp32 at its best learning rate 0.004: 2.0000 / 2.0100 / 2.0200" in text
    assert "**2.0000**" in text
    json.dumps(tuned.summary())


def test_a_best_that_stays_at_the_edge_is_reported():
    exp = Experiment(lambda m, s, lr: 1.0 / lr)  # always better at a higher rate
    tuned = _tune.tune(["fp32"], [1.0, 2.0, 4.0], [0], exp, _tune.LOSS, {}, max_widen=2)
    assert tuned.best["fp32"] == 16.0 and tuned.edge["fp32"] == "high"
    assert "| 16 (edge) |" in tuned.markdown()


def test_accuracy_is_higher_better_in_points():
    def train(runs):
        return [{"method": m, "seed": s, "lr": lr, "test_accuracy": {"fp32": 0.97, "c": 0.95}[m] - 0.01 * abs(
            math.log2(lr / 0.1))} for m, s, lr in runs]

    tuned = _tune.tune(["fp32", "c"], [0.05, 0.1, 0.2], [0, 1], train, _tune.ACCURACY, {})
    row = {r.method: r for r in tuned.own}["c"]
    assert row.delta_mean == pytest.approx(2.0) and row.verdict == "worse"  # 2 points worse
    assert "-2.00 points" in tuned.markdown() and "Negative: worse than it." in tuned.markdown()


def test_records_resume_and_refuse_other_settings(tmp_path):
    path = str(tmp_path / "runs.jsonl")
    loss = curve_loss({"fp32": 2e-3})
    first = Experiment(loss)
    _tune.tune(["fp32"], [1e-3, 2e-3, 4e-3], [0, 1], first, _tune.LOSS, {"steps": 10}, path)
    again = Experiment(loss)
    tuned = _tune.tune(["fp32"], [1e-3, 2e-3, 4e-3], [0, 1], again, _tune.LOSS, {"steps": 10, "lr": 9.0}, path)
    assert again.calls == [] and tuned.best["fp32"] == 2e-3  # everything was recorded (lr is the run's own)
    more = Experiment(loss)
    _tune.tune(["fp32"], [1e-3, 2e-3, 4e-3], [0, 1, 2], more, _tune.LOSS, {"steps": 10}, path)
    assert more.calls == [[("fp32", 2, 2e-3)]]
    with pytest.raises(ValueError, match="other settings.*steps"):
        _tune.tune(["fp32"], [1e-3, 2e-3, 4e-3], [0], Experiment(loss), _tune.LOSS, {"steps": 11}, path)
    with open(path, "a") as f:
        f.write("{not json\n")
    with pytest.raises(ValueError, match="not a run record"):
        _tune.Records(path, {"steps": 10})


def test_the_baseline_and_a_grid_are_required():
    with pytest.raises(ValueError, match="fp32"):
        _tune.tune(["codec"], [1, 2, 4], [0], Experiment(lambda *a: 1.0), _tune.LOSS, {})
    with pytest.raises(ValueError, match="at least 3"):
        _tune.tune(["fp32"], [1, 2], [0], Experiment(lambda *a: 1.0), _tune.LOSS, {})


@pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")
def test_lm_tune_end_to_end(tmp_path):
    out, records = tmp_path / "tune.json", tmp_path / "runs.jsonl"
    cmd = [sys.executable, "-m", "gradzip.experiments.lm", "--ranks", "2", "--tune", "--methods", "fp32,fp16",
           "--lr", "1e-3,2e-3,4e-3", "--seeds", "0,1", "--max-widen", "0", "--steps", "5", "--batch", "2",
           "--context", "16", "--width", "16", "--layers", "1", "--heads", "2", "--eval-every", "1",
           "--records", str(records), "--json", str(out), "--timeout", "300"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["best_lr"]) == {"fp32", "fp16"}
    lines = records.read_text().splitlines()
    assert len(lines) == len(data["records"]) >= 3 + 3 + 2  # the grid of both on seed 0, then seed 1
    assert "fp32's validation loss moved" in r.stdout and "Each method at its own best" in r.stdout
    for rec in data["records"]:
        assert rec["extra"]["identical_on_all_ranks"] and rec["lr"] in (1e-3, 2e-3, 4e-3)
    # A rerun trains nothing: every run is in the records file.
    r2 = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert r2.returncode == 0 and "tune: training" not in r2.stderr, r2.stderr[-2000:]
    assert len(records.read_text().splitlines()) == len(lines)
