"""The DDP hook's preconditioning for adaptive optimizers (precondition="auto"):
each bucket is compressed in the optimizer's units (divided by the square root
of its second moment, the average multiplied back). Checked: the scale against
Adam's own arithmetic, the hook's average against a plain reference of the
math, the decision (on for AdamW, off for SGD or when asked), the ranks'
agreement, and a restore that cannot find its optimizer."""

import numpy as np
import pytest
import torch

import adaptive_workers
import gradzip
from dist_util import run_ranks
from gradzip.torch import CompressionState
from gradzip.torch import _precondition

TOPK = "topk:density=0.05"

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")


def _stepped(opt_cls, steps=3, **kw):
    torch.manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(11))]
    opt = opt_cls(ps, lr=1e-3, **kw)
    grads = []
    for t in range(steps):
        g = [torch.randn_like(p) * (1 + 10 * t) for p in ps]
        for p, gi in zip(ps, g):
            p.grad = gi.clone()
        grads.append(g)
        opt.step()
    return ps, opt, grads


@pytest.mark.parametrize("amsgrad", [False, True])
def test_the_scale_is_adams_bias_corrected_root_second_moment(amsgrad):
    ps, opt, grads = _stepped(torch.optim.AdamW, betas=(0.9, 0.95), amsgrad=amsgrad)
    v = [np.zeros(p.numel()) for p in ps]
    vmax = [np.zeros(p.numel()) for p in ps]
    for g in grads:  # Adam's second moment, from the gradients themselves
        for i, gi in enumerate(g):
            v[i] = 0.95 * v[i] + 0.05 * gi.reshape(-1).double().numpy() ** 2
            vmax[i] = np.maximum(vmax[i], v[i])
    d = np.sqrt(np.concatenate(vmax if amsgrad else v) / (1 - 0.95 ** len(grads)))
    d = np.maximum(d, _precondition.FLOOR * d.mean())
    got = _precondition.scale(opt, ps)
    np.testing.assert_allclose(got.double().numpy(), d, rtol=1e-5)
    # The floor binds for a coordinate that never had a gradient.
    ps[1].grad = None
    ps[0].grad = torch.zeros_like(ps[0])
    assert _precondition.scale(opt, list(reversed(ps))).shape == (ps[0].numel() + ps[1].numel(),)


def test_other_optimizers_and_the_first_step():
    for cls, key in ((torch.optim.RMSprop, "square_avg"), (torch.optim.Adagrad, "sum")):
        ps, opt, _ = _stepped(cls)
        want = torch.cat([opt.state[p][key].sqrt().reshape(-1) for p in ps])
        want = want.clamp_min(_precondition.FLOOR * float(want.mean()))
        assert torch.equal(_precondition.scale(opt, ps), want), cls.__name__
    ps, opt, _ = _stepped(torch.optim.Adamax)
    assert _precondition.supported(opt) and _precondition.scale(opt, ps) is not None
    ps, opt, _ = _stepped(torch.optim.SGD, momentum=0.9)
    assert not _precondition.supported(opt) and _precondition.scale(opt, ps) is None
    fresh = [torch.nn.Parameter(torch.zeros(3))]
    assert _precondition.scale(torch.optim.AdamW(fresh), fresh) is None  # no second moment before the first step


def test_precondition_is_checked_and_pickled():
    import pickle

    with pytest.raises(ValueError, match="precondition"):
        CompressionState(precondition="yes")
    for kw in ({}, {"precondition": False}, {"precondition": True, "codec": "qsgd:bits=4"}):
        state = CompressionState(**kw)
        assert pickle.loads(pickle.dumps(state)).precondition == state.precondition
    assert CompressionState(codec="fp16")._precond is False  # "auto": top-k only
    assert CompressionState(codec="onebit")._precond is False
    assert CompressionState(codec="onebit", precondition=True)._precond is None  # decided with the optimizer
    assert CompressionState(adaptive=False)._precond is False


@pytest.mark.parametrize("codec", ["onebit", "topk:density=0.05"])
def test_the_hooks_average_is_the_preconditioned_reference(codec):
    ranks = run_ranks(adaptive_workers.preconditioned_average, 2, codec, timeout=240)
    for r in ranks:
        assert "precondition=True" in r["repr"] and r["stats"]["preconditioned_buckets"] == 3, r
        for got, want in zip(r["got"], r["want"]):
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-7)
    assert ranks[0]["got"] == ranks[1]["got"]


