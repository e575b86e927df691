"""gradzip-run --link: a 2-rank emulated cluster, for real.

Needs root, iproute2 (ip, tc) and a build with UCX; without them every test
here is skipped with the reason ("no emulated cluster here: ..."). Each
subprocess has a deadline, so nothing here can hang CI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("GRADZIP_BIN_DIR", ROOT / "build" / "bin"))
RUN, BENCH = BIN / "gradzip-run", BIN / "gradzip-bench"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc"):
        if not (shutil.which(tool) or any(Path(d, tool).exists() for d in ("/usr/sbin", "/sbin"))):
            return f"needs iproute2 ({tool} not found)"
    for b in (RUN, BENCH):
        if not os.access(b, os.X_OK):
            return f"{b} is not built (set GRADZIP_BIN_DIR)"
    probe = subprocess.run(["ip", "netns", "add", f"gzrun-probe-{os.getpid()}"], capture_output=True, text=True,
                           timeout=20)
    if probe.returncode != 0:
        return f"cannot make a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"gzrun-probe-{os.getpid()}"], capture_output=True, timeout=20)
    return None


_REASON = _why_not()
if _REASON:
    pytest.skip(f"no emulated cluster here: {_REASON}", allow_module_level=True)


def our_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("gzrun-")}


def stale_namespaces() -> set[str]:
    """gradzip-run namespaces whose launcher is gone (other runs may be live)."""
    return {ns for ns in our_namespaces() if not Path(f"/proc/{ns.split('-')[1]}").exists()}


@pytest.fixture(autouse=True)
def no_leftovers() -> None:
    before = stale_namespaces()
    yield
    assert stale_namespaces() - before == set(), "gradzip-run left network namespaces behind"


def test_fp32_allreduce_over_100mbit_takes_the_link_time_and_is_exact(tmp_path: Path) -> None:
    # 2 ranks, 2M floats: the fp32 allreduce moves 2(P-1)/P x 8 MiB per rank,
    # 0.67 s at 100 Mbit/s. Faster would mean the links are not shaped.
    n, rate = 2 << 20, 100e6
    out = tmp_path / "rows.json"
    r = subprocess.run([str(RUN), "-n", "2", "--link", "100mbit", "--", str(BENCH), "--codecs", "none,fp16",
                        "--algorithm", "scatter_reduce", "--sizes", str(n), "--iters", "2", "--warmup", "1",
                        "--timeout", "30", "--json", str(out)],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "emulated cluster: 2 ranks" in r.stderr
    # Every UCX_ variable the launcher sets is read by a transport UCX loads
    # (UCX warns once per rank about the others: the FIFO sizes with UCX_TLS=tcp).
    assert "unused env variables" not in r.stdout + r.stderr, r.stdout + r.stderr
    rows = {row["codec"]: row for row in json.loads(out.read_text())}
    base = rows["none"]
    bound_ms = 2 * (2 - 1) / 2 * 4 * n * 8 / rate * 1e3
    # The tbf bucket lets up to one burst (73 KiB here) per phase through at
    # once: 2 phases x 73 KiB is 2% of 8 MiB.
    assert base["comm_ms"] >= 0.97 * bound_ms, f"fp32 allreduce {base['comm_ms']:.0f} ms < link bound {bound_ms:.0f} ms"
    assert base["ok"] and base["identical"] and base["rel_error"] < 1e-6
    assert rows["fp16"]["ok"] and rows["fp16"]["comm_ms"] >= 0.97 * bound_ms / 2
    print(f"fp32 allreduce {base['total_ms']:.0f} ms = {base['total_ms'] / bound_ms:.2f} x the link bound")


def node_holders() -> set[int]:
    """Processes that hold a node's namespaces (gradzip-run --ranks-per-node)."""
    pids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"infinity"]:
                    pids.add(int(d.name))
            except OSError:
                pass
    return pids


