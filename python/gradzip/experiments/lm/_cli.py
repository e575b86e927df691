"""``python -m gradzip.experiments.lm``: the experiment's command line (the
package doc says what it runs)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Optional, Sequence

from . import _tta
from ._core import DEFAULT_METHODS, Settings, markdown, plot, run, split_methods, summarize

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
    tta.add_argument("--launched", action="store_true",
                     help="be one rank of a job a launcher started (gradzip-run, torchrun); rank 0 writes --json")
    return ap


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(steps=args.steps, batch_per_rank=args.batch, eval_every=args.eval_every, width=args.width,
                    layers=args.layers, heads=args.heads, context=args.context, device=args.device)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    settings = settings_of(args)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.launched:
        if not args.json:
            raise SystemExit("lm: --launched writes its results to --json; give one")
        methods = [] if args.exchange_only else split_methods(args.methods or ",".join(DEFAULT_METHODS))
        out = _tta.run_launched(methods, seeds, settings, args.exchange_steps)
        if out is not None:
            with open(args.json, "w") as f:
                json.dump({"settings": asdict(settings), **out}, f)
        return 0
    if args.link:
        return _tta.main(args, settings, seeds)
    results = run(split_methods(args.methods or ",".join(DEFAULT_METHODS)), seeds, args.ranks, settings, args.timeout)
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
