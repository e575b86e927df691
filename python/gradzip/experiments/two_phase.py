"""Why scatter_reduce's second (server) phase needs a fine codec: a measurement on digits.

The allreduce algorithms are replayed in one process with gradzip's codecs
(`AllgatherModel`, `ScatterReduceModel`: the documented algorithms, bit for
bit; tests/python/test_comm.py checks them against the C++ allreduce). The
digits model trains with fp32 on the batches and weights of
`gradzip.experiments.digits`, and every step's per-rank gradients go through
each algorithm (with its own error feedback), so all see the same inputs. For
each, a least-squares fit over all steps and elements

    out_t ~ sum_k h_k g_(t-k)        (g: the exact average, k = 0..12)

says how much of a step's gradient arrives in that step (h_0), how much in
total (sum h: below 1 is a bias, a smaller step), how late on average
(sum k h_k / sum h, in steps), and what share of the output the fit leaves
unexplained (noise).

    python -m gradzip.experiments.two_phase --ranks 4 --seed 2
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

import gradzip


def chunks(n: int, ranks: int, codec: str = "none") -> List[tuple]:
    """(offset, count) of each rank's chunk in scatter_reduce with `codec`
    (comm/algorithms/algorithm.h's chunk_range on the codec's blocks)."""
    from gradzip._core import scatter_reduce_chunks

    return [tuple(c) for c in scatter_reduce_chunks(n, ranks, codec)]


class AllgatherModel:
    """allgather: every rank's payload (worker EF) decoded by every rank, summed, x 1/P."""

    def __init__(self, spec: str, ranks: int) -> None:
        self.codec = gradzip.Codec(spec)
        self.ef = [gradzip.ErrorFeedback() for _ in range(ranks)]
        self.ranks = ranks

    def __call__(self, grads: Sequence[np.ndarray]) -> np.ndarray:
        out = np.zeros(grads[0].size, np.float32)
        for g, ef in zip(grads, self.ef):
            self.codec.decode_accumulate(self.codec.encode(g, ef), out)
        return out * np.float32(1.0 / self.ranks)


class ScatterReduceModel:
    """scatter_reduce: chunk j of every rank encoded (worker EF per chunk) and
    summed in rank order; the sum re-encoded with the server codec (server EF)
    and decoded by every rank, x 1/P. server_spec None: the default
    (gradzip.server_codec_spec: fp16 for onebit, else the codec)."""

    def __init__(self, spec: str, ranks: int, server_spec: Optional[str] = None) -> None:
        self.codec = gradzip.Codec(spec)
        if server_spec is None:
            server_spec = gradzip.server_codec_spec(spec)
        if not self.codec.error_feedback:
            server_spec += ("," if ":" in server_spec else ":") + "ef=off"
        self.server = gradzip.Codec(server_spec)
        self.worker_ef = [[gradzip.ErrorFeedback() for _ in range(ranks)] for _ in range(ranks)]  # [rank][chunk]
        self.server_ef = [gradzip.ErrorFeedback() for _ in range(ranks)]
        self.ranks = ranks

    def __call__(self, grads: Sequence[np.ndarray]) -> np.ndarray:
        out = np.zeros(grads[0].size, np.float32)
        for j, (offset, count) in enumerate(chunks(out.size, self.ranks, self.codec.spec)):
            chunk_sum = np.zeros(count, np.float32)
            for r, g in enumerate(grads):
                part = np.ascontiguousarray(g[offset:offset + count])
                self.codec.decode_accumulate(self.codec.encode(part, self.worker_ef[r][j]), chunk_sum)
            decoded = self.server.decode(self.server.encode(chunk_sum, self.server_ef[j]), chunk_sum.size)
            out[offset:offset + count] = decoded * np.float32(1.0 / self.ranks)
        return out


