"""Top-k with DGC's corrections (issue 22 item 2b): CompressedAdamW's
innovation mode (the momentum's change against the shared momentum travels,
EF21 / LoCo style) and CompressedSGD's momentum correction, momentum factor
masking, local gradient clipping and sparsity warm-up: each against a plain
loop of its math over gradzip's two-phase allreduce, ranks identical after
every step, the residual carried across density changes, bit-identical
resume, bad arguments.

Every multi-rank check runs in one set of 3 processes (dgc_workers.suite).
"""

import pytest
import torch

import cm_workers
import dgc_workers
import gradzip
from dist_util import run_ranks
from gradzip.torch import CompressedAdamW, CompressedSGD

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")


@pytest.fixture(scope="module")
def three_ranks():
    return run_ranks(dgc_workers.suite, 3, timeout=300)


def test_innovation_equals_the_plain_loop(three_ranks):
    for r in three_ranks:
        assert r["innovation/identical"]
        assert r["innovation/err"] < 1e-6, r["innovation/err"]
        # Compressing the momentum itself ends elsewhere: the test tells them apart.
        assert r["innovation/err_vs_momentum"] > 1e-3, r["innovation/err_vs_momentum"]


@pytest.mark.parametrize("masking", [False, True, "lvar"])
def test_update_mode_equals_the_plain_loop(three_ranks, masking):
    for r in three_ranks:
        # (lvar: masking and each rank's own variance, against the frozen one)
        assert r[f"update/{masking}/identical"]
        assert r[f"update/{masking}/err"] < 1e-6, r[f"update/{masking}/err"]
        assert r[f"update/{masking}/err_vs_other"] > 1e-4, r[f"update/{masking}/err_vs_other"]


def test_dgc_sgd_equals_the_plain_loop(three_ranks):
    for r in three_ranks:
        assert r["dgc/identical"]
        assert r["dgc/err"] < 1e-6, r["dgc/err"]
        # Without masking or clipping the loop ends elsewhere.
        assert r["dgc/err_vs_unmasked"] > 1e-4, r["dgc/err_vs_unmasked"]
        assert r["dgc/err_vs_unclipped"] > 1e-4, r["dgc/err_vs_unclipped"]
        # The mask (residual exactly zero) is the k coordinates top-k sent per chunk.
        assert r["dgc/sent_counts"] and all(c == r["dgc/k"] for c in r["dgc/sent_counts"]), r["dgc/sent_counts"]


def test_sparsity_warmup_densities_and_bytes(three_ranks):
    for r in three_ranks:
        assert r["sparsity/identical"]
        assert r["sparsity/densities"] == pytest.approx([0.4, 0.4, 0.2, 0.2, 0.1, 0.1])
        assert r["sparsity/codecs"] == ["topk:density=0.1", "topk:density=0.2", "topk:density=0.4"]
        w = r["sparsity/wire"]  # 2 full-precision steps, then 0.4, 0.4, 0.2, 0.2, 0.1 ...
        w = [round(x, 6) for x in w]
        assert w[2] == w[3] > w[4] == w[5] > w[6] == w[7] > 0, w


def test_the_residual_carries_across_density_changes(three_ranks):
    for r in three_ranks:
        assert r["conserve/True"] < 1e-5, r["conserve/True"]
        assert r["conserve/False"] > 1e-2, r["conserve/False"]  # a dropped residual breaks it


@pytest.mark.parametrize("which", ["innovation", "update", "lvar", "dgc"])
def test_resume_is_bit_identical(three_ranks, which):
    for r in three_ranks:
        assert r[f"resume/{which}"]["same"]
        assert r[f"resume/{which}"]["control_differs"]


def test_density_schedule_without_ranks():
    opt = CompressedAdamW(cm_workers.make_model(0).parameters(), codec="topk:density=0.01", sparsity_warmup=8,
                          sparsity_start=0.16, sparsity_stages=4)
    assert [opt.density_at(j) for j in range(10)] == pytest.approx([0.16, 0.16, 0.08, 0.08, 0.04, 0.04, 0.02,
                                                                    0.02, 0.01, 0.01])
    assert CompressedAdamW(cm_workers.make_model(0).parameters(), codec="onebit").density_at(0) is None