def test_nodes_of_two_ranks_share_a_node_and_only_nodes_are_shaped(tmp_path: Path) -> None:
    # 2 nodes x 2 ranks at 100 Mbit/s. Each rank learns its node the torchrun
    # way; the nodes have their own host names. The flat fp32 allreduce then
    # moves 4n bytes per rank to the other node (2(P-1)/P x 4n, two thirds of
    # it remote), twice that through each node's link: it takes that link
    # time. The hierarchical one sends each shard across once.
    holders_before = node_holders()
    r = subprocess.run([str(RUN), "-n", "4", "--ranks-per-node", "2", "--link", "100mbit", "--", "sh", "-c",
                        "echo where $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $GRADZIP_NODE $(cat /proc/sys/kernel/hostname)"],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert node_holders() <= holders_before, "a node's namespace holder outlived the run"
    assert "emulated cluster: 2 nodes x 2 ranks" in r.stderr
    for rank in range(4):
        node = rank // 2
        assert f"[{rank}] where {rank % 2} 2 {node} {node} gznode-{node}" in r.stdout, r.stdout

    n, rate = 1 << 20, 100e6
    out = tmp_path / "rows.json"
    r = subprocess.run([str(RUN), "-n", "4", "--ranks-per-node", "2", "--link", "100mbit", "--", str(BENCH),
                        "--codecs", "none,onebit", "--algorithm", "hierarchical", "--sizes", str(n), "--iters", "2",
                        "--warmup", "1", "--timeout", "60", "--json", str(out)],
                       capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "topology: 4 ranks: 2 nodes x 2" in r.stdout
    assert "unused env variables" not in r.stdout + r.stderr, r.stdout + r.stderr
    rows = {(row["codec"], row["algorithm"]): row for row in json.loads(out.read_text())}
    flat = rows[("none", "scatter_reduce")]
    assert flat["wire_bytes_per_rank"] == 4 * n and flat["ok"]
    bound_ms = 2 * flat["wire_bytes_per_rank"] * 8 / rate * 1e3
    assert flat["comm_ms"] >= 0.97 * bound_ms, f"flat fp32 {flat['comm_ms']:.0f} ms < node link bound {bound_ms:.0f} ms"
    hier = rows[("none", "hierarchical")]
    assert hier["ok"] and hier["rel_error"] < 1e-6
    assert hier["wire_bytes_per_rank"] == 2 * n  # its shard (n/2 floats) to the other node, once
    assert rows[("onebit:block=512", "hierarchical")]["ok"]
    print(f"flat fp32 {flat['total_ms']:.0f} ms (node link bound {bound_ms:.0f} ms), hierarchical {hier['total_ms']:.0f} ms")


def test_delay_is_applied_or_refused_never_ignored() -> None:
    r = subprocess.run([str(RUN), "-n", "2", "--link", "1gbit,2ms", "--", "true"], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        assert "netem" in r.stderr, r.stderr  # this kernel has no netem: a clear refusal
    else:
        assert "with netem delay" in r.stderr, r.stderr


def test_bad_link_is_a_usage_error() -> None:
    r = subprocess.run([str(RUN), "-n", "2", "--link", "1gbps", "--", "true"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "needs a unit" in r.stderr


def test_sigint_tears_everything_down() -> None:
    p = subprocess.Popen([str(RUN), "-n", "2", "--link", "1gbit", "--", "sleep", "60"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not any(ns.startswith(f"gzrun-{p.pid}-") for ns in our_namespaces()):
            assert time.monotonic() < deadline and p.poll() is None, "the namespaces never appeared"
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 128 + signal.SIGINT, err
    assert not any(ns.startswith(f"gzrun-{p.pid}-") for ns in our_namespaces())


def test_namespaces_of_a_killed_launcher_are_cleaned_up() -> None:
    p = subprocess.Popen([str(RUN), "-n", "2", "--link", "1gbit", "--", "sleep", "60"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not any(ns.startswith(f"gzrun-{p.pid}-") for ns in our_namespaces()):
        assert time.monotonic() < deadline, "the namespaces never appeared"
        time.sleep(0.1)
    p.kill()  # SIGKILL: no teardown possible
    p.wait(timeout=10)
    assert any(ns.startswith(f"gzrun-{p.pid}-") for ns in our_namespaces())
    r = subprocess.run([str(RUN), "--cleanup"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not any(ns.startswith(f"gzrun-{p.pid}-") for ns in our_namespaces())


def test_without_root_it_refuses_clearly() -> None:
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("setpriv (util-linux) not found")
    r = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", str(RUN), "-n", "2", "--link",
                        "1gbit", "--", "true"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "needs root" in r.stderr, r.stderr
