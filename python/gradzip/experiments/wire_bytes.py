"""Wire bytes against payload bytes (issue 23): what each collective call of
the DDP hook, FSDP2 and BlockMomentum sends on the LM of
``python -m gradzip.experiments.lm``, against the payload bytes its
algorithm must move (the algorithm's own formula,
``gradzip.algorithm_wire_cost``: one payload per chunk or buffer).

    python -m gradzip.experiments.wire_bytes --ranks 4 --steps 3

Every call of ``Communicator.allreduce`` / ``reduce_scatter`` is recorded
(n, codec, algorithm, wire bytes) on each rank, over the torch transport
(gloo; framing headers aside). Prints a markdown table: per method, the
calls of >= 64K elements (the target: wire within 5% of the payloads) and
all calls.

    python -m gradzip.experiments.wire_bytes --exchange 209664 --ranks 16

measures instead one call of ``CompressedAdamW``'s exchange (onebit, server
onebit, scatter_reduce, over the torch transport) of that many elements on
every rank, against issue 22's bound of 2(P-1)/P payloads of the whole
buffer: each rank's bytes, their mean and the most one rank sent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from .lm import _core as lm

LARGE = 1 << 16  # elements: the calls the 5% target is about

DEFAULT_METHODS = ("onebit", "fp16", "topk:density=0.01", "qsgd:bits=4", "onebit@hook:algorithm=scatter_reduce",
                   "onebit@fsdp", "fp16@fsdp", "topk:density=0.01@fsdp", "onebit@bmuf:h=2", "topk:density=0.01@bmuf:h=2",
                   "qsgd:bits=4@bmuf:h=2", "onebit@cm:warmup=1,min=1")


def _record(calls: List[Dict[str, Any]]) -> None:
    """Wraps gradzip.Communicator's collectives to log every call in `calls`."""
    import gradzip

    cls = gradzip.Communicator
    if getattr(cls, "_wire_bytes_recorded", False):
        return
    allreduce, reduce_scatter = cls.allreduce, cls.reduce_scatter

    def numel(x: Any) -> int:
        return int(x.numel()) if hasattr(x, "numel") and callable(x.numel) else int(x.size)

    def logged_allreduce(self: Any, tensor: Any, codec: Any, state: Any, op: str = "avg", algorithm: str = "auto",
                         **kw: Any) -> Dict[str, Any]:
        stats = allreduce(self, tensor, codec, state, op, algorithm, **kw)
        server = kw.get("server_codec")
        calls.append({"n": numel(tensor), "codec": codec.spec, "server": getattr(server, "spec", server),
                      "algorithm": stats["algorithm"], "wire": stats["wire_bytes"], "ranks": self.size,
                      "rank": self.rank})
        return stats

    def logged_reduce_scatter(self: Any, input: Any, output: Any, codec: Any, state: Any, op: str = "avg",
                              **kw: Any) -> Dict[str, Any]:
        stats = reduce_scatter(self, input, output, codec, state, op, **kw)
        calls.append({"n": numel(input), "codec": codec.spec, "server": None, "algorithm": "reduce_scatter",
                      "wire": stats["wire_bytes"], "ranks": self.size, "rank": self.rank})
        return stats

    cls.allreduce, cls.reduce_scatter = logged_allreduce, logged_reduce_scatter
    cls._wire_bytes_recorded = True


def _fsdp_setup(spec: str, net: Any, settings: lm.Settings) -> lm.Method:
    from torch.distributed.fsdp import fully_shard

    from gradzip.torch import fsdp as gz_fsdp

    for block in getattr(net, "blocks", []):
        fully_shard(block)
    fully_shard(net)
    gz_fsdp.register(net, codec=spec)
    return lm.Method(net, lm._adamw(net.parameters(), settings), lambda steps: 0.0)


def _measure(methods: Sequence[str], settings: lm.Settings) -> List[Dict[str, Any]]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import gradzip

    rank = dist.get_rank()
    corpus = lm.Corpus(settings)
    calls: List[Dict[str, Any]] = []
    _record(calls)
    out = []
    for method in methods:
        net = lm.model(corpus.vocab, settings, 0)
        if method.endswith("@fsdp"):
            m = _fsdp_setup(method[:-len("@fsdp")], net, settings)
        else:
            m = lm.setup(method, net, settings)
        del calls[:]
        for step in range(settings.steps):
            x, y = corpus.batch(0, step, rank)
            m.optimizer.zero_grad()
            loss = F.cross_entropy(m.forward(x).reshape(-1, corpus.vocab), y.reshape(-1))
            loss.backward()
            m.optimizer.step()
        m.finish()
        rows = []
        for c in calls:
            cost = gradzip.algorithm_wire_cost(c["algorithm"], c["codec"], c["n"], c["ranks"], c["rank"],
                                               server_codec=c["server"])
            rows.append(dict(c, need=cost["bytes"]))
        out.append({"method": method, "rank": rank, "calls": rows,
                    "parameters": int(sum(p.numel() for p in net.parameters()))})
        dist.barrier()
    return out


