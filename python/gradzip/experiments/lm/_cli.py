"""``python -m gradzip.experiments.lm``: the experiment's command line (the
package doc says what it runs)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from typing import List, Optional, Sequence

from . import _tta
from .._tune import LOSS, Row, parse_lrs, tune
from ._core import CORPORA, DEFAULT_METHODS, Settings, describe_settings, markdown, plateau, plot, run_list, split_methods, \
    summarize, tune_plot

DESCRIPTION = ("Training quality at high compression on a transformer: a small GPT-style character-level language "
               "model, trained with AdamW on real text, on several CPU ranks over gloo.")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m gradzip.experiments.lm", description=DESCRIPTION)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--methods", help=f"default: {','.join(DEFAULT_METHODS)}; with --link: fp32, torch-fp16, "
                                      "backend, onebit, onebit@cm")
    ap.add_argument("--steps", type=int, default=Settings.steps)
    ap.add_argument("--batch", type=int, default=Settings.batch_per_rank, help="sequences per rank per step")
    ap.add_argument("--width", type=int, default=Settings.width, help="model width (64: 0.21M parameters, 96: 0.46M)")
    ap.add_argument("--layers", type=int, default=Settings.layers)
    ap.add_argument("--heads", type=int, default=Settings.heads)
    ap.add_argument("--context", type=int, default=Settings.context, help="characters per sequence")
    ap.add_argument("--device", default=Settings.device, help="cpu, or cuda (every rank on its current GPU)")
    ap.add_argument("--eval-every", type=int, default=Settings.eval_every)
    ap.add_argument("--eval-sequences", type=int, default=Settings.eval_sequences,
                    help="validation windows of --context characters, spread over the validation text")
    ap.add_argument("--corpus", default=Settings.corpus, choices=CORPORA,
                    help="licenses: Debian's license texts (240 kB); stdlib: this Python's standard library "
                         "(about 10 MB), for runs long enough to converge without seeing the text dozens of times")
    ap.add_argument("--lr-warmup", type=int, default=Settings.lr_warmup,
                    help="steps of linear warm-up to the peak learning rate (then cosine to a tenth of it)")
    ap.add_argument("--lr", default=f"{Settings.lr:g}",
                    help="AdamW's peak learning rate; a comma-separated list (every method at every rate) or "
                         "grid:CENTER[:POINTS] (POINTS rates a factor 2 apart, default 5)")
    tune = ap.add_argument_group("tuning before comparing (gradzip.experiments._tune)")
    tune.add_argument("--tune", action="store_true",
                      help="every method over the --lr grid on the first seed (a best at the grid's edge widens "
                           "it), then every seed at each method's best and at fp32's best; tables against fp32 "
                           "at its best learning rate")
    tune.add_argument("--records", help="with --tune: every finished run, one JSON line each; a rerun with the "
                                        "same file trains only what it lacks")
    tune.add_argument("--max-widen", type=int, default=3, help="with --tune: most points added past an edge")
    ap.add_argument("--json", help="write the per-run results (with curves) and the summary here")
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--plot", help="write the validation-loss curves here (PNG; needs matplotlib)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds (with --link: per link)")
    tta = ap.add_argument_group("time to accuracy over emulated links (_tta.py)")
    tta.add_argument("--link", action="append",
                     help="train under gradzip-run -n RANKS --link RATE[,DELAY] (root), one job per --link "
                          "(repeatable); 'local': gradzip-run without emulated links")
    tta.add_argument("--exchange-steps", type=int, default=20,
                     help="with --link: steps of fp32 DDP timed with and without its exchange (0: none)")
    tta.add_argument("--exchange-only", action="store_true", help="with --link: only measure the exchange fraction")
    tta.add_argument("--target-within", type=float, default=0.0, metavar="PCT",
                     help="with --link: the target is fp32's final loss plus PCT%% (e.g. fp32's seed spread); "
                          "default 0: fp32's final loss itself")
    tta.add_argument("--tuned", help="with --link: a --tune run's --json; each method trains at its best "
                                     "learning rate found there (fp32 at fp32's)")
    tta.add_argument("--launched", action="store_true",
                     help="be one rank of a job a launcher started (gradzip-run, torchrun); rank 0 writes --json")
    tta.add_argument("--runs", help=argparse.SUPPRESS)  # --launched: the runs as JSON [[method, seed, lr], ...]
    return ap


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(steps=args.steps, batch_per_rank=args.batch, eval_every=args.eval_every, width=args.width,
                    layers=args.layers, heads=args.heads, context=args.context, device=args.device,
                    eval_sequences=args.eval_sequences, lr_warmup=args.lr_warmup, corpus=args.corpus)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        lrs = parse_lrs(args.lr)
    except ValueError as e:
        raise SystemExit(f"lm: {e}") from None
    settings = replace(settings_of(args), lr=lrs[0])
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.launched:
        if not args.json:
            raise SystemExit("lm: --launched writes its results to --json; give one")
        runs = [] if args.exchange_only else [tuple(r) for r in json.loads(args.runs or "[]")]
        out = _tta.run_launched(runs, settings, args.exchange_steps)
        if out is not None:
            with open(args.json, "w") as f:
                json.dump({"settings": asdict(settings), **out}, f)
        return 0
    if args.link:
        return _tta.main(args, settings, seeds, lrs)
    methods = split_methods(args.methods or ",".join(DEFAULT_METHODS))
    if args.tune:
        return _tune_main(args, methods, lrs, seeds, settings)
    results = run_list([(m, s, lr) for s in seeds for m in methods for lr in lrs], args.ranks, settings, args.timeout)
    rows = summarize(results)
    table = markdown(rows, settings, seeds)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": asdict(settings), "results": results, "summary": rows}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    if args.plot:
        plot(results, args.plot)
    return 0


def _tune_main(args: argparse.Namespace, methods: List[str], lrs: List[float], seeds: List[int],
               settings: Settings) -> int:
    """--tune: the protocol of gradzip.experiments._tune, then its tables (and the fp32 plateau figure)."""
    if "fp32" not in methods:
        raise SystemExit("lm --tune: the methods need fp32 (every comparison is against it at its best rate)")

    def train(runs: List[tuple]) -> List[dict]:
        return run_list(runs, args.ranks, settings, args.timeout, records=args.records)

    tuned = tune(methods, lrs, seeds, train, LOSS, asdict(settings), args.records, max_widen=args.max_widen,
                 log=lambda line: print(line, file=sys.stderr, flush=True))

    def ratio(r: Row) -> str:
        return f"{r.record['fp32_wire_bytes'] / r.record['wire_bytes']:.1f}x"

    still = plateau([tuned.record("fp32", s, tuned.base_lr) for s in seeds])
    text = (describe_settings(settings, args.ranks, seeds) + " fp32's validation loss moved "
            f"{still:.2f}% over its last 20% of steps at its best learning rate (mean over the seeds).\n\n"
            + tuned.markdown([("wire ratio vs fp32 DDP", ratio)]))
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": asdict(settings), "ranks": args.ranks, "methods": methods,
                       "fp32_last20_percent": still, **tuned.summary(), "records": tuned.t.records.all()}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if args.plot:
        tune_plot(tuned, args.plot)
    return 0
