"""What the reduce-scatter and FSDP2 tests run on every rank (see dist_util.run_ranks)."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
import torch.distributed as dist

import gradzip


def data(rank: int, step: int, n: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(1000 * step + rank).standard_normal(n).astype(np.float32))


def all_inputs(x: torch.Tensor) -> List[torch.Tensor]:
    everyone = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, x)
    return everyone


def error_of(what: Any) -> str:
    try:
        what()
    except (ValueError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def collective_suite(rank: int, world: int) -> Dict[str, Any]:
    """Communicator.reduce_scatter over torch's gloo group (transport='torch')."""
    out: Dict[str, Any] = {}
    n = 4096 * world
    shard = n // world
    comm = gradzip.Communicator.from_torch(transport="torch")

    # none: torch's own reduce-scatter, bit for bit (sum and average).
    for op, torch_op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
        x = data(rank, 0, n)
        want = torch.empty(shard)
        dist.reduce_scatter_tensor(want, x.clone(), op=torch_op)
        got = torch.empty(shard)
        stats = comm.reduce_scatter(x, got, gradzip.Codec("none"), gradzip.ErrorFeedback(), op=op)
        out[f"none_equal/{op}"] = bool(torch.equal(got, want))
        out[f"none_stats/{op}"] = stats
        out[f"none_wire/{op}"] = stats["wire_bytes"] == (world - 1) * shard * 4

    # Lossy codecs: this rank's shard equals a model of the collective built
    # from gradzip.Codec alone (every rank's payload of this chunk, encoded
    # with that rank's residual, decoded and summed in rank order, x 1/P), over
    # three EF steps; and is within the codec's bound of the exact average.
    for spec in ("onebit", "topk:density=0.01", "fp16"):
        codec, state = gradzip.Codec(spec), gradzip.ErrorFeedback()
        residuals = [gradzip.ErrorFeedback() for _ in range(world)]
        same, errors = [], []
        for step in range(3):
            x = data(rank, step, n)
            inputs = all_inputs(x)
            got = torch.empty(shard)
            comm.reduce_scatter(x, got, codec, state, op="avg")
            model = np.zeros(shard, np.float32)
            for q in range(world):
                chunk = inputs[q][rank * shard:(rank + 1) * shard].numpy().copy()
                codec.decode_accumulate(codec.encode(chunk, residuals[q]), model)
            model *= np.float32(1.0 / world)
            same.append(bool(np.array_equal(model, got.numpy())))
            exact = sum(i[rank * shard:(rank + 1) * shard] for i in inputs) / world
            errors.append(float((got - exact).norm() / exact.norm()))
        out[f"matches_model/{spec}"] = all(same)
        out[f"first_error/{spec}"] = errors[0]
        out[f"bound/{spec}"] = codec.error_bound
        out[f"layout/{spec}"] = state.layout

    # Error feedback: the running sum of this rank's shard over many steps
    # converges to the exact running sum (and beats no EF by far).
    for spec in ("onebit", "onebit:ef=off"):
        codec, state = gradzip.Codec(spec), gradzip.ErrorFeedback()
        got_sum, want_sum = torch.zeros(shard, dtype=torch.float64), torch.zeros(shard, dtype=torch.float64)
        for step in range(100):
            x = data(rank, step, n) + 0.3  # a mean that persists: what EF must not lose
            exact = sum(i[rank * shard:(rank + 1) * shard] for i in all_inputs(x)).double()
            got = torch.empty(shard)
            comm.reduce_scatter(x, got, codec, state, op="sum")
            got_sum += got.double()
            want_sum += exact
        out[f"running_error/{spec}"] = float((got_sum - want_sum).norm() / want_sum.norm())

    # A checkpoint continues bit-identically.
    codec, state = gradzip.Codec("topk:density=0.02"), gradzip.ErrorFeedback()
    for step in range(2):
        comm.reduce_scatter(data(rank, step, n), torch.empty(shard), codec, state)
    saved = copy.deepcopy(state.state_dict())
    straight, resumed = [], []
    for step in (2, 3):
        straight.append(torch.empty(shard))
        comm.reduce_scatter(data(rank, step, n), straight[-1], codec, state)
    restored = gradzip.ErrorFeedback()
    restored.load_state_dict(saved)
    for step in (2, 3):
        resumed.append(torch.empty(shard))
        comm.reduce_scatter(data(rank, step, n), resumed[-1], codec, restored)
    out["resume"] = all(torch.equal(a, b) for a, b in zip(straight, resumed))

    # Bad input: refused locally, the same on every rank, before anything is sent.
    none = gradzip.Codec("none")
    out["bad_dtype"] = error_of(lambda: comm.reduce_scatter(torch.zeros(n, dtype=torch.float64),
                                                            torch.zeros(shard, dtype=torch.float64), none,
                                                            gradzip.ErrorFeedback()))
    out["bad_size"] = error_of(lambda: comm.reduce_scatter(torch.zeros(n + 1), torch.zeros(shard), none,
                                                           gradzip.ErrorFeedback()))
    out["bad_output"] = error_of(lambda: comm.reduce_scatter(torch.zeros(n), torch.zeros(shard + 1), none,
                                                             gradzip.ErrorFeedback()))
    # Mismatched codecs: the agreement fails on every rank with one message.
    spec = "onebit" if rank == 0 else "topk"
    out["mismatch"] = error_of(lambda: comm.reduce_scatter(data(rank, 0, n), torch.empty(shard),
                                                           gradzip.Codec(spec), gradzip.ErrorFeedback()))
    # ...and the communicator still works after it.
    x = data(rank, 0, n)
    got = torch.empty(shard)
    comm.reduce_scatter(x, got, none, gradzip.ErrorFeedback(), op="sum")
    want = torch.empty(shard)
    dist.reduce_scatter_tensor(want, data(rank, 0, n), op=dist.ReduceOp.SUM)
    out["after_mismatch"] = bool(torch.equal(got, want))
    comm.close()
    return out


