"""What the BlockMomentum tests run on every rank (see dist_util.run_ranks).

Every rank starts its model from a different seed (BlockMomentum broadcasts
rank 0's), trains on batches of its own, and compares with a reference:
BMUF written out plainly in numpy float32, fed by an all_gather of the
ranks' local models at each block end. Results are plain data.

suite runs every check over gradzip's UCX transport (transport="gradzip"),
process_group_suite the ones a process group must pass too over the gloo
group itself (transport="torch").
"""

from __future__ import annotations

import io
import os
import struct
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

import gradzip
from gradzip.torch import BlockMomentum

F32 = np.float32
CODECS = ["none", "fp16", "bf16", "onebit", "onebit:ef=off", "topk:density=0.1",
          "topk:density=0.1,select=sample", "qsgd:bits=4", "qsgd:bits=4,stochastic=on"]


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def local_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)


def local_step(model: torch.nn.Module, opt: Any, rank: int, step: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def set_flat(model: torch.nn.Module, values: np.ndarray) -> None:
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.from_numpy(values.copy()), model.parameters())


def gather(x: np.ndarray) -> List[np.ndarray]:
    t = torch.from_numpy(np.ascontiguousarray(x))
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t)
    return [e.numpy() for e in everyone]


def same_on_every_rank(x: np.ndarray) -> bool:
    return all(np.array_equal(x, e) for e in gather(x))


def global_of(opt: BlockMomentum) -> np.ndarray:
    return opt.state_dict()["global"].numpy()


class Reference:
    """BMUF, plainly: x = W (+ mu * Delta); G = mean(W_local - x); Delta =
    mu * Delta + zeta * G; W = W + Delta. The average is the allreduce's:
    each update through the codec, summed in rank order, times float32 1/P.

    Overlapped: a block's average goes through the filter at the end of the
    next block; meanwhile rank r starts from x + (its own update)."""

    def __init__(self, w0: np.ndarray, world: int, mu: float, zeta: float, nesterov: bool, codec: str = "none",
                 buckets: int = 1 << 26, carry_ef: bool = True, overlap: bool = False) -> None:
        self.w, self.delta = w0.copy(), np.zeros_like(w0)
        self.mu, self.zeta, self.nesterov = F32(mu), F32(zeta), nesterov
        self.codec = gradzip.Codec(codec)
        self.buckets = buckets
        self.carry_ef = carry_ef
        self.ef: Dict[tuple, gradzip.ErrorFeedback] = {}
        self.overlap = overlap
        self.pending: Optional[np.ndarray] = None
        self.starts = [w0.copy() for _ in range(world)]  # where each rank's block started

    def start(self) -> np.ndarray:
        return self.delta * self.mu + self.w if self.nesterov else self.w.copy()

    def average(self, updates: List[np.ndarray]) -> np.ndarray:
        g = np.zeros_like(updates[0])
        for lo in range(0, len(g), self.buckets):
            part = g[lo:lo + self.buckets]
            for r, update in enumerate(updates):
                chunk = update[lo:lo + self.buckets].copy()
                if self.codec.name == "none":
                    part += chunk
                else:
                    key = (r, lo)
                    if key not in self.ef or not self.carry_ef:
                        self.ef[key] = gradzip.ErrorFeedback()
                    self.codec.decode_accumulate(self.codec.encode(chunk, self.ef[key]), part)
        return g * (F32(1) / F32(len(updates)))

    def filter(self, g: np.ndarray) -> None:
        if self.zeta != 1:
            g = g * self.zeta
        self.delta = self.delta * self.mu + g
        self.w = self.w + self.delta

    def end_block(self, local_models: List[np.ndarray], drain: bool = False) -> None:
        """Then self.starts holds where each rank starts the next block."""
        updates = [local - start for local, start in zip(local_models, self.starts)]
        if self.pending is not None:
            self.filter(self.pending)
            self.pending = None
        g = self.average(updates)
        if self.overlap and not drain:
            self.pending = g
            self.starts = [self.start() + u for u in updates]
        else:
            self.filter(g)
            self.starts = [self.start() for _ in updates]


