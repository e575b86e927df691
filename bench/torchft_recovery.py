#!/usr/bin/env python3
"""Time lost to a failure under torchft (issue 41 item 5): 3 replicas (one
CPU rank each) train with torchft's Manager on an emulated cluster; one is
killed with SIGKILL in the middle of its allreduce and restarted 1 s later.
Measured, with gradzip's torchft group and with torchft's own gloo group:

- detect: from the kill to the survivors' failed step (should_commit False);
- recover: from the kill to the first step the survivors commit without
  the lost replica;
- rejoin: from the restart to the restarted replica's first committed step
  in a quorum of three (split into its process start, up to its Manager,
  and the rest: quorum, healing from a peer over HTTP, a step);
- the step time before the failure (what compression saves).

Every replica is a rank of ``gradzip-run -n 3 --link RATE`` (each in its own
network namespace; the lighthouse on rank 0's), which runs this file as a
supervisor: it starts the replica (tests/python/torchft_workers.py
faults), and the victim's supervisor kills and restarts it, so that the
launcher sees no rank fail. Needs root (the namespaces); without --link the
replicas are local processes on loopback.

    sudo build/venv/bin/python bench/torchft_recovery.py --link 1gbit --trials 3      # BENCHMARKS.md section 16
    python3 bench/torchft_recovery.py --trials 1 --width 256                              # local ranks, quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKERS = ROOT / "tests" / "python" / "torchft_workers.py"
REPLICAS, VICTIM, KILL_AT, END = 3, 2, 8, 12


# -- the supervisor: one per rank of gradzip-run ----------------------------------


def own_address() -> str:
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if master.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, 9))  # no packet: picks the interface (eth0 of this rank's namespace)
        return s.getsockname()[0]


def lighthouse(host: str, port: int) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "torchft_lighthouse"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "import sys; from torchft._torchft import "
                                            "lighthouse_main; sys.exit(lighthouse_main())"]
    return subprocess.Popen(cmd + ["--min_replicas", "1", "--quorum_tick_ms", "50", "--join_timeout_ms", "1000",
                                   "--heartbeat_timeout_ms", "1000", "--bind", f"{host}:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def supervise(args: argparse.Namespace) -> int:
    rank = int(os.environ["RANK"])
    folder = Path(args.dir)
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ["MASTER_PORT"])  # nothing else uses it here: the lighthouse takes it
    house = lighthouse(master, port) if rank == 0 else None
    env = dict(os.environ, GZ_FT_REPLICA=str(rank), GZ_FT_DIR=str(folder), GZ_FT_REPLICAS=str(REPLICAS),
               GZ_FT_LIGHTHOUSE=f"http://{master}:{port}", GZ_FT_HOST=own_address(), GZ_FT_TIMEOUT_S=str(args.timeout),
               GZ_FT_KILL_AT=str(KILL_AT), GZ_FT_VICTIM=str(VICTIM), GZ_FT_END=str(END), GZ_FT_GROUP=args.group,
               GZ_FT_WIDTH=str(args.width), GZ_FT_POLICY=args.policy, RUST_LOG="warn", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT / "tests" / "python"))

    def start(extra: Dict[str, str]) -> subprocess.Popen:
        log = open(folder / f"replica-{rank}{'-restarted' if extra else ''}.log", "w")
        return subprocess.Popen([sys.executable, str(WORKERS), "faults"], env=dict(env, **extra), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    child = start({})
    try:
        if rank == VICTIM:
            while not (folder / "dying").exists():
                if child.poll() is not None:
                    return child.returncode or 1
                time.sleep(0.005)
            os.killpg(child.pid, signal.SIGKILL)
            t_kill = time.time()
            child.wait()
            time.sleep(args.restart_after)
            t_restart = time.time()
            child = start({"GZ_FT_RESTARTED": "1"})
            (folder / "times.json").write_text(json.dumps({"kill": t_kill, "restart": t_restart}))
        rc = child.wait(timeout=180)
        if house is not None:  # the others still need the lighthouse until they are done
            names = ["result-0.json", "result-1.json", f"result-{VICTIM}-restarted.json"]
            deadline = time.time() + 120
            while not all((folder / n).exists() for n in names) and time.time() < deadline:
                time.sleep(0.1)
        return rc
    finally:
        for p in (child, house):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


# -- what a run measured --------------------------------------------------------


def measure(folder: Path) -> Dict[str, Any]:
    times = json.loads((folder / "times.json").read_text())
    kill, restart = times["kill"], times["restart"]
    res = {n: json.loads((folder / f"result-{n}.json").read_text()) for n in ("0", "1", f"{VICTIM}-restarted")}
    survivors = [res["0"], res["1"]]
    detect = max(next(s["t1"] for s in r["steps"] if s["step"] == KILL_AT) - kill for r in survivors)
    recover = max(next(s["t2"] for s in r["steps"] if s["committed"] and s["t2"] > kill) - kill for r in survivors)
    back = res[f"{VICTIM}-restarted"]
    first = next(s for s in back["steps"] if s["committed"] and s["participants"] == REPLICAS)
    steady = [s["t2"] - s["t0"] for r in survivors for s in r["steps"]
              if s["committed"] and s["participants"] == REPLICAS and 2 <= s["step"] < KILL_AT]
    params = {r["params"] for r in res.values()}
    stats = res["0"].get("stats", {})
    return {"detect_s": detect, "recover_s": recover, "rejoin_s": first["t2"] - restart,
            "rejoin_start_s": back["t_ready"] - restart, "rejoin_after_ready_s": first["t2"] - back["t_ready"],
            "step_s": statistics.median(steady) if steady else float("nan"), "identical": len(params) == 1,
            "wire_ratio": stats.get("wire_ratio")}


# -- the driver -----------------------------------------------------------------


def gradzip_run() -> str:
    for p in (ROOT / "build" / "bin" / "gradzip-run", Path(sys.executable).parent / "gradzip-run"):
        if p.exists():
            return str(p)
    found = shutil.which("gradzip-run")
    if not found:
        raise SystemExit("gradzip-run not found (build/bin, the venv, PATH)")
    return found


def one_run(args: argparse.Namespace, group: str) -> Dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"torchft-{group}-"))
    cmd = [gradzip_run(), "-n", str(REPLICAS)]
    if args.link:
        cmd += ["--link", args.link]
    cmd += ["--", sys.executable, str(Path(__file__).resolve()), "--supervise", "--dir", str(folder),
            "--group", group, "--width", str(args.width), "--timeout", str(args.timeout),
            "--restart-after", str(args.restart_after), "--policy", args.policy]
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in folder.glob("*.log"))
        raise SystemExit(f"{group}: gradzip-run exited {r.returncode} after {time.time() - t:.0f} s\n"
                         f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}\n{tails}")
    m = measure(folder)
    m.update(group=group, folder=str(folder))
    return m


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--link", default="", help="gradzip-run --link RATE[,DELAY] (root); empty: local ranks")
    ap.add_argument("--groups", default="gradzip,gloo", help="gradzip: gradzip's torchft group; gloo: torchft's")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--width", type=int, default=2048, help="the model: WIDTH^2 + 33 WIDTH + 32 parameters")
    ap.add_argument("--policy", default="codec=qsgd:bits=4;min_elements=1024", help="gradzip's group's policy")
    ap.add_argument("--timeout", type=float, default=10.0, help="the Manager's and the groups' timeout")
    ap.add_argument("--restart-after", type=float, default=1.0, help="seconds between the kill and the restart")
    ap.add_argument("--json", default="", help="write every run's measures here")
    ap.add_argument("--supervise", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--group", default="gradzip", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.supervise:
        return supervise(args)
    runs = []
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    for trial in range(args.trials):
        for group in args.groups.split(","):
            m = one_run(args, group)
            runs.append(m)
            print(f"{group:8} trial {trial}: detect {m['detect_s']:.2f} s, recover {m['recover_s']:.2f} s, rejoin "
                  f"{m['rejoin_s']:.2f} s ({m['rejoin_start_s']:.2f} start + {m['rejoin_after_ready_s']:.2f}), "
                  f"step {m['step_s'] * 1000:.0f} ms, identical {m['identical']}", flush=True)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:3]
    print(f"\n{REPLICAS} replicas, link {args.link or 'local (loopback)'}, model {args.width ** 2 + 33 * args.width + 32:,} "
          f"parameters, SIGKILL of replica {VICTIM} at step {KILL_AT}, restart {args.restart_after:g} s later; "
          f"load before {' '.join(load)}, after {' '.join(load_after)}\n")
    print("| group | detect s | recover s | rejoin s (start + join/heal/step) | step ms | identical |")
    print("|---|---|---|---|---|---|")
    for group in args.groups.split(","):
        rs = [r for r in runs if r["group"] == group]

        def med(k: str) -> float:
            return statistics.median(r[k] for r in rs)

        print(f"| {group} | {med('detect_s'):.2f} | {med('recover_s'):.2f} | {med('rejoin_s'):.2f} "
              f"({med('rejoin_start_s'):.2f} + {med('rejoin_after_ready_s'):.2f}) | {med('step_s') * 1000:.0f} | "
              f"{all(r['identical'] for r in rs)} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"link": args.link, "width": args.width, "policy": args.policy,
                                               "load_before": load, "load_after": load_after, "runs": runs},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