def test_a_topk_server_codec_scales_with_the_sparsity_warmup():
    opt = CompressedAdamW(cm_workers.make_model(0).parameters(), codec="topk:density=0.01", sparsity_warmup=4,
                          sparsity_start=0.04, sparsity_stages=2, server_codec="topk:density=0.03")
    assert [(c.spec, s) for c, s in (opt._codec_at(j) for j in (0, 2, 4))] == [
        ("topk:density=0.04", "topk:density=0.12"), ("topk:density=0.02", "topk:density=0.06"),
        ("topk:density=0.01", "topk:density=0.03")]
    opt = CompressedAdamW(cm_workers.make_model(0).parameters(), codec="topk:density=0.01", sparsity_warmup=4,
                          sparsity_start=0.04, server_codec="fp16")
    assert opt._codec_at(0)[1] == "fp16"


def test_local_clipping_in_the_full_precision_stage_is_clip_grad_norm():
    m1, m2 = cm_workers.make_model(0), cm_workers.make_model(0)
    a = CompressedSGD(m1.parameters(), lr=0.1, momentum=0.9, warmup_steps=1000, clip_norm=0.05)
    b = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    for t in range(5):
        for m, o in ((m1, a), (m2, b)):
            o.zero_grad()
            cm_workers.loss_of(m, 0, t).backward()
            if o is b:
                torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
            o.step()
    assert torch.allclose(cm_workers.flat(m1), cm_workers.flat(m2), atol=1e-6)


@pytest.mark.parametrize("cls, kwargs, match", [
    (CompressedAdamW, {"compress": "gradient"}, "compress"),
    (CompressedAdamW, {"local_variance": True}, "local_variance"),
    (CompressedAdamW, {"codec": "onebit", "sparsity_warmup": 10}, "top-k"),
    (CompressedAdamW, {"codec": "topk:k=5", "sparsity_warmup": 10}, "top-k"),
    (CompressedAdamW, {"codec": "topk:density=0.01", "sparsity_warmup": 10, "sparsity_start": 2.0}, "sparsity_start"),
    (CompressedAdamW, {"codec": "topk:density=0.1", "sparsity_warmup": 10, "sparsity_start": 0.01},
     "sparsity_start"),
    (CompressedAdamW, {"sparsity_warmup": -1}, "sparsity_warmup"),
    (CompressedSGD, {"sparsity_stages": 0}, "sparsity_stages"),
    (CompressedSGD, {"clip_norm": -1.0}, "clip_norm"),
    (CompressedSGD, {"clip_norm": float("nan")}, "clip_norm"),
])
def test_bad_arguments_raise_value_error(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(cm_workers.make_model(0).parameters(), **kwargs)


def test_state_dict_of_another_mode_is_refused():
    a = CompressedAdamW(cm_workers.make_model(0).parameters(), codec="topk:density=0.1", compress="innovation")
    b = CompressedAdamW(cm_workers.make_model(0).parameters(), codec="topk:density=0.1")
    with pytest.raises(ValueError, match="compress"):
        b.load_state_dict(a.state_dict())
    c = CompressedSGD(cm_workers.make_model(0).parameters(), codec="topk:density=0.1", momentum_correction=True)
    d = CompressedSGD(cm_workers.make_model(0).parameters(), codec="topk:density=0.1")
    with pytest.raises(ValueError, match="momentum_correction"):
        d.load_state_dict(c.state_dict())
    e = CompressedAdamW(cm_workers.make_model(0).parameters(), codec="topk:density=0.01", sparsity_warmup=5)
    f = CompressedAdamW(cm_workers.make_model(0).parameters(), codec="topk:density=0.01")
    with pytest.raises(ValueError, match="sparsity"):
        f.load_state_dict(e.state_dict())