def against_reference(rank: int, world: int, steps: List[int], codec: str = "none", carry_ef: bool = True,
                      **kwargs: Any) -> Dict[str, Any]:
    """BlockMomentum and the reference side by side over blocks of the given
    lengths (the last one ended by sync()); per block end, whether the model
    (the next start), W and global_model(lookahead=True) (the reference's
    next start) match bit for bit. block_steps: steps[0] unless given."""
    model, ref_model = make_model(seed=rank), make_model(seed=0)  # rank 0's start is everyone's
    kwargs.setdefault("block_steps", steps[0])
    opt = BlockMomentum(model, local_optimizer(model), codec=codec, **kwargs)
    ref_local = local_optimizer(ref_model)
    ref = Reference(flat(ref_model), world, opt.block_momentum, opt.block_lr, opt.nesterov, codec,
                    kwargs.get("bucket_elements", 1 << 26), carry_ef, opt.overlap)
    out: Dict[str, Any] = {"start": [], "global": [], "ahead": []}
    step = 0
    for i, length in enumerate(steps):
        for _ in range(length):
            local_step(model, opt, rank, step)
            local_step(ref_model, ref_local, rank, step)
            step += 1
        last = i == len(steps) - 1
        if last:
            opt.sync()
        ref.end_block(gather(flat(ref_model)), drain=last)
        set_flat(ref_model, ref.starts[rank])
        out["start"].append(bool(np.array_equal(flat(model), ref.starts[rank])))
        out["global"].append(bool(np.array_equal(global_of(opt), ref.w)))
        with opt.global_model(lookahead=True):
            out["ahead"].append(bool(np.array_equal(flat(model), ref.start())))
    out["moved"] = bool(np.abs(ref.w - flat(make_model(seed=0))).max() > 1e-3)
    out["stats"] = opt.compression_stats()
    out["block_momentum"] = opt.block_momentum
    opt.close()
    return out


def train(opt: BlockMomentum, model: torch.nn.Module, rank: int, first: int, steps: int) -> None:
    for step in range(first, first + steps):
        local_step(model, opt, rank, step)


def identical_with_every_codec(rank: int, world: int, transport: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for codec in CODECS:
        for overlap in (False, True):
            model = make_model(seed=rank)
            opt = BlockMomentum(model, local_optimizer(model), block_steps=2, codec=codec, overlap=overlap,
                                bucket_elements=40, transport=transport)
            train(opt, model, rank, 0, 7)  # three blocks and one step
            w = global_of(opt)
            key = f"{codec}/overlap={overlap}"
            out[f"global/{key}"] = same_on_every_rank(w) and bool(np.isfinite(w).all())
            out[f"blocks/{key}"] = opt.compression_stats()["blocks"]
            if not overlap:  # every rank starts a block from the same point
                opt.sync()
                out[f"start/{key}"] = same_on_every_rank(flat(model))
            opt.close()
    return out


def server_codec(rank: int, world: int, transport: str) -> Dict[str, Any]:
    """onebit over scatter_reduce with its default server codec (fp16) and with
    server_codec="onebit": the same model on every rank either way, and the
    onebit chunk sums put fewer bytes on the wire."""
    out: Dict[str, Any] = {}
    for server in (None, "onebit"):
        model = make_model(seed=rank)
        opt = BlockMomentum(model, local_optimizer(model), block_steps=2, codec="onebit",
                            algorithm="scatter_reduce", server_codec=server, transport=transport)
        train(opt, model, rank, 0, 6)
        w = global_of(opt)
        out[f"same/{server}"] = same_on_every_rank(w) and bool(np.isfinite(w).all())
        out[f"wire/{server}"] = opt.compression_stats()["wire_bytes_per_block"]
        out[f"config/{server}"] = opt.state_dict()["config"]["server_codec"]
        opt.close()
    return out


def resume(rank: int, world: int, codec: str, overlap: bool, transport: str, sync_steps: int = 0) -> Dict[str, Any]:
    """Train 7 steps (H=3: two blocks and one step into the third; sync_steps=2:
    blocks of 1, 1, 3, and two steps into the next), checkpoint, train 8 more;
    then a fresh model and BlockMomentum restored from the checkpoint train
    the same 8: the same bits. A third run restores only the model and must
    differ (the checkpoint is what makes them equal)."""
    kwargs = dict(block_steps=3, codec=codec, overlap=overlap, bucket_elements=40, transport=transport,
                  sync_steps=sync_steps)

    def fresh(seed: int):
        model = make_model(seed)
        return model, BlockMomentum(model, local_optimizer(model), **kwargs)

    model, opt = fresh(rank)
    train(opt, model, rank, 0, 7)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "bmuf": opt.state_dict()}, buf)
    train(opt, model, rank, 7, 8)
    opt.sync()
    expected = (flat(model), global_of(opt))
    opt.close()

    def restored(with_bmuf: bool):
        m, o = fresh(seed=100 + rank)  # construct first: it broadcasts rank 0's model ...
        buf.seek(0)
        ckpt = torch.load(buf, weights_only=True)
        m.load_state_dict(ckpt["model"])  # ... which the checkpoint then replaces
        if with_bmuf:
            o.load_state_dict(ckpt["bmuf"])
        train(o, m, rank, 7, 8)
        o.sync()
        got = (flat(m), global_of(o))
        o.close()
        return got

    got = restored(True)
    control = restored(False)
    return {
        "same": all(np.array_equal(a, b) for a, b in zip(expected, got)),
        "control_differs": not np.array_equal(expected[1], control[1]),
    }


