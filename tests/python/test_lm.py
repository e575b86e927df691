"""gradzip.experiments.lm: the transformer experiment runs end to end on 2
ranks with a tiny configuration (every method family once), every rank holds
the same model, the bytes are counted over the whole run, and the table and
plot are written."""

import json

import pytest

import gradzip
from gradzip.experiments import lm

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")

TINY = lm.Settings(steps=6, batch_per_rank=2, context=16, width=16, layers=1, heads=2, lr_warmup=2, eval_every=3,
                   eval_sequences=4)


def test_text_is_real_and_split():
    train, val, what = lm.text()
    assert len(train) > 50_000 and len(val) > 5_000, what
    assert "GNU" in train or "Python" in train


def test_methods_split_like_codec_specs():
    assert lm.split_methods("fp32,topk:density=0.01,ef=off,onebit@bmuf:h=8,mu=0.5,onebit@cm:warmup=5") == [
        "fp32", "topk:density=0.01,ef=off", "onebit@bmuf:h=8,mu=0.5", "onebit@cm:warmup=5"]
    assert lm.split_methods("backend,onebit@backend:min=0") == ["backend", "onebit@backend:min=0"]


def test_a_tiny_run_of_every_family(tmp_path):
    bmuf = "qsgd:bits=4@bmuf:h=3,mu=0.5,sync=2,eval=ahead,hlate=4:2,lrto=0.5"
    methods = ["fp32", "torch-bf16", "onebit@hook:exact=64,warmup=2", "onebit@cm:warmup=2,min=1", bmuf, "backend",
               "onebit@backend:min=0"]
    results = lm.run(methods, ranks=2, settings=TINY, timeout=240)
    by = {r["method"]: r for r in results}
    assert set(by) == set(methods)
    for r in results:
        assert r["extra"]["identical_on_all_ranks"], r["method"]
        assert r["curve"][-1] == [6, r["val_loss"]] and len(r["curve"]) == 2
        assert 1.0 < r["val_loss"] < 6.0
    fp32 = by["fp32"]["fp32_wire_bytes"]
    assert by["fp32"]["wire_bytes"] == fp32
    assert by["torch-bf16"]["wire_bytes"] == fp32 / 2
    assert by["onebit@cm:warmup=2,min=1"]["extra"]["warmup_steps"] == 2
    extra = by[bmuf]["extra"]
    assert extra["sync_steps"] == 2 and extra["lookahead"] and extra["block_momentum"] == 0.5
    for m in ("onebit@hook:exact=64,warmup=2", "onebit@cm:warmup=2,min=1", bmuf, "onebit@backend:min=0"):
        assert 0 < by[m]["wire_bytes"] < fp32, m
    # TINY's parameters are all below Policy()'s 16384 elements: nothing compressed, counted as fp32's ring.
    assert by["backend"]["extra"]["compressed_calls"] == 0 and by["backend"]["wire_bytes"] == pytest.approx(fp32)
    assert by["onebit@backend:min=0"]["extra"]["compressed_calls"] == 6
    rows = lm.summarize(results)
    table = lm.markdown(rows, TINY, [0])
    assert "| onebit@cm:warmup=2,min=1 |" in table
    lm.plot(results, str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 1000
    json.dumps(rows)
