#!/usr/bin/env python3
"""Convergence experiment for BENCHMARKS.md: test accuracy and bytes per step on
scikit-learn's digits for fp32, torch's fp16 and PowerSGD hooks, and gradzip's
codecs, with DDP on 4 CPU ranks. Wraps gradzip.experiments.digits (installed
with the package, so the sweep can run it too); see `--help`.

    python bench/digits_convergence.py --json digits.json --markdown digits.md
"""

import sys

from gradzip.experiments.digits import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if not any(a == "--seeds" or a.startswith("--seeds=") for a in args):
        args = ["--seeds", "0,1,2,3,4"] + args  # the seeds BENCHMARKS.md reports
    sys.exit(main(args))