def absurd_states(rank: int, world: int, transport: str) -> Dict[str, Any]:
    """Checkpoints edited (on every rank) to hold finite but absurd values,
    which pass the finiteness checks: W and Delta of 3e38, or an error
    feedback residual of 3e38 with its checksum recomputed. Before, both
    trained on to the end, exit 0, with a W of inf or NaN on every rank. For
    each: where it failed ("load" or "train", or "none"), the error, and
    whether W was still finite."""

    def absurd_global(s: Dict[str, Any]) -> None:
        s["global"] = torch.full_like(s["global"], 3e38)
        s["delta"] = torch.full_like(s["delta"], 3e38)

    def absurd_residual(s: Dict[str, Any]) -> None:
        saved = s["error_feedback"][0]
        body = bytes(saved["data"])[:-8]  # the last residual, then the checksum
        body = body[:-4] + struct.pack("<f", 3e38)
        s["error_feedback"][0] = {**saved, "data": body + struct.pack("<Q", gradzip._core._checksum64(body))}

    out: Dict[str, Any] = {}
    for name, edit in (("absurd_global", absurd_global), ("absurd_residual", absurd_residual)):
        model = make_model(rank)
        opt = BlockMomentum(model, local_optimizer(model), block_steps=2, block_momentum=0.5, codec="onebit",
                            bucket_elements=40, transport=transport)
        train(opt, model, rank, 0, 3)
        state = opt.state_dict()
        edit(state)
        where, error = "none", "no error"
        try:
            where = "load"
            opt.load_state_dict(state)
            where = "train"
            train(opt, model, rank, 3, 6)
            opt.sync()
            where = "none"
        except Exception as e:  # noqa: BLE001 (the test reads which error, and where)
            error = f"{type(e).__name__}: {e}"
        out[name] = {"where": where, "error": error,
                     "finite": bool(np.isfinite(global_of(opt)).all())}
        opt.close()
    return out


def diloco(rank: int, world: int, transport: str) -> Dict[str, Any]:
    """nesterov=True is DiLoCo's outer optimizer: torch SGD(lr=zeta,
    momentum=mu, nesterov=True) on the outer gradient x - mean(W_local), with
    x the point every block starts from (close, not bit-equal: other roundings)."""
    model, outer_model = make_model(seed=rank), make_model(seed=0)
    opt = BlockMomentum(model, local_optimizer(model), block_steps=4, codec="none", block_momentum=0.6,
                        block_lr=0.7, transport=transport)
    inner = local_optimizer(outer_model)
    x = [p.detach().clone() for p in outer_model.parameters()]  # the outer parameters
    outer = torch.optim.SGD(x, lr=0.7, momentum=0.6, nesterov=True)
    worst = 0.0
    for block in range(5):
        for s in range(4):
            local_step(model, opt, rank, 4 * block + s)
            local_step(outer_model, inner, rank, 4 * block + s)
        mean = np.mean(gather(flat(outer_model)), axis=0)
        start = torch.cat([t.reshape(-1) for t in x]).numpy()
        grads = torch.from_numpy((start - mean).astype(np.float32)).split([t.numel() for t in x])
        for t, g in zip(x, grads):
            t.grad = g.reshape(t.shape).clone()
        outer.step()
        with torch.no_grad():
            for p, t in zip(outer_model.parameters(), x):
                p.copy_(t)
        worst = max(worst, float(np.abs(flat(model) - flat(outer_model)).max()))
    opt.close()
    return {"worst": worst}


def module_buffers(rank: int, world: int, transport: str) -> Dict[str, Any]:
    """A module's float32 buffers (batch norm statistics) are averaged in
    fp32 at each block end; integer buffers stay local."""
    def net(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 3))

    model, twin = net(seed=rank), net(seed=0)
    opt = BlockMomentum(model, local_optimizer(model), block_steps=2, codec="onebit", transport=transport)
    twin_opt = local_optimizer(twin)
    train(opt, model, rank, 0, 2)
    train(twin_opt, twin, rank, 0, 2)  # the same block, without the exchange

    def stats(m: torch.nn.Module) -> np.ndarray:
        bn = m[1]
        return torch.cat([bn.running_mean, bn.running_var]).numpy().copy()

    expected = np.zeros_like(stats(twin))
    for local in gather(stats(twin)):
        expected += local
    expected *= F32(1) / F32(world)
    out = {"averaged": bool(np.array_equal(stats(model), expected)),
           "differed_before": not same_on_every_rank(stats(twin)),
           "steps_tracked": int(model[1].num_batches_tracked)}
    opt.close()
    return out


