"""Rank bodies of test_backend.py: the gradzip process-group backend on gloo ranks.

backend_suite runs in a group made by init_process_group("cpu:gradzip") (the
policy from GRADZIP_POLICY, set by the test): the training loops below are
written as for any backend (dist.all_reduce on the default group, DDP with no
hook), and each rank checks them against an fp32 reference it computes alone
(every rank's batch is known to every rank). Reference collectives run on a
gloo group made beside it.
"""

import datetime
import hashlib
import time
import warnings

import torch
import torch.distributed as dist

STEPS = 6
SEED = 7


def _net():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def _loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def _digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# -- the training loops, as a user writes them for any backend ----------------

def plain_loop(model, opt, rank, world, steps, start=0):
    """Each rank its batch; gradients averaged with dist.all_reduce."""
    for step in range(start, steps):
        opt.zero_grad()  # set_to_none: every .grad is a new tensor each step
        x, y = _batch(rank, step)
        _loss(model, x, y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()


def ddp_loop(rank, world, steps):
    model = torch.nn.parallel.DistributedDataParallel(_net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        x, y = _batch(rank, step)
        _loss(model, x, y).backward()
        opt.step()
    return model.module


def metrics(rank, world):
    """A metrics average: a few scalars, reduced with SUM and AVG."""
    loss = torch.tensor([0.1 * (rank + 1), 3.0 + rank], dtype=torch.float32)
    total = loss.clone()
    dist.all_reduce(total)
    mean = loss.clone()
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    return total, mean


def reference(world, steps):
    """fp32 data-parallel SGD computed on one rank: the average of every rank's gradient."""
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        grads = None
        for r in range(world):
            model.zero_grad()
            x, y = _batch(r, step)
            _loss(model, x, y).backward()
            g = [p.grad.clone() for p in model.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(model.parameters(), grads):
            p.grad = g / world
        opt.step()
    return model


# -- the suite ------------------------------------------------------------------

def backend_suite(rank, world):
    from gradzip.torch import backend as gzb

    out = {}
    pg = dist.group.WORLD
    out["backend"] = (type(pg).__name__, str(dist.get_backend()), pg.name())
    out["policy"] = repr(pg.policy)
    gloo = dist.new_group(backend="gloo")
    ref = reference(world, STEPS)

    # 1. A plain all_reduce loop.
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = gzb.compression_stats()
    plain_loop(model, opt, rank, world, STEPS)
    after = gzb.compression_stats()
    out["plain/digest"] = _digest(model)
    out["plain/drift"] = float((_flat(model) - _flat(ref)).norm() / _flat(ref).norm())
    out["plain/compressed_calls"] = after["compressed_calls"] - before["compressed_calls"]
    out["plain/exact_calls"] = after["exact_calls"] - before["exact_calls"]
    out["plain/states"] = after["states"]
    out["plain/wire_ratio"] = after["wire_ratio"]

    # 2. DDP with no comm hook.
    before = gzb.compression_stats()
    ddp = ddp_loop(rank, world, STEPS)
    after = gzb.compression_stats()
    out["ddp/digest"] = _digest(ddp)
    out["ddp/drift"] = float((_flat(ddp) - _flat(ref)).norm() / _flat(ref).norm())
    out["ddp/compressed_calls"] = after["compressed_calls"] - before["compressed_calls"]
    out["ddp/states"] = after["states"]
    del ddp

    # 3. A metrics all_reduce: exact (below the policy's threshold).
    total, mean = metrics(rank, world)
    parts = [torch.tensor([0.1 * (r + 1), 3.0 + r], dtype=torch.float32) for r in range(world)]
    expect = parts[0].clone()
    for p in parts[1:]:
        expect += p
    out["metrics/sum_exact"] = torch.equal(total, expect)
    out["metrics/avg_exact"] = torch.equal(mean, expect / world)

    # 3b. torch's functional collectives (DTensor, compiled graphs) reach the backend too.
    import torch.distributed._functional_collectives as fc

    before = gzb.compression_stats()["compressed_calls"]
    value = fc.wait_tensor(fc.all_reduce(torch.full((4096,), float(rank + 1)), "sum", pg))
    out["functional/compressed_calls"] = gzb.compression_stats()["compressed_calls"] - before
    out["functional/value"] = value[:2].tolist()

    # 4. What stays torch's: integers, other ops, float64, other collectives.
    out.update(_delegated(rank, world, pg, gloo))

    # 5. Async work: wait with a timeout while a peer is late, then complete.
    out.update(_async(rank, world))

    # 6. Checkpoint and resume of the error feedback.
    out.update(_resume(rank, world))

    # 6b. Crafted state dicts: each refused with a ValueError, nothing replaced.
    out.update(_crafted())

    # 7. codec none: gloo's sum, bit for bit.
    from gradzip.torch.backend import Policy

    none = dist.new_group(backend="gradzip", pg_options=Policy("none"))
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(rank)) * 1e3
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, group=none)
    dist.all_reduce(b, group=gloo)
    out["none/bit_identical"] = torch.equal(a, b)
    out["none/exact_calls"] = none.compression_stats()["exact_calls"]

    # 8. A peer that stops calling: the engine's error, typed, from Work.wait within the group's timeout.
    out.update(_dead_peer(rank))

    # 9. Ranks with different policies: refused on every rank when the group is made.
    try:
        dist.new_group(backend="gradzip", pg_options=Policy("onebit" if rank == 0 else "fp16"))
        out["mismatch"] = None
    except Exception as e:  # what the test inspects
        out["mismatch"] = (type(e).__name__, str(e))
    dist.barrier(group=gloo)
    return out


def _delegated(rank, world, pg, gloo):
    out = {}
    stats0 = pg.compression_stats()
    big = 1 << 16

    def both(fn):
        a, b = fn(None), fn(gloo)
        return all(torch.equal(x, y) for x, y in zip(a, b))

    def ar(dtype, op):
        def f(group):
            t = (torch.arange(big) * (rank + 3) % 1000).to(dtype)
            dist.all_reduce(t, op=op, group=group)
            return [t]
        return f

    out["delegated/int64_sum"] = both(ar(torch.int64, dist.ReduceOp.SUM))
    out["delegated/int32_max"] = both(ar(torch.int32, dist.ReduceOp.MAX))
    out["delegated/float_max"] = both(ar(torch.float32, dist.ReduceOp.MAX))
    out["delegated/float64_sum"] = both(ar(torch.float64, dist.ReduceOp.SUM))

    def bcast(group):
        t = torch.full((big,), float(rank))
        dist.broadcast(t, src=1, group=group)
        return [t]

    def gather_all(group):
        outs = [torch.empty(big) for _ in range(world)]
        dist.all_gather(outs, torch.full((big,), float(rank)), group=group)
        flat = torch.empty(world * 3)
        dist.all_gather_into_tensor(flat, torch.full((3,), float(rank)), group=group)
        return outs + [flat]

    def reduce_scatter(group):
        out_t = torch.empty(big)
        dist.reduce_scatter_tensor(out_t, torch.arange(world * big, dtype=torch.float32) * (rank + 1), group=group)
        return [out_t]

    def all_to_all(group):
        o = torch.empty(world * 4)
        dist.all_to_all_single(o, torch.arange(world * 4, dtype=torch.float32) + 100 * rank, group=group)
        return [o]

    def p2p(group):
        t = torch.full((5,), float(rank))
        peer = 1 - rank if world == 2 else (rank + 1) % world
        if rank == 0:
            dist.send(t, peer, group=group)
        elif rank == 1:
            dist.recv(t, 0, group=group)
        return [t]

    for name, fn in [("broadcast", bcast), ("all_gather", gather_all), ("reduce_scatter", reduce_scatter),
                     ("all_to_all", all_to_all), ("send_recv", p2p)]:
        out[f"delegated/{name}"] = both(fn)
    dist.barrier()
    stats1 = pg.compression_stats()
    out["delegated/compressed_calls"] = stats1["compressed_calls"] - stats0["compressed_calls"]
    return out


def _async(rank, world):
    out = {}
    t = torch.randn(1 << 16, generator=torch.Generator().manual_seed(10 + rank))
    if rank == 1:
        time.sleep(2.0)  # rank 0's wait below times out meanwhile
    work = dist.all_reduce(t, async_op=True)
    if rank == 0:
        out["async/completed_early"] = work.is_completed()
        t0 = time.monotonic()
        try:
            work.wait(datetime.timedelta(seconds=0.3))
            out["async/timeout"] = None
        except Exception as e:
            out["async/timeout"] = (type(e).__name__, isinstance(e, RuntimeError), round(time.monotonic() - t0, 2))
    out["async/wait"] = work.wait()
    out["async/completed"] = work.is_completed()
    fut_value = work.get_future().wait()
    out["async/future_is_tensor"] = fut_value[0] is t or torch.equal(fut_value[0], t)
    out["async/digest"] = hashlib.sha256(t.numpy().tobytes()).hexdigest()
    return out


def _dead_peer(rank):
    from gradzip.torch.backend import Policy

    out = {}
    group = dist.new_group(backend="gradzip", timeout=datetime.timedelta(seconds=2), pg_options=Policy(min_elements=0))
    t = torch.ones(4096)
    dist.all_reduce(t, group=group)  # both ranks: the communicator exists
    if rank == 0:  # rank 1 does not come to the second call
        work = dist.all_reduce(t, group=group, async_op=True)
        t0 = time.monotonic()
        try:
            work.wait()
            out["dead_peer"] = None
        except Exception as e:
            out["dead_peer"] = (type(e).__name__, isinstance(e, RuntimeError), round(time.monotonic() - t0, 1),
                                str(e)[:300])
    dist.barrier()  # the default group still works
    return out


def _resume(rank, world):
    from gradzip.torch import backend as gzb

    out = {}
    half = STEPS // 2
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gzb.load_state_dict({**gzb.state_dict(), "states": []})  # start from no error feedback
    plain_loop(model, opt, rank, world, half)
    saved = {"model": {k: v.clone() for k, v in model.state_dict().items()},
             "opt": opt.state_dict(), "gradzip": gzb.state_dict()}
    import copy
    import io

    buf = io.BytesIO()
    torch.save(copy.deepcopy(saved), buf)
    plain_loop(model, opt, rank, world, STEPS, start=half)
    straight = _digest(model)

    def resumed(gradzip_state):
        """The run resumed from the checkpoint, with gradzip_state(the saved backend state) loaded."""
        buf.seek(0)
        ckpt = torch.load(buf, weights_only=True)
        m = _net()
        m.load_state_dict(ckpt["model"])
        o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        o.load_state_dict(ckpt["opt"])
        gzb.load_state_dict(gradzip_state(ckpt["gradzip"]))
        plain_loop(m, o, rank, world, STEPS, start=half)
        return _digest(m)

    out["resume/bit_identical"] = resumed(lambda own: own) == straight
    out["resume/without_state_differs"] = resumed(lambda own: {**own, "states": []}) != straight
    out["resume/states"] = len(saved["gradzip"]["states"])

    # Rank 0's state on every rank (a checkpointer that saves one copy): no
    # rank raises, every rank warns once and continues with fresh error
    # feedback, and the ranks stay identical.
    rank0 = [saved["gradzip"]]
    dist.broadcast_object_list(rank0, src=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out["one_copy/digest"] = resumed(lambda own: rank0[0])
    out["one_copy/warned"] = [str(w.message) for w in seen if "gradzip backend" in str(w.message)]
    out["one_copy/equals_fresh"] = out["one_copy/digest"] == resumed(lambda own: {**own, "states": []})

    # Restored on rank 0 only, in a new group (whose ranks have all just
    # started): its first compressed call fails on every rank alike.
    late = dist.new_group(backend="gradzip")  # GRADZIP_POLICY's policy, as the saved state's
    if rank == 0:
        gzb.load_state_dict(saved["gradzip"], group=late)
    t = torch.ones(4096)
    try:
        dist.all_reduce(t, group=late)
        out["some_ranks/error"] = None
    except Exception as e:  # what the test inspects
        out["some_ranks/error"] = (type(e).__name__, str(e))
    return out


def _with_residual(data, value):
    """Saved error feedback (comm/engine/error_feedback.cc's format) with its
    first residual set to `value` and the checksum made again, as an editor
    of the file would."""
    import struct

    from gradzip import _core

    (spec_len,) = struct.unpack_from("<I", data, 8)
    at = 12 + spec_len + 8 + 4 + 4 + 1 + 8 + 8
    body = bytearray(data[:-8])
    struct.pack_into("<f", body, at, value)
    return bytes(body) + struct.pack("<Q", _core._checksum64(bytes(body)))


def _crafted():
    """Each state dict a hostile or damaged checkpoint could hold: the load
    must raise ValueError (gradzip.InvalidArgument) and leave every state and
    count as it was (issue 32: some were accepted, some raised TypeError,
    AttributeError or KeyError, one after replacing the states)."""
    import copy
    import pickle

    from gradzip.torch import backend as gzb

    good = gzb.state_dict()
    assert len(good["states"]) == 2 and good["states"][0]["numel"] != good["states"][1]["numel"]

    def entry(i, **change):
        sd = copy.deepcopy(good)
        sd["states"][i].update(change)
        return sd

    swapped = copy.deepcopy(good)
    swapped["states"][0]["ef"], swapped["states"][1]["ef"] = good["states"][1]["ef"], good["states"][0]["ef"]
    no_ef = copy.deepcopy(good)
    del no_ef["states"][0]["ef"]
    # The policy's fields as a checkpoint holds them, its rules naming fp16 instead of the group's codec.
    other_codec = [[name, value.rsplit(": ", 1)[0] + ": fp16" if name == "rules" else value]
                   for name, value in good["policy"]]
    assert other_codec != [list(f) for f in good["policy"]] and "fp16" not in str(good["policy"])
    cases = {
        "stats_list": {**good, "stats": [1, 2]},
        "stats_string": {**good, "stats": {**good["stats"], "wire_bytes": "7"}},
        "stats_bool": {**good, "stats": {**good["stats"], "exact_calls": True}},
        "codec_not_the_policys": entry(0, codec="fp16"),
        "numel_true": entry(0, numel=True),
        "version_true": {**good, "version": True},
        "world_size_float": {**good, "world_size": 2.0},
        "residual_3e38": entry(0, ef={**good["states"][0]["ef"],
                                      "data": _with_residual(good["states"][0]["ef"]["data"], 3e38)}),
        "residual_nan": entry(0, ef={**good["states"][0]["ef"],
                                     "data": _with_residual(good["states"][0]["ef"]["data"], float("nan"))}),
        "ef_swapped": swapped,
        "states_none": {**good, "states": None},
        "states_dict": {**good, "states": {"0": good["states"][0]}},
        "missing_ef": no_ef,
        "ef_none": entry(0, ef=None),
        "not_a_dict": [good],
        "saved_by_out_of_range": {**good, "saved_by": {"rank": 2, "world_size": 2}},
        "saved_by_other_world": {**good, "saved_by": {"rank": 0, "world_size": 4}},
        "saved_by_string": {**good, "saved_by": "rank 0"},
        "states_tripled": {**good, "states": copy.deepcopy(good["states"]) * 3},
        "ef_unbound": entry(0, ef={"version": 2, "role": None}),
        "policy_other_codec": {**good, "policy": other_codec},
    }
    before = pickle.dumps(good)
    out = {}
    for name, sd in cases.items():
        try:
            gzb.load_state_dict(sd)
            error = None
        except Exception as e:  # what the test inspects
            error = (type(e).__name__, isinstance(e, ValueError), str(e)[:200])
        out[f"crafted/{name}"] = (error, pickle.dumps(gzb.state_dict()) == before)
        if error is None:  # accepted (a defect the test reports): the next case starts from the good state
            gzb.load_state_dict(good)
    return out