# -- FSDP2 --------------------------------------------------------------------


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(33, 64), torch.nn.ReLU(), torch.nn.Linear(64, 47), torch.nn.ReLU(),
                               torch.nn.Linear(47, 10))


def sharded(seed: int = 0, mp_policy: Any = None) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = mlp(seed)
    kw = {"mp_policy": mp_policy or MixedPrecisionPolicy()}
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(16, 33, generator=g), torch.randint(0, 10, (16,), generator=g)


def local_grads(model: torch.nn.Module) -> List[torch.Tensor]:
    return [p.grad.to_local().detach().clone() for p in model.parameters()]


def backward(model: torch.nn.Module, rank: int, step: int) -> None:
    x, y = batch(rank, step)
    torch.nn.functional.cross_entropy(model(x), y).backward()


def train(model: torch.nn.Module, opt: Any, rank: int, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        backward(model, rank, step)
        opt.step()


def resume_checks(fresh: Any, rank: int) -> Tuple[Dict[str, bool], Dict[str, Any], Any]:
    """Checkpoint and resume of fresh() -> (model, optimizer, gradzip state):
    model, optimizer (momentum) and gradzip state saved after 3 steps; 3 more
    steps straight on, or from the checkpoint in new objects, must end in the
    same bits ("resume_equal"), and without the gradzip state they must not
    (the residuals matter: "resume_without_state_differs"). Also returns the
    checkpoint and the last gradzip state."""
    model, opt, state = fresh()
    train(model, opt, rank, range(3))
    ckpt = copy.deepcopy({"model": model.state_dict(), "optim": opt.state_dict(), "gradzip": state.state_dict()})
    train(model, opt, rank, range(3, 6))
    straight = [p.to_local().clone() for p in model.parameters()]

    def rerun(with_state: bool) -> Any:
        model, opt, state = fresh()
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        if with_state:
            state.load_state_dict(ckpt["gradzip"])
        train(model, opt, rank, range(3, 6))
        return all(torch.equal(a, p.to_local()) for a, p in zip(straight, model.parameters())), state

    equal, _ = rerun(True)
    equal_without, state = rerun(False)
    return {"resume_equal": equal, "resume_without_state_differs": not equal_without}, ckpt, state


def fsdp_suite(rank: int, world: int) -> Dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from gradzip.torch import fsdp as gz_fsdp

    out: Dict[str, Any] = {}

    # none: the gradients of torch's own reduce-scatter, bit for bit.
    plain, ours = sharded(), sharded()
    state = gz_fsdp.register(ours, codec="none")
    backward(plain, rank, 0)
    backward(ours, rank, 0)
    out["none_equal"] = all(torch.equal(a, b) for a, b in zip(local_grads(plain), local_grads(ours)))
    out["none_stats"] = state.compression_stats()
    out["groups"] = sorted(state.state_dict()["groups"])

    # onebit: the first step's gradient within the codec's bound of torch's.
    ours = sharded()
    state = gz_fsdp.register(ours, codec="onebit")
    backward(ours, rank, 0)
    num = sum(float((a - b).norm() ** 2) for a, b in zip(local_grads(plain), local_grads(ours)))
    den = sum(float(a.norm() ** 2) for a in local_grads(plain))
    out["onebit_error"] = (num / den) ** 0.5
    out["onebit_bound"] = gradzip.Codec("onebit").error_bound
    out["onebit_stats"] = state.compression_stats()

    def fresh():
        model = sharded(seed=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return model, opt, gz_fsdp.register(model, codec="topk:density=0.05")

    out.update(resume_checks(fresh, rank)[0])

    # bf16 reduce dtype: upcast, reduced in fp32, cast back; close to torch's.
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    plain16, ours16 = sharded(mp_policy=policy), sharded(mp_policy=policy)
    gz_fsdp.register(ours16, codec="none")
    backward(plain16, rank, 0)
    backward(ours16, rank, 0)
    a, b = local_grads(plain16), local_grads(ours16)
    out["bf16_dtypes"] = sorted({str(g.dtype) for g in b})
    out["bf16_error"] = max(float((x - y).norm() / max(float(x.norm()), 1e-30)) for x, y in zip(a, b))

    # A 64-bit reduce dtype is refused with a clear error.
    policy = MixedPrecisionPolicy(param_dtype=torch.float64, reduce_dtype=torch.float64)
    wide = sharded(mp_policy=policy)
    gz_fsdp.register(wide, codec="none")
    out["fp64_error"] = error_of(lambda: backward(wide, rank, 0))

    # async_op: the call has run; the Work is complete.
    rs = gz_fsdp.CompressedReduceScatter(gz_fsdp.FSDPCompressionState("none"), "direct")
    x = data(rank, 0, 8 * world)
    got = rs.allocate((8,), dtype=torch.float32, device=torch.device("cpu"))
    work = rs(output_tensor=got, input_tensor=x.clone(), group=dist.group.WORLD, op=dist.ReduceOp.SUM, async_op=True)
    want = torch.empty(8)
    dist.reduce_scatter_tensor(want, x, op=dist.ReduceOp.SUM)
    out["async_done"] = work.is_completed() and work.wait() and bool(torch.equal(got, want))
    # PREMUL_SUM(f) (FSDP's gradient divide factor): f x the sum.
    got = torch.empty(8)
    rs(output_tensor=got, input_tensor=x.clone(), group=dist.group.WORLD, op=dist.ReduceOp.PREMUL_SUM(0.25))
    out["premul_equal"] = bool(torch.equal(got, want * 0.25))

    out["no_fsdp"] = error_of(lambda: gz_fsdp.register(mlp()))
    return out


def fsdp_mismatch(rank: int, world: int) -> str:
    """Ranks registered with different codecs: every rank fails with the same error."""
    from gradzip.torch import fsdp as gz_fsdp

    model = sharded()
    gz_fsdp.register(model, codec="onebit" if rank == 0 else "fp16")
    return error_of(lambda: backward(model, rank, 0))
