"""Starts the real torchft for test_torchft.py and bench/torchft_recovery.py:
a lighthouse (the torchft_lighthouse the wheel installs) and replicas
(torchft_workers.py), each in a process group of its own, killed with
their whole group when the run ends, whatever happened."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional

HERE = pathlib.Path(__file__).parent
WORKERS = HERE / "torchft_workers.py"
TOKEN = "5c1e9a0b7d3f24681ace0b9d7f3e5a21"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lighthouse_command() -> List[str]:
    exe = pathlib.Path(sys.executable).parent / "torchft_lighthouse"
    return [str(exe)] if exe.exists() else [sys.executable, "-c",
                                            "import sys; from torchft._torchft import lighthouse_main; "
                                            "sys.exit(lighthouse_main())"]


class Run:
    """A lighthouse and the replicas started on it; kill() ends them all."""

    def __init__(self, folder: pathlib.Path, *, heartbeat_ms: int = 600, join_ms: int = 1000) -> None:
        self.dir = folder
        self.port = free_port()
        self.procs: List[subprocess.Popen] = []
        self.logs: Dict[str, pathlib.Path] = {}
        self.lighthouse = self._start("lighthouse", [
            *lighthouse_command(), "--min_replicas", "1", "--quorum_tick_ms", "50", "--join_timeout_ms", str(join_ms),
            "--heartbeat_timeout_ms", str(heartbeat_ms), "--bind", f"127.0.0.1:{self.port}"], {})
        self.replicas: Dict[str, subprocess.Popen] = {}

    def _start(self, name: str, cmd: List[str], env: Dict[str, str]) -> subprocess.Popen:
        log = self.dir / f"{name}.log"
        self.logs[name] = log
        e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GRADZIP_JOB_TOKEN=TOKEN, **env)
        with open(log, "w") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=e, start_new_session=True)
        self.procs.append(p)
        return p

    def replica(self, replica: int, scenario: str, env: Dict[str, str], name: Optional[str] = None) -> subprocess.Popen:
        name = name or f"replica-{replica}"
        env = dict(env, GZ_FT_REPLICA=str(replica), GZ_FT_DIR=str(self.dir),
                   GZ_FT_LIGHTHOUSE=f"http://127.0.0.1:{self.port}")
        p = self._start(name, [sys.executable, str(WORKERS), scenario], env)
        self.replicas[name] = p
        return p

    def wait_for_file(self, name: str, limit: float) -> float:
        """Waits for <dir>/name; the time it appeared."""
        deadline = time.monotonic() + limit
        while not (self.dir / name).exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not appear within {limit:.0f} s\n{self.tails()}")
            time.sleep(0.01)
        return time.time()

    def _check_alive(self) -> None:
        for name, p in self.replicas.items():
            if p.poll() not in (None, 0, -signal.SIGKILL):
                raise RuntimeError(f"{name} ended with status {p.returncode}\n{self.tails()}")

    def wait(self, names: List[str], limit: float) -> Dict[str, int]:
        """Waits for the named replicas to end; their exit statuses."""
        deadline = time.monotonic() + limit
        rcs = {}
        for n in names:
            try:
                rcs[n] = self.replicas[n].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"{n} did not end within {limit:.0f} s\n{self.tails()}") from None
        return rcs

    def result(self, name: str) -> Dict[str, Any]:
        return json.loads((self.dir / name).read_text())

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def tails(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.logs)

    def kill(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)

    def leftovers(self) -> List[int]:
        """Processes of this run's groups still alive (none after kill)."""
        alive = []
        for p in self.procs:
            try:
                os.killpg(p.pid, 0)
                alive.append(p.pid)
            except ProcessLookupError:
                pass
        return alive


@contextlib.contextmanager
def torchft_run(folder: pathlib.Path, **kw: Any) -> Iterator[Run]:
    run = Run(folder, **kw)
    try:
        yield run
    finally:
        run.kill()
