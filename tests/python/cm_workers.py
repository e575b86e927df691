"""What the compressed-momentum tests run on every rank (dist_util.run_ranks).

Each rank trains the same small model on batches of its own; the reference
is the optimizers' math written out plainly in float64 from an all_gather of
the ranks' local gradients. Results are plain data.
"""

from __future__ import annotations

import copy
import io
import math
from typing import Any, Dict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradzip
from gradzip.torch import CompressedAdamW, CompressedSGD

LOSSY = ("onebit", "topk:density=0.1")


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def make_big_model(seed: int) -> torch.nn.Module:
    """93k parameters: payload headers no longer dominate the bytes."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 300), torch.nn.Tanh(), torch.nn.Linear(300, 300), torch.nn.Tanh(),
                               torch.nn.Linear(300, 3))


def loss_of(model: Any, rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
    return torch.nn.functional.mse_loss(model(x), y)


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def same_everywhere(x: torch.Tensor) -> bool:
    everyone = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, x)
    return all(torch.equal(everyone[0], e) for e in everyone)


def local_grads(model: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    """Every rank's own gradient at the model's parameters, as a (P, n) float64 tensor."""
    model.zero_grad()
    loss_of(model, rank, step).backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(g) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, g)
    return torch.stack(everyone).double()


def reference_adamw(rank: int, steps: int, warmup: int, lr: float, betas: Any, eps: float, wd: float,
                    refresh: Any = ()) -> torch.Tensor:
    """AdamW for `warmup` steps (and at the `refresh` steps) on averaged
    gradients, otherwise frozen variance and the momentum averaged over ranks
    (exactly: codec none), in float64. v is bias-corrected by the updates it
    holds (1 - beta2^count: at a refresh, fewer than the step)."""
    model = make_model(0)
    p = flat(model).double()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    b1, b2 = betas
    denom, count = None, 0
    for t in range(1, steps + 1):
        torch.nn.utils.vector_to_parameters(p.float(), model.parameters())
        gs = local_grads(model, rank, t)
        if t <= warmup or t in refresh:
            g = gs.mean(0)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            count += 1
            d = (v / (1 - b2 ** count)).sqrt() + eps
            if t >= warmup:
                denom = d
        else:
            m = (b1 * m + (1 - b1) * gs).mean(0)  # each rank's momentum, averaged
            d = denom
        p = p * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / d
    return p


def reference_sgd(rank: int, steps: int, lr: float, mu: float, wd: float) -> torch.Tensor:
    model = make_model(0)
    p = flat(model).double()
    m = torch.zeros_like(p)
    for t in range(1, steps + 1):
        torch.nn.utils.vector_to_parameters(p.float(), model.parameters())
        gs = local_grads(model, rank, t)
        m = (mu * m + gs + wd * p).mean(0)  # linear: the same whether averaged before or after
        p = p - lr * m
    return p


def train(opt_fn: Any, rank: int, steps: int, ddp: bool, seed: int = None, make: Any = make_model) -> Dict[str, Any]:
    """Trains make_model (rank-dependent init: the optimizer broadcasts rank 0's) for `steps`."""
    model = make(rank if seed is None else seed)
    net = DDP(model) if ddp else model
    opt = opt_fn(net.parameters())
    if ddp:
        opt.register_ddp(net)
    identical = True
    for t in range(1, steps + 1):
        opt.zero_grad()
        loss_of(net, rank, t).backward()
        opt.step()
        identical &= same_everywhere(flat(model))
    return {"params": flat(model), "identical": identical, "stats": opt.compression_stats(), "opt": opt,
            "model": model}


def resume_check(train_fn: Any, make_opt: Any, rank: int, steps: int, at: int, lose_state: Any) -> Dict[str, bool]:
    """`steps` steps straight (train_fn(make_opt, rank, steps)) against `at`
    steps, a checkpoint of model and optimizer (through torch.save), a fresh
    model and optimizer, the rest: "same" bits; and a control whose fresh
    optimizer lose_state(opt, saved optimizer state) sets up without its
    moments and residuals: "control_differs"."""
    straight = train_fn(make_opt, rank, steps)["params"]
    part = train_fn(make_opt, rank, at)
    buf = io.BytesIO()
    torch.save({"model": part["model"].state_dict(), "opt": part["opt"].state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)

    def resumed(restore_opt: bool) -> torch.Tensor:
        model = make_model(rank)
        opt = make_opt(model.parameters())
        model.load_state_dict(saved["model"])
        if restore_opt:
            opt.load_state_dict(copy.deepcopy(saved["opt"]))
        else:
            lose_state(opt, copy.deepcopy(saved["opt"]))
        for t in range(at + 1, steps + 1):
            opt.zero_grad()
            loss_of(model, rank, t).backward()
            opt.step()
        return flat(model)

    return {"same": bool(torch.equal(resumed(True), straight)),
            "control_differs": not torch.equal(resumed(False), straight)}


def suite(rank: int, world: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    lr, betas, eps, wd = 0.01, (0.9, 0.99), 1e-8, 0.1

    # 1. The math, codec none, over DDP: 4 full-precision steps, then 6 compressed.
    adamw = lambda ps: CompressedAdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd, codec="none",  # noqa: E731
                                       warmup_codec=None, min_warmup_steps=4, max_warmup_steps=4)
    got = train(adamw, rank, 10, ddp=True)
    ref = reference_adamw(rank, 10, 4, lr, betas, eps, wd)
    out["adamw_none/err"] = float((got["params"].double() - ref).abs().max())
    out["adamw_none/moved"] = float((ref - flat(make_model(0)).double()).abs().max())
    out["adamw_none/warmup"] = got["stats"]["warmup_steps"]
    # The same reference with the variance never frozen must not match
    # (the test can tell the stages apart).
    ref_nofreeze = reference_adamw(rank, 10, 10, lr, betas, eps, wd)
    out["adamw_none/err_vs_unfrozen"] = float((got["params"].double() - ref_nofreeze).abs().max())

    # Variance refreshes at 0/1 Adam's doubling intervals: R=2 after a
    # warm-up of 3 is steps 5 and 9.
    got = train(lambda ps: CompressedAdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd, codec="none",
                                           warmup_codec=None, min_warmup_steps=3, max_warmup_steps=3,
                                           variance_refresh=2), rank, 10, ddp=True)
    ref = reference_adamw(rank, 10, 3, lr, betas, eps, wd, refresh=(5, 9))
    out["adamw_refresh/err"] = float((got["params"].double() - ref).abs().max())
    ref = reference_adamw(rank, 10, 3, lr, betas, eps, wd)
    out["adamw_refresh/err_vs_none"] = float((got["params"].double() - ref).abs().max())
    # The refresh's bias correction counts v's own updates (the step's,
    # 1 - beta2^t with t = 5, 9 where v holds 4 and 5 updates, is refused
    # by the reference above).
    out["adamw_refresh/v_count"] = getattr(got["opt"], "_v_count", None)

    # Full precision only = torch.optim.AdamW on DDP.
    got = train(lambda ps: CompressedAdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd, codec="onebit",
                                           warmup_codec=None, min_warmup_steps=100, max_warmup_steps=100),
                rank, 6, ddp=True, seed=0)
    model = make_model(0)
    net = DDP(model)
    torch_opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for t in range(1, 7):
        torch_opt.zero_grad()
        loss_of(net, rank, t).backward()
        torch_opt.step()
    out["adamw_warmup_vs_torch/err"] = float((got["params"] - flat(model)).abs().max())

    sgd = lambda ps: CompressedSGD(ps, lr=0.05, momentum=0.8, weight_decay=0.01, codec="none",  # noqa: E731
                                   warmup_steps=3)
    got = train(sgd, rank, 8, ddp=False)
    out["sgd_none/err"] = float((got["params"].double() - reference_sgd(rank, 8, 0.05, 0.8, 0.01)).abs().max())

    # 2. Lossy codecs: ranks identical after every step, the bytes of the two-phase path.
    for spec in LOSSY:
        got = train(lambda ps: CompressedAdamW(ps, lr=lr, codec=spec, min_warmup_steps=2, max_warmup_steps=2),
                    rank, 5, ddp=True, make=make_big_model)
        n = got["params"].numel()
        codec = gradzip.Codec(spec)
        out[f"lossy/{spec}/identical"] = got["identical"]
        out[f"lossy/{spec}/wire_per_step"] = got["stats"]["compressed_wire_bytes_per_step"]
        # 2(P-1)/P payloads: (P-1) chunks of n/P each way, each chunk a payload of its own.
        chunk = -(-n // world)
        out[f"lossy/{spec}/bound"] = 2 * (world - 1) * codec.max_payload_bytes(chunk)
        out[f"lossy/{spec}/fp32_per_step"] = 4.0 * n * 2 * (world - 1) / world
    got = train(lambda ps: CompressedSGD(ps, lr=0.05, codec="onebit", warmup_steps=0), rank, 5, ddp=False)
    out["sgd_onebit/identical"] = got["identical"]

    # 3. The warm-up criterion: a loose tolerance ends at the first check after
    # min_warmup_steps, a zero tolerance only at max_warmup_steps.
    for tol, key in ((10.0, "loose"), (0.0, "strict")):
        got = train(lambda ps: CompressedAdamW(ps, lr=lr, codec="onebit", min_warmup_steps=3, max_warmup_steps=9,
                                               check_every=2, variance_tolerance=tol), rank, 12, ddp=True)
        out[f"freeze/{key}"] = got["stats"]["warmup_steps"]

    # 3b. The warm-up codec keeps each coordinate's magnitude, so the frozen
    # variance is the gradients': a gradient spanning 2^0..2^-24 within one
    # block (of 512; 6 of them, so that each rank's chunk holds whole ones),
    # v after an 8-step warm-up against the exact one (float64). The
    # default (fp8 e5m2) holds every coordinate within 25%; e4m3 (the
    # former default, 2^17 per block) loses the small ones.
    scales = (2.0 ** -torch.linspace(0, 24, 512, dtype=torch.float64)).repeat(6)
    for key, kw in (("default", {}), ("e4m3", {"warmup_codec": "fp8"})):
        w = torch.nn.Parameter(torch.zeros(scales.numel()))
        opt = CompressedAdamW([w], lr=1e-3, codec="onebit", min_warmup_steps=8, max_warmup_steps=8, **kw)
        b2, v = opt._betas()[1], torch.zeros_like(scales)
        for t in range(1, 9):
            wave = 1.0 + 0.5 * math.sin(t)
            w.grad = (scales * wave * (1.0 + 0.3 * (rank - 1))).float()  # the ranks' mean: scales * wave
            opt.step()
            v = b2 * v + (1 - b2) * (scales * wave) ** 2
        ratio = (opt._v.double() / v).sqrt()
        out[f"warmup_v/{key}/off"] = float(((ratio < 0.8) | (ratio > 1.25)).double().mean())
        out[f"warmup_v/{key}/frozen"] = opt.compressing

    # 4. Resume: 12 steps straight vs `at`, save, a fresh model and optimizer,
    # the rest: saved in the compressed stage (onebit: the momentum's error
    # feedback) and in the fp8 warm-up (topk: the warm-up's error feedback).
    for spec, at, warm in (("onebit", 7, 3), ("topk:density=0.1", 3, 5)):
        mk = lambda ps: CompressedAdamW(ps, lr=lr, codec=spec, min_warmup_steps=warm,  # noqa: E731
                                        max_warmup_steps=warm)

        def lose(opt: Any, _saved: Any) -> None:  # the control: moments and residuals lost
            opt._step, opt._frozen_at = at, (warm if at > warm else 0)
            opt._denom = torch.ones_like(opt._m)

        resumed = resume_check(lambda mk, r, n: train(mk, r, n, ddp=False), mk, rank, 12, at, lose)
        out[f"resume/{spec}/same"], out[f"resume/{spec}/control_differs"] = resumed["same"], resumed["control_differs"]

    out["stats_keys"] = sorted(got.get("stats", {}).keys()) if isinstance(got, dict) else []
    for k in list(out):
        if isinstance(out[k], torch.Tensor):
            out[k] = out[k].tolist()
    return out