def misuse(rank: int, world: int, transport: str) -> Dict[str, Any]:
    """Errors that need a process group: DDP, a mismatched checkpoint, ranks
    that disagree."""
    out: Dict[str, Any] = {}
    model = make_model(0)

    def make(m: torch.nn.Module = model, **kwargs: Any) -> BlockMomentum:
        return BlockMomentum(m, local_optimizer(m), **{"transport": transport, **kwargs})

    def error(fn: Callable[[], Any]) -> Optional[str]:
        try:
            fn()
        except ValueError as e:
            return str(e)
        return None

    ddp = torch.nn.parallel.DistributedDataParallel(make_model(0))
    out["ddp"] = error(lambda: make(ddp))
    opt = make(block_steps=2)
    saved = opt.state_dict()
    other = make(block_steps=2, codec="topk:density=0.1")
    out["other_codec"] = error(lambda: other.load_state_dict(saved))
    out["not_a_state"] = error(lambda: other.load_state_dict({"version": 99}))
    out["truncated_state"] = error(lambda: other.load_state_dict({"version": 1, "config": {}}))
    out["wrong_communicator"] = error(lambda: make(transport="gradzip", communicator=object()))
    out["communicator_over_torch"] = error(lambda: make(transport="torch", communicator=object()))
    # Ranks that disagree all get the error, naming the ones that differ.
    last = rank == world - 1 and world > 1
    out["disagree"] = error(lambda: make(block_steps=2 + last))
    out["disagree_codec"] = error(lambda: make(block_steps=2, codec="topk:density=0.1" if last else "onebit"))
    # sync() with nothing to exchange does nothing; a partial block counts as one.
    before = flat(model)
    opt.sync()
    out["empty_sync_keeps_model"] = bool(np.array_equal(before, flat(model)))
    out["empty_sync_blocks"] = opt.compression_stats()["blocks"]
    train(opt, model, rank, 0, 1)
    opt.sync()
    out["partial_block_blocks"] = opt.compression_stats()["blocks"]
    for o in (opt, other):
        o.close()
    return out


def overlap_beside_collectives(rank: int, world: int) -> Dict[str, Any]:
    """overlap=True over the gloo group while the training thread runs its own
    allreduce on the same group after every step, exchanges in flight: the
    sums are right and W has the same bits as a run without them."""
    def run(with_collectives: bool):
        model = make_model(seed=rank)
        opt = BlockMomentum(model, local_optimizer(model), block_steps=2, codec="onebit", overlap=True,
                            transport="torch")
        sums_right, in_flight = True, 0
        for step in range(9):
            local_step(model, opt, rank, step)
            if with_collectives:
                # Whether the block's exchange (submitted by this step) still runs.
                pending = opt._background._future
                in_flight += pending is not None and not pending.done()
                t = torch.tensor([float(rank + step)])
                dist.all_reduce(t)
                sums_right &= t.item() == sum(r + step for r in range(world))
        opt.sync()
        w = global_of(opt)
        opt.close()
        return w, sums_right, in_flight

    w, sums_right, in_flight = run(True)
    alone, _, _ = run(False)
    return {"sums_right": sums_right, "same_as_alone": bool(np.array_equal(w, alone)),
            "same_on_every_rank": same_on_every_rank(w), "in_flight": in_flight}


def same_bits_over_both_transports(rank: int, world: int) -> Dict[str, Any]:
    """The gloo group and UCX carry the same compressed allreduce: the same
    training gives the same W and local models, bit for bit."""
    out: Dict[str, Any] = {}
    for codec in ("onebit", "topk:density=0.1", "qsgd:bits=4,stochastic=on"):
        got = []
        for transport in ("torch", "gradzip"):
            model = make_model(seed=rank)
            opt = BlockMomentum(model, local_optimizer(model), block_steps=2, codec=codec, bucket_elements=40,
                                transport=transport)
            train(opt, model, rank, 0, 7)
            got.append((global_of(opt), flat(model)))
            opt.close()
        out[codec] = all(np.array_equal(a, b) for a, b in zip(*got))
    return out