def _variants(spec: str, ranks: int) -> Dict[str, object]:
    return {
        "allgather": AllgatherModel(spec, ranks),
        "scatter_reduce (fp16 sums)": ScatterReduceModel(spec, ranks),
        "scatter_reduce (onebit sums)": ScatterReduceModel(spec, ranks, "onebit"),
        "scatter_reduce (onebit:block=64 sums)": ScatterReduceModel(spec, ranks, "onebit:block=64"),
        "scatter_reduce (onebit sums, ef=off)": ScatterReduceModel(spec, ranks, "onebit:ef=off"),
    }


def measure(ranks: int = 4, seed: int = 0, spec: str = "onebit", lags: int = 12,
            epochs: Optional[int] = None) -> List[Dict[str, object]]:
    """One row per algorithm: h (lags 0..lags), gain, delay, noise, and the mean per-step
    relative error ||out - g|| / ||g||. epochs: default digits' (40)."""
    import torch

    from .digits import Settings, _data, _model

    settings = Settings() if epochs is None else Settings(epochs=epochs)
    x_train, _, y_train, _ = _data()
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    torch.set_num_threads(1)
    model = _model(settings.hidden, seed)
    params = list(model.parameters())  # the order the hook compresses in (DDP's first bucket)
    opt = torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum)
    variants = _variants(spec, ranks)
    per_step = settings.batch_per_rank * ranks
    exact_steps, outs = [], {k: [] for k in variants}
    for epoch in range(settings.epochs):
        order = np.random.default_rng(seed * 1000 + epoch).permutation(len(x_train))
        for i in range(len(x_train) // per_step):
            grads = []
            for r in range(ranks):
                idx = order[i * per_step + r * settings.batch_per_rank:][:settings.batch_per_rank]
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
                grads.append(torch.cat([p.grad.reshape(-1) for p in params]).numpy().copy())
            exact = np.mean(grads, axis=0, dtype=np.float32)
            exact_steps.append(exact)
            for name, run in variants.items():
                outs[name].append(run(grads))
            offset = 0
            for p in params:
                p.grad.copy_(torch.from_numpy(exact[offset:offset + p.numel()]).reshape(p.shape))
                offset += p.numel()
            opt.step()
    g = np.array(exact_steps, np.float64)
    steps = len(g)
    gram = g @ g.T
    rows_t = range(lags, steps)
    normal = np.array([[sum(gram[t - k, t - m] for t in rows_t) for m in range(lags + 1)] for k in range(lags + 1)])
    rows = []
    for name, got in outs.items():
        o = np.array(got, np.float64)
        cross = g @ o.T
        h = np.linalg.solve(normal, [sum(cross[t - k, t] for t in rows_t) for k in range(lags + 1)])
        fit = [sum(h[k] * g[t - k] for k in range(lags + 1)) for t in rows_t]
        noise = sum(np.sum((o[t] - f) ** 2) for t, f in zip(rows_t, fit)) / sum(np.sum(o[t] ** 2) for t in rows_t)
        step_error = np.mean([np.linalg.norm(o[t] - g[t]) / np.linalg.norm(g[t]) for t in range(steps)])
        rows.append({"algorithm": name, "h": [float(x) for x in h], "gain": float(h.sum()),
                     "delay": float(np.dot(np.arange(lags + 1), h) / h.sum()), "noise": float(noise),
                     "step_error": float(step_error)})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--codec", default="onebit", help="the first phase's codec (default onebit)")
    args = ap.parse_args(argv)
    rows = measure(args.ranks, args.seed, args.codec)
    print(f"digits, {args.ranks} ranks, seed {args.seed}, codec {args.codec}: out_t ~ sum_k h_k g_(t-k)\n")
    print("| algorithm | h_0 | h_1 | h_2 | gain (sum h) | mean delay (steps) | noise | step error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        h = r["h"]
        print(f"| {r['algorithm']} | {h[0]:.2f} | {h[1]:.2f} | {h[2]:.2f} | {r['gain']:.2f} | {r['delay']:.2f} | "
              f"{r['noise']:.2f} | {r['step_error']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
