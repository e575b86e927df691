"""Time to accuracy over emulated links: the LM experiment's ``--link`` mode.

For each ``--link``, lm.py starts itself as one job of ``gradzip-run -n RANKS
--link RATE -- python -m gradzip.experiments.lm --launched ...`` (root: each
rank in its own network namespace behind a tc-shaped link), every method and
seed in that job. Each rank first times fp32 DDP's step with and without its
gradient exchange (the exchange fraction: how much of the step the link
takes), then trains every method as lm.py does, rank 0 recording its
training seconds at each evaluation (evaluations paused).

The target is fp32 DDP's final validation loss (same link, same seed). A
method's time to it is rank 0's training seconds at its first evaluation at
or below it (no interpolation), "not reached" when none is. fp32's own time
is found the same way: its total time, unless an earlier evaluation was
already at or below its final loss. Compression warm-ups count in the
seconds and the bytes: they are training steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _core as lm

#: issue 33's methods: DDP, torch's fp16 hook, the backend's default policy, the hook's defaults, CompressedAdamW.
TTA_METHODS = ["fp32", "torch-fp16", "backend", "onebit", "onebit@cm"]
LOCAL = "local"          # --link local: gradzip-run without emulated links
EXCHANGE_BOUND = 0.75    # issue 33's second rate: where the exchange takes >= 75% of fp32 DDP's step


# -- on every rank --------------------------------------------------------------


def exchange_fraction(corpus: Any, settings: lm.Settings, steps: int) -> Dict[str, float]:
    """fp32 DDP's step on this job's links, timed on rank 0: `steps` steps with the
    gradient allreduce, `steps` without it (DDP's no_sync: forward, backward and
    AdamW alone). The difference is the exchange DDP could not hide behind the
    backward pass; its share of the full step is the exchange fraction."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, dev = dist.get_rank(), torch.device(settings.device)
    net = lm.model(corpus.vocab, settings, 0).to(dev)
    m = lm.setup("fp32", net, settings)

    def step(i: int, exchange: bool) -> None:
        x, y = (z.to(dev) for z in corpus.batch(0, i, rank))
        m.optimizer.zero_grad()
        with contextlib.nullcontext() if exchange else m.forward.no_sync():
            F.cross_entropy(m.forward(x).reshape(-1, corpus.vocab), y.reshape(-1)).backward()
        m.optimizer.step()

    def per_step(exchange: bool) -> float:
        dist.barrier()  # start together: a rank still busy would show up as rank 0's wait
        t0 = lm.clock(dev)
        for i in range(steps):
            step(i, exchange)
        return (lm.clock(dev) - t0) / steps

    step(0, True)  # DDP's first step builds its buckets; keep it out of both
    compute, full = per_step(False), per_step(True)
    return {"steps": steps, "step_seconds": full, "compute_seconds": compute,
            "exchange_fraction": 1.0 - compute / full}


# -- time to the target -----------------------------------------------------------


def time_curve(result: Dict[str, Any]) -> List[Tuple[int, float, float]]:
    """(step, training seconds, validation loss) at each evaluation of one run."""
    return [(step, t, loss) for (step, loss), t in zip(result["curve"], result["curve_seconds"])]


def time_to(curve: Sequence[Sequence[float]], target: float) -> Optional[Tuple[int, float]]:
    """(step, seconds) of the first point of a time_curve at or below `target`; None when none is."""
    return next(((int(step), t) for step, t, loss in curve if loss <= target), None)


def summarize(results: List[Dict[str, Any]], within: float = 0.0) -> List[Dict[str, Any]]:
    """lm.summarize's rows plus, per method: seconds and steps to fp32's final loss
    (mean over the seeds; None unless every seed reached it), how many seeds
    reached it, and the speedup against fp32's own time. Each run gains its
    time_curve, target and seconds/steps_to_target. `within` (percent) moves the
    target that much above fp32's final loss (e.g. fp32's own seed spread: a loss
    no seed of fp32 can tell from its own)."""
    targets = {r["seed"]: r["val_loss"] * (1.0 + within / 100.0) for r in results if r["method"] == "fp32"}
    if not targets:
        raise ValueError("time to accuracy needs fp32 among the methods: its final validation loss is the target")
    for r in results:
        r["time_curve"] = time_curve(r)
        r["target"] = targets.get(r["seed"])
        hit = None if r["target"] is None else time_to(r["time_curve"], r["target"])
        r["steps_to_target"], r["seconds_to_target"] = hit if hit else (None, None)
    rows = lm.summarize(results)
    for row in rows:
        rs = [r for r in results if r["method"] == row["method"] and r["target"] is not None]
        reached = [r for r in rs if r["seconds_to_target"] is not None]
        every = bool(rs) and len(reached) == len(rs)
        row["reached"], row["runs"] = len(reached), len(rs)
        row["seconds_to_target"] = statistics.mean(r["seconds_to_target"] for r in rs) if every else None
        row["steps_to_target"] = statistics.mean(r["steps_to_target"] for r in rs) if every else None
    base = next(row for row in rows if row["method"] == "fp32")["seconds_to_target"]
    for row in rows:
        row["speedup_vs_fp32"] = base / row["seconds_to_target"] if base and row["seconds_to_target"] else None
    return rows


