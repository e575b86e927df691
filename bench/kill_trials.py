#!/usr/bin/env python3
"""Failure detection: kill -9 a random rank of a running job, N times, and
measure how long each survivor takes to fail.

Each trial starts a P-rank job of gradzip-bench (a million compressed
allreduces over UCX, longer than any trial; the Store on rank 0; the job's
own GRADZIP_JOB_TOKEN) with GRADZIP_TIMEOUT_S=T. The ranks are started by this
script, not by gradzip-run, which would stop the survivors itself: what is
measured is gradzip's own detection. After a random delay in the run, one
random rank (rank 0, the Store's host, included) gets SIGKILL; then every
survivor must exit with an error. A survivor still running 3T after the
kill is a hang: it is killed and counted.

The property (checked with --check, as ctest runs it): every survivor of
every trial failed within 2T of the kill. Times depend on the machine's
load; the bound does not.

    python3 bench/kill_trials.py --trials 100 --timeout 5           # BENCHMARKS.md, reliability
    python3 bench/kill_trials.py --trials 3 --timeout 3 --check      # what ctest runs
    UCX_TLS=tcp python3 bench/kill_trials.py --trials 20             # UCX's peer error mode

With --torch BACKEND the job is P ranks of a torch.distributed script
instead (this file, run with --rank-of BACKEND; its interpreter needs torch
and, for gradzip, the gradzip package): init_process_group(BACKEND) with
timeout T, then exact AVG all_reduces of 8 floats in a loop, as a user's
metrics average is: "gloo" is torch's gloo (a SUM, then the division: gloo
has no AVG), "gradzip" the gradzip backend ("cpu:gradzip", whose exact AVG
is that SUM and division on its wrapped gloo group). A survivor raises
from all_reduce, prints the error and ends as a script does with an
uncaught error (exit status 1; with --exit destroy it first destroys the
process group, gc.collect()ed). What is counted besides the bound: how each
survivor ended, by its exit status, and those that printed "terminate
called" (torch's gloo teardown, pytorch/pytorch#190489: SIGABRT at exit).

    python3 bench/kill_trials.py --torch gloo --ranks 3 --trials 20 --timeout 5
    python3 bench/kill_trials.py --torch gradzip --ranks 3 --trials 20 --timeout 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_bench() -> Optional[str]:
    here = Path(__file__).resolve().parent.parent
    for p in (here / "build" / "bin" / "gradzip-bench",):
        if p.exists():
            return str(p)
    return None


def start_job(bench: str, ranks: int, timeout: float, spec: str, size: str, torch_backend: Optional[str] = None,
              exit_how: str = "raise") -> List[subprocess.Popen]:
    port, token = free_port(), secrets.token_hex(16)
    procs = []
    for r in range(ranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(ranks),
                   LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks), GRADZIP_JOB_TOKEN=token,
                   GRADZIP_TIMEOUT_S=str(timeout), OMP_NUM_THREADS="1")
        if torch_backend is None:
            cmd = [bench, "--codecs", spec, "--sizes", size, "--iters", "1000000", "--warmup", "1",
                   "--timeout", str(timeout)]
        else:
            cmd = [sys.executable, __file__, "--rank-of", torch_backend, "--timeout", str(timeout), "--exit", exit_how]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if torch_backend else subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def wait_ready(procs: List[subprocess.Popen], limit: float) -> bool:
    """A torch job's ranks each print READY once their all_reduces run (torch's import takes seconds)."""
    import selectors

    sel = selectors.DefaultSelector()
    for p in procs:
        sel.register(p.stdout, selectors.EVENT_READ, p)
    waiting, end = set(procs), time.monotonic() + limit
    while waiting and time.monotonic() < end:
        for key, _ in sel.select(timeout=0.5):
            line = key.fileobj.readline()
            if "READY" in line or not line:
                waiting.discard(key.data)
                sel.unregister(key.fileobj)
    sel.close()
    return not waiting


def trial(bench: str, ranks: int, timeout: float, rng: random.Random, spec: str, size: str,
          torch_backend: Optional[str] = None, exit_how: str = "raise") -> Dict:
    procs = start_job(bench, ranks, timeout, spec, size, torch_backend, exit_how)
    try:
        if torch_backend is not None and not wait_ready(procs, 120):
            return {"error": "the ranks were not all running within 120 s"}
        time.sleep(1.0 + rng.random())  # setup takes well under a second; then allreduces run
        early = [r for r, p in enumerate(procs) if p.poll() is not None]
        if early:
            errors = {r: procs[r].stderr.read()[-500:] for r in early}
            return {"error": f"ranks {early} exited before the kill: {errors}"}
        victim = rng.randrange(ranks)
        procs[victim].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        detected: Dict[int, float] = {}
        codes: Dict[int, int] = {}
        hung: List[int] = []
        survivors = [r for r in range(ranks) if r != victim]
        while len(detected) + len(hung) < len(survivors):
            now = time.monotonic()
            for r in survivors:
                if r in detected or r in hung:
                    continue
                code = procs[r].poll()
                if code is not None:
                    detected[r] = now - killed_at
                    codes[r] = code
                elif now - killed_at > 3 * timeout:
                    hung.append(r)
                    procs[r].kill()
            time.sleep(0.005)
        stderr = {r: procs[r].stderr.read() for r in survivors}
        return {"victim": victim, "detected": detected, "codes": codes, "hung": hung,
                "terminate": [r for r in survivors if "terminate called" in stderr[r]],
                "stderr": {r: e[-300:] for r, e in stderr.items()}}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def rank_of(backend: str, timeout: float, exit_how: str) -> None:
    """One rank of a --torch job (see the module's docstring)."""
    import datetime
    import gc

    import torch
    import torch.distributed as dist

    if backend == "gradzip":
        import gradzip.torch  # noqa: F401 (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group("gloo" if backend == "gloo" else "cpu:gradzip",
                            timeout=datetime.timedelta(seconds=timeout))
    world = dist.get_world_size()
    t = torch.full((8,), float(dist.get_rank()))
    try:
        for step in range(10 ** 9):
            if backend == "gloo":
                dist.all_reduce(t)
                t.div_(world)
            else:
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
            if step == 10:
                print("READY", flush=True)
    finally:
        if exit_how == "destroy":
            gc.collect()
            dist.destroy_process_group()


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--rank-of":
        ap = argparse.ArgumentParser()
        ap.add_argument("--rank-of", choices=["gloo", "gradzip"])
        ap.add_argument("--timeout", type=float)
        ap.add_argument("--exit", choices=["raise", "destroy"])
        a = ap.parse_args()
        rank_of(a.rank_of, a.timeout, a.exit)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=5.0, help="GRADZIP_TIMEOUT_S of the job (T)")
    ap.add_argument("--bench", default=default_bench(), help="gradzip-bench (default: build/bin/gradzip-bench)")
    ap.add_argument("--codec", default="onebit")
    ap.add_argument("--size", default="256K", help="elements per allreduce")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", help="write every trial's times here")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every survivor failed within 2T")
    ap.add_argument("--torch", choices=["gloo", "gradzip"], help="a torch.distributed job on this backend instead "
                    "of gradzip-bench (see above)")
    ap.add_argument("--exit", choices=["raise", "destroy"], default="raise",
                    help="--torch: how a survivor ends (an uncaught error; or destroy_process_group first)")
    a = ap.parse_args()
    if a.torch:
        a.bench = None
    elif not a.bench or not Path(a.bench).exists():
        print("kill_trials: no gradzip-bench (build it, or pass --bench)", file=sys.stderr)
        return 2
    rng = random.Random(a.seed)
    results, worst, times = [], 0.0, []
    hangs = late = errors = clean = 0
    what = (f"torch {a.torch} backend, exact AVG of 8 floats, survivors exit by {a.exit}" if a.torch else
            f"{a.codec} x {a.size}, UCX_TLS={os.environ.get('UCX_TLS', '(default)')}")
    print(f"# {a.trials} trials: kill -9 of a random rank of {a.ranks}, T = {a.timeout:g} s, {what}")
    print(f"# {'trial':>5} {'victim':>6} {'slowest survivor (s)':>20}  exit codes")
    signalled = terminated = 0
    for i in range(a.trials):
        t = trial(a.bench, a.ranks, a.timeout, rng, a.codec, a.size, a.torch, a.exit)
        results.append(t)
        if "error" in t:
            errors += 1
            print(f"  {i:>5} setup failed: {t['error']}")
            continue
        slowest = max(t["detected"].values(), default=0.0)
        times.extend(t["detected"].values())
        worst = max(worst, slowest)
        hangs += len(t["hung"])
        late += sum(1 for s in t["detected"].values() if s > 2 * a.timeout)
        clean += sum(1 for c in t["codes"].values() if c == 0)
        signalled += sum(1 for c in t["codes"].values() if c < 0)
        terminated += len(t["terminate"])
        print(f"  {i:>5} {t['victim']:>6} {slowest:>20.2f}  {sorted(t['codes'].values())}"
              + (f"  HUNG: {t['hung']}" if t["hung"] else "")
              + (f"  'terminate called': ranks {t['terminate']}" if t["terminate"] else ""))
    ok = errors == 0 and hangs == 0 and late == 0 and clean == 0 and times
    summary = (f"# {a.trials} trials, {len(times)} survivors: {hangs} hangs, {late} later than 2T, "
               f"{clean} exited 0, {errors} setup failures; detection median "
               f"{statistics.median(times) if times else float('nan'):.2f} s, worst {worst:.2f} s "
               f"(2T = {2 * a.timeout:g} s); {signalled} ended by a signal, {terminated} printed "
               f"'terminate called'")
    print(summary)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "trials": results, "summary": summary}, indent=1))
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
