"""CompressionState's arguments and the layout tracking behind it, in one process."""

import datetime
import pickle

import pytest
import torch
import torch.distributed as dist

import gradzip
from cuda_util import skip_unless_cuda_codecs
from dist_util import free_port
from gradzip.torch import CompressionState, compression_hook
from gradzip.torch import _layout


# First: the module's process group does not exist yet.
def test_a_state_builds_and_pickles_before_the_process_group_exists():
    if dist.is_initialized():
        pytest.skip("a process group is up")
    state = CompressionState(codec="topk:density=0.01", warmup_steps=2, transport="gradzip",
                             algorithm="allgather", server_codec="onebit:block=64")
    copy = pickle.loads(pickle.dumps(state))
    assert (copy.codec.spec, copy.warmup_steps, copy.transport, copy.algorithm, copy.server_codec, copy.step) == (
        state.codec.spec, 2, "gradzip", "allgather", "onebit:block=64", 0)
    assert copy.state_dict() == state.state_dict()
    with pytest.raises(RuntimeError, match="init_process_group"):
        copy._bind()  # what its first hook call does


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("kwargs,match", [
    ({"codec": "twobit"}, "valid codecs"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"warmup_steps": 1.5}, "warmup_steps"),
    ({"transport": "mpi"}, "unknown transport"),
    ({"algorithm": "butterfly"}, "unknown algorithm"),
    ({"communicator": object()}, "only with transport='gradzip'"),
    ({"server_codec": "twobit"}, "valid codecs"),
])
def test_bad_arguments_raise_value_error_with_a_reason(group, kwargs, match):
    with pytest.raises(ValueError, match=match):
        CompressionState(**kwargs)


def test_defaults_and_state_dict_checks(group):
    state = CompressionState()
    assert state.codec.spec == gradzip.Codec("qsgd:bits=4").spec  # test_defaults.py says why
    assert state.warmup_steps == 0 and state.transport == "torch" and state.process_group is None
    assert state.server_codec is None  # scatter_reduce's default: the codec itself (fp16 for onebit)
    saved = state.state_dict()
    CompressionState().load_state_dict(saved)
    with pytest.raises(ValueError, match="codec"):
        CompressionState(codec="topk").load_state_dict(saved)
    with pytest.raises(ValueError, match="not a gradzip"):
        state.load_state_dict({})


def test_a_state_with_an_explicit_group_does_not_pickle(group):
    with pytest.raises(TypeError, match="process_group"):
        pickle.dumps(CompressionState(process_group=dist.group.WORLD))


def test_one_rank_training_works(group):
    model = torch.nn.Linear(8, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = CompressionState(codec="topk:k=3")
    ddp.register_comm_hook(state, compression_hook)
    before = [p.detach().clone() for p in model.parameters()]
    ddp(torch.randn(5, 8)).sum().backward()
    assert state.step == 1
    changed = sum(int((p.grad != 0).sum()) for p in model.parameters())
    assert changed == 3  # one rank: the average is this rank's top 3
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


# --- layout tracking, with plain tensors standing in for parameters --------------

class FakeEF:
    def __init__(self, n, sources):
        self.n, self.sources = n, sources
        self.bound = any(s is not None for s, _, _ in sources)


def params(*sizes):
    return [torch.zeros(s) for s in sizes]


def test_a_stable_layout_is_planned_once():
    t = _layout.Tracker()
    a, b = params(3, 4), params(5)
    plan_a = t.plan(0, a, 7, FakeEF)
    plan_b = t.plan(1, b, 5, FakeEF)
    t.end_step()
    assert plan_a.identity and plan_b.identity
    again = t.plan(0, a, 7, FakeEF)
    assert again.parts == plan_a.parts and t.plan(1, b, 5, FakeEF).parts == plan_b.parts
    assert t.plan(0, a, 7, FakeEF) is again  # cached from now on
    assert t.events == ["new", "new"]


def test_rebucketing_moves_residuals_with_their_parameters():
    t = _layout.Tracker()
    p = params(3, 4, 5)
    first = t.plan(0, p, 12, FakeEF).parts[0][0]  # DDP's provisional single bucket
    t.end_step()
    second = t.plan(0, [p[2], p[1]], 9, FakeEF).parts[0][0]  # rebuilt, reversed
    third = t.plan(1, [p[0]], 3, FakeEF).parts[0][0]
    assert second.ef.sources == [(first.ef, 7, 5), (first.ef, 3, 4)]
    assert third.ef.sources == [(first.ef, 0, 3)]
    assert t.events == ["new", "remap", "remap"]


def test_a_restored_state_compresses_the_saved_segments_until_ddp_rebuilds():
    old = _layout.Tracker()
    p = params(3, 4, 5)
    old.plan(0, p, 12, FakeEF)
    old.end_step()
    old.plan(0, [p[2], p[1]], 9, FakeEF)
    old.plan(1, [p[0]], 3, FakeEF)
    saved = [_layout.Segment(s.keys, s.numels, s.ef) for s in old.segments()]

    new = _layout.Tracker()
    q = params(3, 4, 5)  # the same model, rebuilt in a new process
    new.restore(old.shapes(), saved)
    plan = new.plan(0, q, 12, FakeEF)  # provisional single bucket
    assert [s.keys for s, _ in plan.parts] == [s.keys for s in saved]
    runs = {s.keys: r for s, r in plan.parts}
    assert runs[(0,)] == [(0, 0, 3)] and runs[(2, 1)] == [(7, 0, 5), (3, 5, 4)]
    new.end_step()
    assert new.plan(0, [q[2], q[1]], 9, FakeEF).parts == [(saved[1] if saved[1].keys == (2, 1) else saved[0], None)]


def test_a_checkpoint_of_another_model_is_refused():
    old = _layout.Tracker()
    old.plan(0, params(3, 4), 7, FakeEF)
    old.end_step()
    new = _layout.Tracker()
    new.restore(old.shapes(), old.segments())
    with pytest.raises(_layout.LayoutMismatch, match="shape"):
        new.plan(0, params(3, 5), 8, FakeEF)


def test_parameters_of_another_model_are_refused():
    t = _layout.Tracker()
    t.plan(0, params(3), 3, FakeEF)
    t.end_step()
    with pytest.raises(ValueError, match="one CompressionState per DDP model"):
        t.plan(0, params(3), 3, FakeEF)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("codec", ["none", "onebit", "topk:density=0.05,select=sample", "fp16"])
def test_one_gpu_training_over_nccl(group, codec):
    """CUDA buckets through NCCL (a one-rank NCCL group beside the gloo one)."""
    skip_unless_cuda_codecs()
    nccl = dist.new_group(backend="nccl")

    def train(hook_codec):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
        ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=nccl, bucket_cap_mb=0.25)
        state = None
        if hook_codec is not None:
            state = CompressionState(codec=hook_codec, process_group=nccl)
            ddp.register_comm_hook(state, compression_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator(device="cuda").manual_seed(1)
        for _ in range(5):
            x = torch.randn(32, 256, device="cuda", generator=g)
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
        torch.cuda.synchronize()
        return torch.cat([p.detach().reshape(-1) for p in net.parameters()]), state

    flat, state = train(codec)
    assert flat.is_cuda and torch.isfinite(flat).all()
    assert state.step == 5
    if codec == "none":
        plain, _ = train(None)
        assert torch.equal(flat, plain)
    else:
        assert state.compression_stats()["ratio"] > 1.5