def transports_differ(rank: int, world: int) -> Optional[str]:
    """The last rank asks for UCX, the others for the gloo group: every rank
    fails with IoError within the (shortened) timeout, saying what to check."""
    os.environ["GRADZIP_TIMEOUT_S"] = "3"
    model = make_model(0)
    try:
        BlockMomentum(model, local_optimizer(model), transport="gradzip" if rank == world - 1 else "torch")
    except gradzip.IoError as e:
        return str(e)
    finally:
        del os.environ["GRADZIP_TIMEOUT_S"]
    return None


def without_torch_distributed(rank: int, world: int) -> Dict[str, Any]:
    """transport="gradzip" with a communicator from Communicator.from_env, the
    process group destroyed first: BlockMomentum needs no torch.distributed.
    W is compared through that communicator (rank 0's, summed with zeros)."""
    from dist_util import free_port

    port = torch.tensor([free_port() if rank == 0 else 0])
    dist.broadcast(port, 0)
    os.environ["MASTER_PORT"] = str(int(port))
    dist.destroy_process_group()
    with gradzip.Communicator.from_env("ucx", timeout=30) as comm:
        model = make_model(seed=rank)
        opt = BlockMomentum(model, local_optimizer(model), block_steps=2, codec="onebit", transport="gradzip",
                            communicator=comm)
        train(opt, model, rank, 0, 5)
        opt.sync()
        w = global_of(opt)
        opt.close()
        rank0 = w.copy() if rank == 0 else np.zeros_like(w)
        comm.allreduce(rank0, gradzip.Codec("none"), gradzip.ErrorFeedback(), op="sum")
        return {"initialized": dist.is_initialized(), "blocks": opt.compression_stats()["blocks"],
                "same_as_rank0": bool(np.array_equal(w, rank0))}


def suite(rank: int, world: int, transport: str) -> Dict[str, Any]:
    t = {"transport": transport}
    out: Dict[str, Any] = {}
    for nesterov in (True, False):
        out[f"ref/nesterov={nesterov}"] = against_reference(
            rank, world, [3, 3, 3, 2], block_momentum=0.6, block_lr=0.9, nesterov=nesterov, bucket_elements=20, **t)
    out["ref/defaults"] = against_reference(rank, world, [4, 4], **t)
    model = make_model(0)
    for name, make in (("adamw", torch.optim.AdamW), ("rmsprop", torch.optim.RMSprop)):
        adaptive = BlockMomentum(model, make(model.parameters()), **t)
        out[f"auto/{name}"] = adaptive.block_momentum
        adaptive.close()
    out["ref/overlap"] = against_reference(rank, world, [3, 3, 3, 2], block_momentum=0.6, block_lr=0.9,
                                           overlap=True, bucket_elements=20, **t)
    # sync_steps=3: the first three steps each end a block, then blocks of 4.
    out["ref/sync_steps"] = against_reference(rank, world, [1, 1, 1, 4, 4, 2], block_momentum=0.6, block_lr=0.9,
                                              block_steps=4, sync_steps=3, bucket_elements=20, **t)
    out["misuse"] = misuse(rank, world, transport)
    out["absurd_states"] = absurd_states(rank, world, transport)
    if world > 1:
        out["ref/onebit_ef"] = against_reference(rank, world, [2, 2, 2, 2], codec="onebit", algorithm="allgather",
                                                 bucket_elements=20, **t)
        out["ref/onebit_ef_reset"] = against_reference(rank, world, [2, 2, 2, 2], codec="onebit",
                                                       algorithm="allgather", bucket_elements=20, carry_ef=False, **t)
        out.update(identical_with_every_codec(rank, world, transport))
        out["server_codec"] = server_codec(rank, world, transport)
        for codec, overlap in (("onebit", False), ("onebit", True), ("topk:density=0.1,select=sample", False)):
            out[f"resume/{codec}/overlap={overlap}"] = resume(rank, world, codec, overlap, transport)
        out["resume/onebit/sync_steps=2"] = resume(rank, world, "onebit", False, transport, sync_steps=2)
        out["diloco"] = diloco(rank, world, transport)
        out["module_buffers"] = module_buffers(rank, world, transport)
        if transport == "gradzip":
            out["without_torch_distributed"] = without_torch_distributed(rank, world)  # last: ends the group
        if transport == "torch":
            out["overlap_beside_collectives"] = overlap_beside_collectives(rank, world)
            if gradzip.BUILD["ucx"]:
                out["same_bits_over_both_transports"] = same_bits_over_both_transports(rank, world)
                out["transports_differ"] = transports_differ(rank, world)  # last: its rendezvous is left unfinished
    return out
