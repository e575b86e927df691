"""What the top-k corrections' tests run on every rank (dist_util.run_ranks):
CompressedAdamW's innovation mode and DGC's corrections in CompressedSGD
(momentum correction, momentum factor masking, local gradient clipping,
sparsity warm-up), each against a plain loop of its math that calls
gradzip's two-phase allreduce directly. Results are plain data.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Dict, List

import torch
import torch.distributed as dist

import gradzip
from cm_workers import flat, local_grads, loss_of, make_model, resume_check, same_everywhere
from gradzip.torch import CompressedAdamW, CompressedSGD
from gradzip.torch import _transports

SPEC = "topk:density=0.1"


def worker_residual(ef: Any) -> torch.Tensor:
    """The worker residual of a collective ErrorFeedback, read from its saved
    bytes as comm/engine/error_feedback.cc writes them (written out again
    here, apart from the optimizer's reader)."""
    data = bytes(ef.state_dict()["data"])
    k = struct.unpack_from("<I", data, 8)[0]
    wc = struct.unpack_from("<Q", data, 12 + k + 8 + 4 + 4 + 1)[0]
    start = 12 + k + 8 + 4 + 4 + 1 + 8 + 8
    return torch.frombuffer(bytearray(data[start:start + 4 * wc]), dtype=torch.float32)


def reference_innovation(rank: int, steps: int, warmup: int, lr: float, betas: Any, eps: float, wd: float,
                         spec: str, innovation: bool = True) -> torch.Tensor:
    """AdamW for `warmup` steps on averaged gradients; then the variance frozen
    and (innovation) each rank's own momentum m_r = beta1 m_r + (1 - beta1)
    g_r, from m at the freeze, its change d_r sent as top-k with error
    feedback, two-phase, and the shared m += the ranks' average; or
    (innovation=False) m the average of top-k of beta1 m + (1 - beta1) g_r."""
    comm = _transports.connect("torch", None, None, None)
    codec, ef = gradzip.Codec(spec), gradzip.ErrorFeedback()
    model = make_model(0)
    p = flat(model)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    b1, b2 = betas
    denom = None
    for t in range(1, steps + 1):
        torch.nn.utils.vector_to_parameters(p, model.parameters())
        gs = local_grads(model, rank, t).float()
        if t <= warmup:
            g = gs.mean(0)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            denom = (v / (1 - b2 ** t)).sqrt() + eps
            m_own = m.clone()
        else:
            x = (1 - b1) * (gs[rank] - m_own) if innovation else b1 * m + (1 - b1) * gs[rank]
            m_own = m_own + x
            comm.allreduce(x, codec, ef, op="avg", algorithm="scatter_reduce", server_codec=spec)
            m = m + x if innovation else x
        p = p * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / denom
    return p


def reference_update(rank: int, steps: int, warmup: int, lr: float, betas: Any, eps: float, wd: float,
                     spec: str, masking: bool, local_variance: bool = False) -> torch.Tensor:
    """AdamW for `warmup` steps on averaged gradients; then the variance frozen
    (d), each rank's own momentum m_r = beta1 m_r + (1 - beta1) g_r (from m
    at the freeze), its step x_r = lr (m_r / bc1) / d sent as top-k with
    error feedback, two-phase; p = p (1 - lr wd) - the ranks' average; with
    masking, m_r = 0 where this rank sent (its worker residual is 0); with
    local_variance, v_r = beta2 v_r + (1 - beta2) g_r^2 and d from it, every step."""
    comm = _transports.connect("torch", None, None, None)
    codec, ef = gradzip.Codec(spec), gradzip.ErrorFeedback()
    model = make_model(0)
    p = flat(model)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    b1, b2 = betas
    for t in range(1, steps + 1):
        torch.nn.utils.vector_to_parameters(p, model.parameters())
        gs = local_grads(model, rank, t).float()
        if t <= warmup:
            g = gs.mean(0)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            denom = (v / (1 - b2 ** t)).sqrt() + eps
            p = p * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / denom
            continue
        m = b1 * m + (1 - b1) * gs[rank]
        if local_variance:
            v = b2 * v + (1 - b2) * gs[rank] * gs[rank]
            denom = (v / (1 - b2 ** t)).sqrt() + eps
        x = m / denom * (lr / (1 - b1 ** t))
        comm.allreduce(x, codec, ef, op="avg", algorithm="scatter_reduce", server_codec=spec)
        if masking:
            m = torch.where(worker_residual(ef) == 0, torch.zeros_like(m), m)
        p = p * (1 - lr * wd) - x
    return p


def reference_dgc_sgd(rank: int, world: int, steps: int, warmup: int, lr: float, mu: float, wd: float, clip: float,
                      spec: str, masking: bool = True) -> Dict[str, Any]:
    """DGC (Lin et al. 2018, algorithm 1 with momentum correction, factor
    masking, local clipping) after `warmup` steps of momentum SGD on
    averaged gradients: u = mu u + clip_local(g) + wd p (the gradient is
    clipped, not the weight decay); the exchange's
    error feedback is DGC's accumulator v (v += u; top-k of v sent, v = 0
    there); p -= lr avg(sent); u = 0 where this rank sent."""
    comm = _transports.connect("torch", None, None, None)
    codec, ef = gradzip.Codec(spec), gradzip.ErrorFeedback()
    model = make_model(0)
    p = flat(model)
    u = torch.zeros_like(p)
    sent_counts: List[int] = []
    for t in range(1, steps + 1):
        torch.nn.utils.vector_to_parameters(p, model.parameters())
        gs = local_grads(model, rank, t).float()
        if t <= warmup:
            g = gs.mean(0)
            norm = float(torch.linalg.vector_norm(g))
            g = g * (clip / norm) if norm > clip else g
            u = mu * u + g + wd * p
            p = p - lr * u
            continue
        g = gs[rank]
        norm, limit = float(torch.linalg.vector_norm(g)), clip / math.sqrt(world)
        g = g * (limit / norm) if norm > limit else g
        u = mu * u + g + wd * p
        x = u.clone()
        comm.allreduce(x, codec, ef, op="avg", algorithm="scatter_reduce", server_codec=spec)
        sent = worker_residual(ef) == 0
        sent_counts.append(int(sent.sum()))
        if masking:
            u = torch.where(sent, torch.zeros_like(u), u)
        p = p - lr * x
    return {"params": p, "sent_counts": sent_counts}


def train(make_opt: Any, rank: int, steps: int, seed: int = None) -> Dict[str, Any]:
    model = make_model(rank if seed is None else seed)
    opt = make_opt(model.parameters())
    identical, wire = True, []
    for t in range(1, steps + 1):
        opt.zero_grad()
        loss_of(model, rank, t).backward()
        before = opt.compression_stats()["wire_bytes"]
        opt.step()
        wire.append(opt.compression_stats()["wire_bytes"] - before)
        identical &= same_everywhere(flat(model))
    return {"params": flat(model), "identical": identical, "wire": wire, "opt": opt, "model": model}


def resume(make_opt: Any, rank: int, steps: int, at: int) -> Dict[str, bool]:
    """cm_workers.resume_check with this file's train; the control keeps the
    stage and step, and loses the moments and residuals."""
    def lose(opt: Any, state: Dict[str, Any]) -> None:
        state["error_feedback"] = []
        opt.load_state_dict(state)

    return resume_check(train, make_opt, rank, steps, at, lose)

def suite(rank: int, world: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    lr, betas, eps, wd = 0.01, (0.9, 0.99), 1e-8, 0.1

    # 1. CompressedAdamW(compress="innovation") = the plain loop; the momentum
    # mode's loop is far from it (the test tells the two apart).
    mk = lambda ps: CompressedAdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd, codec=SPEC,  # noqa: E731
                                    warmup_codec=None, min_warmup_steps=3, max_warmup_steps=3,
                                    variance_refresh=0, compress="innovation")
    got = train(mk, rank, 10)
    out["innovation/identical"] = got["identical"]
    ref = reference_innovation(rank, 10, 3, lr, betas, eps, wd, SPEC)
    out["innovation/err"] = float((got["params"] - ref).abs().max())
    ref_m = reference_innovation(rank, 10, 3, lr, betas, eps, wd, SPEC, innovation=False)
    out["innovation/err_vs_momentum"] = float((got["params"] - ref_m).abs().max())

    # 1b. compress="update" (DGC's momentum correction with Adam's frozen
    # preconditioner), with and without factor masking.
    for masking in (False, True):
        mk = lambda ps: CompressedAdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd,  # noqa: E731
                                        codec=SPEC, warmup_codec=None, min_warmup_steps=3, max_warmup_steps=3,
                                        variance_refresh=0, compress="update", factor_masking=masking)
        got = train(mk, rank, 10)
        out[f"update/{masking}/identical"] = got["identical"]
        ref = reference_update(rank, 10, 3, lr, betas, eps, wd, SPEC, masking)
        out[f"update/{masking}/err"] = float((got["params"] - ref).abs().max())
        ref = reference_update(rank, 10, 3, lr, betas, eps, wd, SPEC, not masking)
        out[f"update/{masking}/err_vs_other"] = float((got["params"] - ref).abs().max())

    mk = lambda ps: CompressedAdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd, codec=SPEC,  # noqa: E731
                                    warmup_codec=None, min_warmup_steps=3, max_warmup_steps=3, variance_refresh=0,
                                    compress="update", factor_masking=True, local_variance=True)
    got = train(mk, rank, 10)
    out["update/lvar/identical"] = got["identical"]
    ref = reference_update(rank, 10, 3, lr, betas, eps, wd, SPEC, True, local_variance=True)
    out["update/lvar/err"] = float((got["params"] - ref).abs().max())
    ref = reference_update(rank, 10, 3, lr, betas, eps, wd, SPEC, True)
    out["update/lvar/err_vs_other"] = float((got["params"] - ref).abs().max())

    # 2. DGC in CompressedSGD = the plain loop (clipping active: a tight norm).
    clip = 0.5
    mk = lambda ps: CompressedSGD(ps, lr=0.05, momentum=0.8, weight_decay=0.01, codec=SPEC,  # noqa: E731
                                  warmup_steps=2, momentum_correction=True, clip_norm=clip)
    got = train(mk, rank, 9)
    out["dgc/identical"] = got["identical"]
    ref = reference_dgc_sgd(rank, world, 9, 2, 0.05, 0.8, 0.01, clip, SPEC)
    out["dgc/err"] = float((got["params"] - ref["params"]).abs().max())
    out["dgc/sent_counts"] = ref["sent_counts"]
    n = ref["params"].numel()
    out["dgc/k"] = sum(math.ceil(0.1 * (n // world + (j < n % world))) for j in range(world))
    out["dgc/err_vs_unmasked"] = float(
        (got["params"] - reference_dgc_sgd(rank, world, 9, 2, 0.05, 0.8, 0.01, clip, SPEC, masking=False)["params"])
        .abs().max())
    out["dgc/err_vs_unclipped"] = float(
        (got["params"] - reference_dgc_sgd(rank, world, 9, 2, 0.05, 0.8, 0.01, 1e9, SPEC)["params"]).abs().max())

    # 3. Sparsity warm-up: densities 0.4, 0.2 (2 steps each) then the codec's
    # 0.1; the bytes per step follow; the residual carries across (the
    # optimizer equals the plain loop only if it does).
    mk = lambda ps: CompressedAdamW(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd,  # noqa: E731
                                    codec="topk:density=0.1", warmup_codec=None, min_warmup_steps=2,
                                    max_warmup_steps=2, variance_refresh=0, compress="innovation",
                                    sparsity_warmup=4, sparsity_start=0.4, sparsity_stages=2)
    got = train(mk, rank, 9)
    out["sparsity/identical"] = got["identical"]
    out["sparsity/wire"] = got["wire"]
    out["sparsity/densities"] = [got["opt"].density_at(j) for j in range(6)]
    out["sparsity/codecs"] = sorted(got["opt"]._codecs)

    # 4. Conservation through the density changes (the error feedback's
    # residual carried, not dropped): over the calls, the decoded averages
    # plus the ranks' mean worker residual plus the server residuals / P
    # equal the ranks' mean input.
    comm = _transports.connect("torch", None, None, None)
    for carry in (True, False):
        ef, total_in, total_out = gradzip.ErrorFeedback(), torch.zeros(1000, dtype=torch.float64), 0.0
        for t, d in enumerate((0.2, 0.2, 0.05, 0.05, 0.02)):
            spec = gradzip.Codec(f"topk:density={d}").spec
            x = torch.randn(1000, generator=torch.Generator().manual_seed(10 * t + rank))
            total_in += x.double()
            if ef.bound and ef.spec != spec:
                if carry:
                    ef.respec(spec)
                else:
                    ef = gradzip.ErrorFeedback()
            comm.allreduce(x, gradzip.Codec(spec), ef, op="avg", algorithm="scatter_reduce", server_codec=spec)
            total_out = total_out + x.double()
        w, s = ef.residuals()
        ws = [torch.empty(1000, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(ws, torch.from_numpy(w.copy()).double())
        ins = [torch.empty_like(total_in) for _ in range(world)]
        dist.all_gather(ins, total_in)
        ss: List[Any] = [None] * world
        dist.all_gather_object(ss, torch.from_numpy(s.copy()).double())
        gap = total_out + torch.stack(ws).mean(0) + torch.cat(ss) / world - torch.stack(ins).mean(0)
        out[f"conserve/{carry}"] = float(gap.abs().max())

    # 5. Resume bit-identically, saved inside the sparsity warm-up (before a
    # density change) and in DGC's compressed stage.
    out["resume/innovation"] = resume(mk, rank, 10, 4)
    mk_update = lambda ps: CompressedAdamW(ps, lr=lr, codec="topk:density=0.1", warmup_codec=None,  # noqa: E731
                                           min_warmup_steps=2, max_warmup_steps=2, variance_refresh=3,
                                           compress="update", factor_masking=True, sparsity_warmup=4,
                                           sparsity_start=0.4, sparsity_stages=2)
    out["resume/update"] = resume(mk_update, rank, 12, 6)
    mk_update = lambda ps: CompressedAdamW(ps, lr=lr, codec="topk:density=0.1", warmup_codec=None,  # noqa: E731
                                           min_warmup_steps=2, max_warmup_steps=2, variance_refresh=0,
                                           compress="update", factor_masking=True, local_variance=True)
    out["resume/lvar"] = resume(mk_update, rank, 10, 5)
    mk_dgc = lambda ps: CompressedSGD(ps, lr=0.05, momentum=0.8, codec=SPEC, warmup_steps=2,  # noqa: E731
                                      momentum_correction=True, clip_norm=clip, sparsity_warmup=4,
                                      sparsity_start=0.3, sparsity_stages=2)
    out["resume/dgc"] = resume(mk_dgc, rank, 10, 5)
    for k in list(out):
        if isinstance(out[k], torch.Tensor):
            out[k] = out[k].tolist()
    return out