@pytest.fixture(scope="module")
def runs():
    return {
        "auto": run_ranks(adaptive_workers.train, 2, "adamw", TOPK, timeout=240),
        "off": run_ranks(adaptive_workers.train, 2, "adamw", TOPK, 6, None, None, False, timeout=240),
        "sgd": run_ranks(adaptive_workers.train, 2, "sgd", TOPK, timeout=240),
        "onebit": run_ranks(adaptive_workers.train, 2, "adamw", "onebit", timeout=240),
    }


def test_on_for_adamw_off_for_sgd_and_when_asked(runs):
    for kind in ("auto", "off", "sgd", "onebit"):  # "auto": top-k only
        for r in runs[kind]:
            assert all(r["identical"]), kind
            n = r["stats"]["preconditioned_buckets"]
            assert n >= 5 if kind == "auto" else n == 0, (kind, r["stats"])  # auto: every bucket of steps 1-5
    assert runs["auto"][0]["final"] != runs["off"][0]["final"]  # it changes what the ranks learn


def test_ranks_that_precondition_differently_raise_instead_of_hanging():
    with pytest.raises(Exception, match="precondition"):
        run_ranks(adaptive_workers.train, 2, "adamw", "onebit", 3, None, None, [True, False], timeout=120)


def test_a_restore_without_its_optimizer_says_so():
    saves = run_ranks(adaptive_workers.train, 2, "adamw", TOPK, 3, 3, timeout=240)
    with pytest.raises(Exception, match="second moment"):  # SGD steps the restored model
        run_ranks(adaptive_workers.train_resumed, 2, [s["saved"] for s in saves], "sgd", TOPK, timeout=120)


def test_resume_is_bit_identical():
    whole = run_ranks(adaptive_workers.train, 2, "adamw", TOPK, 6, 3, timeout=240)
    again = run_ranks(adaptive_workers.train_resumed, 2, [w["saved"] for w in whole], "adamw", TOPK, timeout=240)
    for w, a in zip(whole, again):
        assert a["final"] == w["final"] and all(a["identical"])
        assert a["stats"]["preconditioned_buckets"] == w["stats"]["preconditioned_buckets"] > 0


def test_the_parameters_groups_are_kept_with_the_bucket_until_the_optimizer_changes(monkeypatch):
    """scale() with the bucket's cache looks the parameters' groups up once,
    not per bucket per step, and looks again when the optimizer's groups
    change: the result is always the uncached one."""
    calls = []
    locate = _precondition._locate
    monkeypatch.setattr(_precondition, "_locate", lambda opt, params: calls.append(1) or locate(opt, params))
    ps, opt, _ = _stepped(torch.optim.AdamW, betas=(0.9, 0.95))
    cache = {}
    for _ in range(3):
        assert torch.equal(_precondition.scale(opt, ps, cache), _precondition.scale(opt, ps))
    assert len(calls) == 1 + 3  # the cached calls looked once; the uncached ones every time
    # The same parameters in a new optimizer whose groups differ (betas): looked up again.
    calls.clear()
    other = torch.optim.AdamW([{"params": [ps[0]], "betas": (0.9, 0.5)}, {"params": [ps[1]]}])
    for p in ps:
        other.state[p] = {k: v.clone() for k, v in opt.state[p].items()}
    got = _precondition.scale(other, ps, cache)
    assert calls == [1] and torch.equal(got, _precondition.scale(other, ps))
    assert not torch.equal(got, _precondition.scale(opt, ps))  # the groups' betas count
    # A group's list edited in place (the parameters swapped between the groups): looked up again.
    calls.clear()
    g0, g1 = other.param_groups
    g0["params"][0], g1["params"][0] = g1["params"][0], g0["params"][0]
    got = _precondition.scale(other, ps, cache)
    assert calls == [1] and torch.equal(got, _precondition.scale(other, ps))
    # add_param_group: looked up again.
    calls.clear()
    extra = torch.nn.Parameter(torch.zeros(2))
    other.add_param_group({"params": [extra]})
    _precondition.scale(other, ps, cache)
    _precondition.scale(other, ps, cache)
    assert len(calls) == 1
