"""What the layer-filter tests of FSDP2 and BlockMomentum run on every rank
(dist_util.run_ranks): the filtered path against plain references written
out here (slices of each chunk and torch's own reduce-scatter for FSDP; an
all_gather of the ranks' updates and a separate gradzip allreduce of the
compressed parameters alone for BMUF), resume, the ranks' agreement."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

import gradzip
from fsdp_workers import backward, data, error_of, resume_checks, sharded

EXACT_BELOW = 1000


def is_exact(shape: Sequence[int]) -> bool:
    """The policy, written out (not _filters.is_exact): the reference's own."""
    return len(shape) <= 1 or int(np.prod(shape)) < EXACT_BELOW


# -- FSDP2 ----------------------------------------------------------------------

# One chunk's layout: (parameter shape, elements of its padded shard in a chunk).
LAYOUT = [((64, 33), 32 * 33), ((64,), 32), ((47, 64), 24 * 64), ((47,), 24), ((10, 47), 5 * 47), ((10,), 5)]


def pieces(chunk: torch.Tensor, exact: bool) -> torch.Tensor:
    """The chunk's parameters of one kind, end to end (by slicing, from LAYOUT)."""
    out, off = [], 0
    for shape, m in LAYOUT:
        if is_exact(shape) == exact:
            out.append(chunk[off:off + m])
        off += m
    return torch.cat(out)