# -- reporting ------------------------------------------------------------------


def _exchange_line(link: Dict[str, Any]) -> str:
    e = link["exchange"]
    if not e:
        return f"| {link['link']} | | | | |"
    bound = "yes" if e["exchange_fraction"] >= EXCHANGE_BOUND else "no"
    return (f"| {link['link']} | {1e3 * e['step_seconds']:.1f} | {1e3 * e['compute_seconds']:.1f} | "
            f"{100 * e['exchange_fraction']:.0f}% | {bound} |")


def markdown(links: List[Dict[str, Any]], settings: lm.Settings, seeds: Sequence[int], ranks: int) -> str:
    """The exchange fraction per link (where measured), then per link the time-to-target table."""
    lines: List[str] = []
    measured = [link["exchange"] for link in links if link["exchange"]]
    if measured:
        lines += [f"fp32 DDP's step per link, {ranks} ranks, rank 0's clock: with the exchange, and without it "
                  f"(DDP's no_sync); {measured[0]['steps']} steps each.", "",
                  f"| link | fp32 DDP step (ms) | without the exchange (ms) | exchange | "
                  f">= {100 * EXCHANGE_BOUND:.0f}% |", "|---|---:|---:|---:|---|"]
        lines += [_exchange_line(link) for link in links]
    for link in links:
        rows = link.get("summary")
        if not rows:
            continue
        targets = ", ".join(f"{r['target']:.4f} (seed {r['seed']})" for r in link["results"] if r["method"] == "fp32")
        within = link.get("within", 0.0)
        what = f"fp32 DDP's final validation loss + {within:g}%" if within else "fp32 DDP's final validation loss"
        lines += [""] if lines else []
        lines += [f"### Link {link['link']}", "",
                  lm.describe(rows, settings, seeds) + f" Target: {what}, {targets}. "
                  "Seconds: rank 0's training time (evaluations left out; warm-ups included), to the first "
                  "evaluation at or below the target.", "",
                  "| method | final val loss | vs fp32 | wire MB/rank | wire ratio vs fp32 | train s "
                  "| s to fp32's final loss | steps to it | speedup vs fp32 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            delta = "" if r["method"] == "fp32" else f"{r['vs_fp32_percent']:+.2f}%"
            if r["seconds_to_target"] is None:
                to, steps = f"not reached ({r['runs'] - r['reached']} of {r['runs']} seeds)", ""
            else:
                to, steps = f"{r['seconds_to_target']:.1f}", f"{r['steps_to_target']:.0f}"
            speed = "" if r["speedup_vs_fp32"] is None else f"{r['speedup_vs_fp32']:.2f}x"
            lines.append(f"| {r['method']} | {r['val_loss']:.4f} | {delta} | {r['wire_bytes'] / 1e6:.1f} | "
                         f"{r['wire_ratio']:.1f}x | {r['seconds']:.1f} | {to} | {steps} | {speed} |")
    return "\n".join(lines) + "\n"


def plot(links: List[Dict[str, Any]], path: str) -> None:
    """Validation loss against training seconds, one panel per link, fp32's final loss dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = [link for link in links if link.get("results")]
    fig, axes = plt.subplots(1, len(trained), figsize=(7 * len(trained), 4.5), squeeze=False)
    for ax, link in zip(axes[0], trained):
        lm.draw_curves(ax, link["results"], seconds=True)
        for r in link["results"]:
            if r["method"] == "fp32":
                ax.axhline(r["val_loss"], color="gray", linestyle="--", lw=0.8)
        e = link["exchange"]
        share = f", exchange {100 * e['exchange_fraction']:.0f}% of fp32's step" if e else ""
        ax.set_title(f"link {link['link']}, {link['results'][0]['ranks']} ranks{share}; dashed: fp32's final loss",
                     fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_launched(runs: Sequence[Tuple[str, int, Optional[float]]], settings: lm.Settings,
                 exchange_steps: int = 0) -> Optional[Dict[str, Any]]:
    """Like :func:`run`, as one rank of a job that a launcher started (gradzip-run,
    torchrun: rendezvous from the environment), e.g. on gradzip-run's emulated links.
    exchange_steps > 0 first measures fp32 DDP's exchange fraction there
    (_tta.exchange_fraction). Returns {"results", "exchange"} on rank 0, None on the others."""
    from ..digits import Settings as DigitsSettings, _in_group

    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    def body() -> Dict[str, Any]:
        exchange = exchange_fraction(lm.Corpus(settings), settings, exchange_steps) if exchange_steps else None
        return {"results": lm._train_all(runs, settings) if runs else [], "exchange": exchange}

    out = _in_group(rank, ranks, DigitsSettings(threads_per_rank=settings.threads_per_rank), body)
    return out if rank == 0 else None


# -- the jobs -------------------------------------------------------------------


def launch(runner: str, link: str, runs: Sequence[Tuple[str, int, Optional[float]]], settings: lm.Settings,
           args: argparse.Namespace) -> Dict[str, Any]:
    """One gradzip-run job on `link`; returns rank 0's JSON ({"settings", "results", "exchange"})."""
    from ...sweep._process import stop as _stop

    with tempfile.TemporaryDirectory(prefix="gradzip-lm-") as tmp:
        out = os.path.join(tmp, "out.json")
        cmd = [runner, "-n", str(args.ranks), "--grace", "10"] + ([] if link == LOCAL else ["--link", link])
        cmd += ["--", sys.executable, "-m", "gradzip.experiments.lm", "--launched", "--json", out,
                "--exchange-steps", str(args.exchange_steps)]
        cmd += ["--runs", json.dumps([list(r) for r in runs])] if runs else ["--exchange-only"]
        cmd += lm.settings_args(settings)
        print(f"lm: {' '.join(cmd)}", file=sys.stderr, flush=True)
        # The ranks' lines go to stderr (fd 2, whatever sys.stderr is): stdout keeps the table alone.
        proc = subprocess.Popen(cmd, stdout=2, stderr=2, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise TimeoutError(f"lm --link {link}: not done after {args.timeout:.0f} s") from None
        except BaseException:
            _stop(proc)
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"lm --link {link}: gradzip-run exited with code {proc.returncode}")
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def tuned_rates(path: str, methods: Sequence[str]) -> Dict[str, float]:
    """Each method's best peak learning rate from a ``--tune`` run's JSON (best_lr)."""
    with open(path, encoding="utf-8") as f:
        best = json.load(f).get("best_lr") or {}
    missing = [m for m in methods if m not in best]
    if missing:
        raise SystemExit(f"lm --tuned {path}: no tuned learning rate for {', '.join(missing)} "
                         f"(it has {', '.join(best) or 'none'})")
    return {m: float(best[m]) for m in methods}


def main(args: argparse.Namespace, settings: lm.Settings, seeds: Sequence[int],
         lrs: Sequence[float] = ()) -> int:
    """lm.py --link: one job per link, then the tables, the JSON and the plot. Each
    method trains at its --tuned best learning rate, else at every --lr (one, usually)."""
    from ...sweep._registry import find_program

    methods = [] if args.exchange_only else lm.split_methods(args.methods or ",".join(TTA_METHODS))
    rates = tuned_rates(args.tuned, methods) if getattr(args, "tuned", None) else None
    runs = [(m, s, lr) for s in seeds for m in methods
            for lr in ([rates[m]] if rates else (lrs or [settings.lr]))]
    if methods and "fp32" not in methods:
        print("lm --link: the methods need fp32 (its final validation loss is the target)", file=sys.stderr)
        return 2
    if any(link != LOCAL for link in args.link) and os.geteuid() != 0:
        print("lm --link: emulated links need root (gradzip-run makes network namespaces); or --link local",
              file=sys.stderr)
        return 2
    runner, looked = find_program("gradzip-run")
    if runner is None:
        print(f"lm --link: cannot find gradzip-run (looked in: {'; '.join(looked)}); set GRADZIP_BIN_DIR",
              file=sys.stderr)
        return 2
    links: List[Dict[str, Any]] = []
    for link in args.link:
        data = launch(runner, link, runs, settings, args)
        entry: Dict[str, Any] = {"link": link, "exchange": data["exchange"]}
        if methods:
            entry["summary"] = summarize(data["results"], args.target_within)
            entry["within"] = args.target_within
            entry["results"] = data["results"]
        links.append(entry)
        if args.json:  # after every link: a long run keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"settings": asdict(settings), "ranks": args.ranks, "seeds": list(seeds),
                           "methods": methods, "links": links}, f, indent=1)
    text = markdown(links, settings, seeds, args.ranks)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if args.plot and methods:
        plot(links, args.plot)
    return 0
