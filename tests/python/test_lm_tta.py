"""The LM experiment's time to accuracy (_tta.py): the time-to-target rule and
its table on synthetic runs, the launched ranks' command line, and the --link
mode end to end on 2 ranks of gradzip-run's emulated cluster (skipped, with
the reason, where the machine cannot make one: root and iproute2 needed)."""

import json
import os
import shutil
import subprocess

import pytest

import gradzip
from gradzip.experiments import lm
from gradzip.experiments.lm import _tta
from gradzip.sweep._registry import find_program


def test_time_to_is_the_first_evaluation_at_or_below_the_target():
    curve = [(10, 1.0, 3.0), (20, 2.0, 2.5), (30, 3.0, 2.6), (40, 4.0, 2.4)]
    assert _tta.time_to(curve, 2.5) == (20, 2.0)  # at the target counts; a later rise does not matter
    assert _tta.time_to(curve, 2.45) == (40, 4.0)
    assert _tta.time_to(curve, 2.0) is None


def _run(method, seed, losses, seconds, wire=100.0):
    steps = [10 * (i + 1) for i in range(len(losses))]
    return {"method": method, "seed": seed, "ranks": 4, "steps": steps[-1], "val_loss": losses[-1],
            "train_loss": 0.0, "wire_bytes": wire, "fp32_wire_bytes": 100.0, "seconds": seconds[-1],
            "curve": [list(p) for p in zip(steps, losses)], "curve_seconds": seconds,
            "extra": {"identical_on_all_ranks": True, "parameters": 10, "text": "t"}}


def test_seconds_to_fp32s_final_loss_and_the_table():
    results = [_run("fp32", 0, [3.0, 2.5, 2.2], [4.0, 8.0, 12.0]),
               _run("onebit@cm", 0, [2.9, 2.2, 2.1], [1.0, 2.0, 3.0], wire=10.0),
               _run("onebit", 0, [3.0, 2.6, 2.3], [2.0, 4.0, 6.0], wire=5.0),
               _run("fp32", 1, [3.0, 2.4, 2.3], [4.0, 8.0, 12.0]),
               _run("onebit@cm", 1, [2.8, 2.35, 2.2], [1.0, 2.0, 3.0], wire=10.0),
               _run("onebit", 1, [3.0, 2.3, 2.35], [2.0, 4.0, 6.0], wire=5.0)]
    rows = {r["method"]: r for r in _tta.summarize(results)}
    assert [r["target"] for r in results] == [2.2, 2.2, 2.2, 2.3, 2.3, 2.3]  # each seed's own fp32
    # fp32 seed 1 was at 2.3 at step 30 only (2.4 before); the cm runs at steps 20 and 30.
    assert rows["fp32"]["seconds_to_target"] == 12.0 and rows["fp32"]["speedup_vs_fp32"] == 1.0
    assert rows["onebit@cm"]["seconds_to_target"] == 2.5 and rows["onebit@cm"]["steps_to_target"] == 25
    assert rows["onebit@cm"]["speedup_vs_fp32"] == pytest.approx(12.0 / 2.5)
    # onebit reaches seed 1's target at step 20 but never seed 0's: not reached, no mean, no speedup.
    assert (rows["onebit"]["reached"], rows["onebit"]["runs"]) == (1, 2)
    assert rows["onebit"]["seconds_to_target"] is None and rows["onebit"]["speedup_vs_fp32"] is None
    assert results[5]["seconds_to_target"] == 4.0 and results[2]["seconds_to_target"] is None
    assert results[1]["time_curve"] == [(10, 1.0, 2.9), (20, 2.0, 2.2), (30, 3.0, 2.1)]
    exchange = {"steps": 20, "step_seconds": 0.2, "compute_seconds": 0.04, "exchange_fraction": 0.8}
    links = [{"link": "25mbit", "exchange": exchange, "summary": list(rows.values()), "results": results},
             {"link": "1gbit", "exchange": dict(exchange, step_seconds=0.05, exchange_fraction=0.2)}]
    text = _tta.markdown(links, lm.Settings(), [0, 1], 4)
    assert "| 25mbit | 200.0 | 40.0 | 80% | yes |" in text and "| 1gbit | 50.0 | 40.0 | 20% | no |" in text
    assert "| onebit@cm | 2.1500 | -4.45% | 0.0 | 10.0x | 3.0 | 2.5 | 25 | 4.80x |" in text
    assert "| onebit | 2.3250 | " in text and "| not reached (1 of 2 seeds) |  |  |" in text
    assert "2.2000 (seed 0), 2.3000 (seed 1)" in text
    # A target 10% above fp32's final loss: onebit reaches seed 0's (2.42) at 6 s and seed 1's (2.53) at 4 s.
    loose = {r["method"]: r for r in _tta.summarize([dict(r) for r in results], within=10.0)}
    assert loose["onebit"]["reached"] == 2 and loose["onebit"]["seconds_to_target"] == pytest.approx(5.0)
    assert _tta.markdown([dict(links[0], summary=list(loose.values()), within=10.0)], lm.Settings(), [0, 1], 4) \
        .count("fp32 DDP's final validation loss + 10%") == 1