def fsdp_collective(rank: int, world: int) -> Dict[str, Any]:
    """FSDPCompressionState.reduce_scatter with an explicit layout, against
    torch's reduce-scatter of the exact pieces and an unfiltered state's
    reduce-scatter of the compressed pieces alone (3 steps: error feedback)."""
    from gradzip.torch import fsdp as gz_fsdp

    out: Dict[str, Any] = {}
    chunk = sum(m for _, m in LAYOUT)
    filtered = gz_fsdp.FSDPCompressionState("onebit", exact_below=EXACT_BELOW)
    alone = gz_fsdp.FSDPCompressionState("onebit")
    exact_equal, lossy_equal, lossy_differs = [], [], []
    for step in range(3):
        x = data(rank, step, world * chunk)
        chunks = x.view(world, chunk)
        got = torch.empty(chunk)
        filtered.reduce_scatter("g", got, x.clone(), dist.group.WORLD, dist.ReduceOp.AVG, LAYOUT)
        # exact: torch's reduce-scatter of every chunk's exact pieces
        e_in = torch.cat([pieces(chunks[r], True) for r in range(world)])
        e_want = torch.empty(e_in.numel() // world)
        dist.reduce_scatter_tensor(e_want, e_in, op=dist.ReduceOp.AVG)
        exact_equal.append(bool(torch.equal(pieces(got, True), e_want)))
        # compressed: the codec path on those parameters alone
        c_in = torch.cat([pieces(chunks[r], False) for r in range(world)])
        c_want = torch.empty(c_in.numel() // world)
        alone.reduce_scatter("g", c_want, c_in, dist.group.WORLD, dist.ReduceOp.AVG)
        lossy_equal.append(bool(torch.equal(pieces(got, False), c_want)))
        c_exact = torch.empty_like(c_want)
        dist.reduce_scatter_tensor(c_exact, c_in.clone(), op=dist.ReduceOp.AVG)
        lossy_differs.append(not torch.equal(c_want, c_exact))
    out["exact_equal"] = all(exact_equal)
    out["lossy_equal"] = all(lossy_equal)
    out["lossy_differs"] = all(lossy_differs)
    out["stats"] = filtered.compression_stats()
    out["alone_stats"] = alone.compression_stats()
    out["exact_elements"] = sum(m for s, m in LAYOUT if is_exact(s))
    return out


def fsdp_suite(rank: int, world: int) -> Dict[str, Any]:
    from gradzip.torch import fsdp as gz_fsdp

    out: Dict[str, Any] = {}
    # One backward from the same weights: the exact parameters' sharded
    # gradients are torch's fp32 reduce-scatter's bit for bit (none is, on two
    # ranks), the others differ (onebit).
    plain, ours, whole = sharded(), sharded(), sharded()
    state = gz_fsdp.register(ours, codec="onebit", exact_below=EXACT_BELOW)
    unfiltered = gz_fsdp.register(whole, codec="onebit")
    for m in (plain, ours, whole):
        backward(m, rank, 0)
    exact, lossy, exact_unfiltered = True, True, True
    for (name, p), q, w in zip(ours.named_parameters(), plain.parameters(), whole.parameters()):
        a, b, c = p.grad.to_local(), q.grad.to_local(), w.grad.to_local()
        if is_exact(p.shape):
            exact &= bool(torch.equal(a, b))
            exact_unfiltered &= bool(torch.equal(c, b))
        else:
            lossy &= not bool(torch.equal(a, b))
    out["exact_equal"], out["lossy_differs"], out["unfiltered_exact_equal"] = exact, lossy, exact_unfiltered
    out["stats"], out["unfiltered_stats"] = state.compression_stats(), unfiltered.compression_stats()

    # Checkpoint and resume (momentum SGD), filtered: bit-identical.
    def fresh(exact_below: Any = EXACT_BELOW):
        model = sharded(seed=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return model, opt, gz_fsdp.register(model, codec="onebit", exact_below=exact_below)

    checks, ckpt, state = resume_checks(fresh, rank)
    out.update(checks)
    out["restore_other_filter"] = error_of(
        lambda: gz_fsdp.FSDPCompressionState("onebit", exact_below=64).load_state_dict(ckpt["gradzip"]))
    import pickle

    out["pickled_exact_below"] = pickle.loads(pickle.dumps(state)).exact_below
    return out


def fsdp_mismatch(rank: int, world: int) -> str:
    """Ranks registered with different exact_below: every rank fails with the same error."""
    from gradzip.torch import fsdp as gz_fsdp

    model = sharded()
    gz_fsdp.register(model, codec="onebit", exact_below=EXACT_BELOW if rank == 0 else None)
    return error_of(lambda: backward(model, rank, 0))


# -- BlockMomentum --------------------------------------------------------------


def bmuf_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(40, 40), torch.nn.LayerNorm(40), torch.nn.Tanh(),
                               torch.nn.Linear(40, 30, bias=False), torch.nn.Tanh(), torch.nn.Linear(30, 20),
                               torch.nn.Linear(20, 3))


def bmuf_backward(model: torch.nn.Module, rank: int, step: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 40, generator=g), torch.randn(8, 3, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def kinds(model: torch.nn.Module) -> Tuple[torch.Tensor, torch.Tensor]:
    """Boolean masks over the flat model: exact elements, compressed elements."""
    mask = torch.cat([torch.full((p.numel(),), is_exact(p.shape)) for p in model.parameters()])
    return mask, ~mask


def everyone(x: torch.Tensor) -> List[torch.Tensor]:
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x.contiguous())
    return out


def make_bmuf(model: torch.nn.Module, codec: str = "onebit", **kw: Any) -> Any:
    from gradzip.torch import BlockMomentum

    local = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    return BlockMomentum(model, local, block_steps=2, codec=codec, block_momentum=0.0, transport="torch", **kw)


def bmuf_suite(rank: int, world: int) -> Dict[str, Any]:
    """W's exact parameters are the fp32 average of the ranks' updates
    (summed in rank order, x float32 1/P) bit for bit; its compressed ones
    are a gradzip allreduce of those parameters alone (its own error
    feedback, carried over the blocks) bit for bit; W is the same on every
    rank; a checkpoint resumes bit-identically."""
    out: Dict[str, Any] = {}
    model = bmuf_model(rank)
    opt = make_bmuf(model, exact_below=EXACT_BELOW)
    exact_mask, lossy_mask = kinds(model)
    comm = gradzip.Communicator.from_torch(transport="torch")
    ref_ef, codec = gradzip.ErrorFeedback(), gradzip.Codec("onebit")
    inv = np.float32(1.0 / world)
    last: List[torch.Tensor] = []  # the local model after each local step: what goes into the exchange
    opt.local_optimizer.register_step_post_hook(lambda *_: last.append(flat(model)))
    exact_equal, lossy_equal, identical = [], [], []
    for block in range(4):
        w = opt.state_dict()["global"]
        for step in (2 * block, 2 * block + 1):
            opt.zero_grad()
            bmuf_backward(model, rank, step)
            opt.step()  # the second ends the block
        update = last[-1] - w  # mu = 0: the block started from W
        got = opt.state_dict()["global"]
        ups = everyone(update)
        exact_avg = ups[0][exact_mask].clone()
        for u in ups[1:]:
            exact_avg += u[exact_mask]
        exact_avg *= torch.tensor(inv)
        exact_equal.append(bool(torch.equal(got[exact_mask], w[exact_mask] + exact_avg)))
        c = update[lossy_mask].clone()
        comm.allreduce(c, codec, ref_ef, op="avg")
        lossy_equal.append(bool(torch.equal(got[lossy_mask], w[lossy_mask] + c)))
        identical.append(all(torch.equal(got, g) for g in everyone(got)))
    out["exact_equal"], out["lossy_equal"], out["identical"] = exact_equal, lossy_equal, identical
    out["stats"] = opt.compression_stats()
    opt.close()
    comm.close()

    # Unfiltered, the same run: the exact parameters go through onebit (not the fp32 average).
    model = bmuf_model(rank)
    plain = make_bmuf(model)
    for s in range(8):
        plain.zero_grad()
        bmuf_backward(model, rank, s)
        plain.step()
    out["unfiltered_stats"] = plain.compression_stats()
    plain.close()

    # Checkpoint and resume: bit-identical; another exact_below is refused.
    def fresh(exact_below: Any = EXACT_BELOW) -> Tuple[torch.nn.Module, Any]:
        m = bmuf_model(rank)
        return m, make_bmuf(m, exact_below=exact_below)

    def run(m: torch.nn.Module, o: Any, steps: range) -> None:
        for s in steps:
            o.zero_grad()
            bmuf_backward(m, rank, s)
            o.step()

    m, o = fresh()
    run(m, o, range(5))  # mid-block
    ckpt = copy.deepcopy({"model": m.state_dict(), "bmuf": o.state_dict()})
    run(m, o, range(5, 11))
    o.sync()
    straight = o.state_dict()["global"]
    o.close()
    m, o = fresh()
    m.load_state_dict(ckpt["model"])
    o.load_state_dict(ckpt["bmuf"])
    run(m, o, range(5, 11))
    o.sync()
    out["resume_equal"] = bool(torch.equal(straight, o.state_dict()["global"]))
    o.close()
    m, o = fresh(exact_below=None)
    m.load_state_dict(ckpt["model"])
    out["restore_other_filter"] = error_of(lambda: o.load_state_dict(ckpt["bmuf"]))
    o.close()

    # Overlapped (the exchange on the background thread): the same exchange
    # one block late; W identical on every rank, its exact part the fp32 average.
    m = bmuf_model(rank)
    o = make_bmuf(m, exact_below=EXACT_BELOW, overlap=True)
    run(m, o, range(7))
    o.sync()
    g = o.state_dict()["global"]
    out["overlap_identical"] = all(torch.equal(g, x) for x in everyone(g))
    out["overlap_stats"] = o.compression_stats()
    o.close()
    return out


def bmuf_mismatch(rank: int, world: int) -> str:
    model = bmuf_model(0)
    return error_of(lambda: make_bmuf(model, exact_below=EXACT_BELOW if rank == 0 else None))