def _worker(rank: int, ranks: int, port: int, methods: Sequence[str], seeds: Sequence[int],
            settings: lm.Settings, out_path: str) -> None:
    from .digits import Settings as DigitsSettings, _in_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ranks),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ranks))
    results = _in_group(rank, ranks, DigitsSettings(threads_per_rank=settings.threads_per_rank),
                        lambda: _measure(methods, settings))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def _exchange_worker(rank: int, ranks: int, port: int, methods: Sequence[str], seeds: Sequence[int],
                     n: int, out_path: str) -> None:
    """One call of CompressedAdamW's exchange on n elements; rank 0 writes every rank's wire bytes."""
    from .digits import Settings as DigitsSettings, _in_group

    def body() -> List[int]:
        import torch
        import torch.distributed as dist

        import gradzip
        from gradzip.torch import _transports

        comm = _transports.connect("torch", None, None, None)
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        stats = comm.allreduce(x, gradzip.Codec("onebit"), gradzip.ErrorFeedback(), op="avg",
                               algorithm="scatter_reduce", server_codec="onebit")
        every: List[Any] = [None] * ranks
        dist.all_gather_object(every, int(stats["wire_bytes"]))
        return every

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ranks),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ranks))
    every = _in_group(rank, ranks, DigitsSettings(threads_per_rank=1), body)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(every, f)


def exchange_row(ranks: int, n: int, timeout: float) -> Dict[str, Any]:
    """Every rank's bytes of one CompressedAdamW exchange of n elements, against 2(P-1)/P payloads."""
    import gradzip

    from .digits import _run_ranks

    every = _run_ranks(_exchange_worker, "wire_bytes", ranks, ([], [0], n), timeout)
    bound = 2 * (ranks - 1) / ranks * gradzip.Codec("onebit").max_payload_bytes(n)
    formula = [gradzip.algorithm_wire_cost("scatter_reduce", "onebit", n, ranks, r, server_codec="onebit")["bytes"]
               for r in range(ranks)]
    mean = sum(every) / ranks
    return {"ranks": ranks, "n": n, "wire": every, "formula": formula, "mean": mean, "most": max(every),
            "bound": bound, "ratio": mean / bound, "ratio_most": max(every) / bound,
            "vs_fp32_ring": 2 * (ranks - 1) / ranks * 4 * n / mean}


def summarize(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    rows = []
    for r in results:
        calls = r["calls"]
        large = [c for c in calls if c["n"] >= LARGE]

        def ratio(cs: List[Dict[str, Any]]) -> float:
            need = sum(c["need"] for c in cs)
            return sum(c["wire"] for c in cs) / need if need else float("nan")

        rows.append({"method": r["method"], "parameters": r["parameters"], "calls": len(calls),
                     "large_calls": len(large), "algorithms": sorted({c["algorithm"] for c in calls}),
                     "largest_n": max((c["n"] for c in calls), default=0),
                     "wire": sum(c["wire"] for c in calls), "need": sum(c["need"] for c in calls),
                     "ratio_large": ratio(large), "worst_large": max((c["wire"] / c["need"] for c in large
                                                                      if c["need"]), default=float("nan")),
                     "ratio_all": ratio(calls)})
    return rows


def markdown(rows: List[Dict[str, Any]], ranks: int, steps: int) -> str:
    lines = [f"{ranks} ranks, {steps} steps, rank 0, transport torch (gloo):", "",
             "| method | calls (>= 64K el.) | algorithms | largest call (el.) | wire B | payload B (formula) | "
             "wire / payload, >= 64K | worst call >= 64K | wire / payload, all calls |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['method']}` | {r['calls']} ({r['large_calls']}) | {', '.join(r['algorithms'])} | "
                     f"{r['largest_n']:,} | {r['wire']:,.0f} | {r['need']:,.0f} | {r['ratio_large']:.4f} | "
                     f"{r['worst_large']:.4f} | {r['ratio_all']:.4f} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .digits import _run_ranks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="';'-separated, as lm's --methods")
    ap.add_argument("--width", type=int, default=lm.Settings.width)
    ap.add_argument("--json", help="write the per-call records here")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--exchange", type=int, metavar="N",
                    help="measure one CompressedAdamW exchange of N elements instead (issue 22's bound)")
    a = ap.parse_args(argv)
    if a.exchange:
        row = exchange_row(a.ranks, a.exchange, a.timeout)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(row, f, indent=1)
        print(f"| {row['ranks']} | {row['mean']:,.0f} | {row['most']:,.0f} | {row['bound']:,.0f} | "
              f"{row['ratio']:.4f} | {row['ratio_most']:.4f} | {row['vs_fp32_ring']:.1f}x |")
        print("formula == measured on every rank:", [int(f) for f in row["formula"]] == row["wire"])
        return 0
    settings = lm.Settings(steps=a.steps, width=a.width, eval_every=0)
    methods = lm.split_methods(a.methods) if ";" not in a.methods else [m for m in a.methods.split(";") if m]
    results = _run_ranks(_worker, "wire_bytes", a.ranks, (methods, [0], settings), a.timeout)
    rows = summarize(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "results": results}, f, indent=1)
    print(markdown(rows, a.ranks, a.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