def test_time_to_accuracy_needs_fp32():
    with pytest.raises(ValueError, match="needs fp32"):
        _tta.summarize([_run("onebit", 0, [2.0], [1.0])])


def test_the_launched_ranks_get_the_same_settings():
    s = lm.Settings(steps=7, batch_per_rank=3, eval_every=2, width=24, layers=2, heads=3, context=20, device="cuda",
                    eval_sequences=9, lr_warmup=4, corpus="stdlib")
    assert lm.settings_of(lm.parser().parse_args(lm.settings_args(s))) == s


def _why_no_link():
    if not gradzip.BUILD["comm"]:
        return "this gradzip build has no communicator"
    if os.geteuid() != 0:
        return "needs root (gradzip-run --link makes network namespaces)"
    for tool in ("ip", "tc"):
        if not (shutil.which(tool) or any(os.path.exists(os.path.join(d, tool)) for d in ("/usr/sbin", "/sbin"))):
            return f"needs iproute2 ({tool} not found)"
    runner, looked = find_program("gradzip-run")
    if runner is None:
        return f"gradzip-run not found (looked in: {'; '.join(looked)})"
    name = f"gzlm-probe-{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=20)
    if probe.returncode != 0:
        return f"cannot make a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
    return None


def test_link_mode_end_to_end(tmp_path):
    why = _why_no_link()
    if why:
        pytest.skip(f"no emulated link here: {why}")
    out = tmp_path / "tta"
    methods = ["fp32", "torch-fp16", "onebit", "onebit@cm:warmup=2,min=1"]
    assert lm.main(["--link", "100mbit", "--ranks", "2", "--methods", ",".join(methods), "--steps", "6",
                    "--batch", "2", "--context", "16", "--width", "16", "--layers", "1", "--heads", "2",
                    "--eval-every", "2", "--exchange-steps", "3", "--timeout", "120", "--json", f"{out}.json",
                    "--markdown", f"{out}.md", "--plot", f"{out}.png"]) == 0
    data = json.loads((tmp_path / "tta.json").read_text())
    (link,) = data["links"]
    assert link["link"] == "100mbit" and link["exchange"]["steps"] == 3 and link["exchange"]["step_seconds"] > 0
    by = {r["method"]: r for r in link["results"]}
    assert list(by) == methods and [r["method"] for r in link["summary"]] == methods
    for r in link["results"]:
        steps, seconds, losses = zip(*r["time_curve"])
        assert steps == (2, 4, 6) and all(0 < a < b for a, b in zip(seconds, seconds[1:])), r["time_curve"]
        assert seconds[-1] == r["seconds"] and losses[-1] == r["val_loss"]
        assert r["target"] == by["fp32"]["val_loss"]
        assert r["extra"]["identical_on_all_ranks"], r["method"]
    fp32 = next(row for row in link["summary"] if row["method"] == "fp32")
    assert fp32["seconds_to_target"] <= by["fp32"]["seconds"] and fp32["speedup_vs_fp32"] == 1.0
    assert by["torch-fp16"]["wire_bytes"] == by["fp32"]["wire_bytes"] / 2
    table = (tmp_path / "tta.md").read_text()
    assert "| 100mbit |" in table and "### Link 100mbit" in table and "| onebit@cm:warmup=2,min=1 |" in table
    assert (tmp_path / "tta.png").stat().st_size > 1000
