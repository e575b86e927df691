"""The DDP hook the way frameworks use it, under stress, and with a rank killed.

- Lightning's sequence: the state is built (and pickled) before the process
  group exists, reaches the ranks pickled, and is registered after
  DDP wraps the model (tests/python/hook_workers.py says how this mirrors
  DDPStrategy). Lightning itself is not needed for that.
- Many small buckets on 4 and 8 ranks, 20 runs over both transports, never
  hang (the harness's deadline is the bound).
- kill -9 of one rank in the middle of a step's exchanges makes every other
  rank raise from backward() within the timeout, on both transports.
"""

import os
import pickle
import queue
import time

import pytest
import torch.distributed as dist

import gradzip
import hook_workers
from dist_util import _entry, free_port, rank_context, run_ranks
from gradzip.torch import CompressionState


def test_lightning_sequence_state_built_and_pickled_before_the_process_group():
    assert not dist.is_initialized()  # this test process never starts one
    settings = {"codec": "onebit", "warmup_steps": 1, "algorithm": "allgather"}
    state = CompressionState(**settings)
    results = run_ranks(hook_workers.lightning_sequence, 2, state, pickle.dumps(state), settings, timeout=240)
    for r in results:
        assert r["world_before_first_step"] == 0  # unbound until its first hook call
        assert r["step/launcher"] == r["step/pickled"] == r["step/in_rank"] == 6
        assert r["world/launcher"] == 2
        assert r["launcher_equals_in_rank"] and r["pickled_equals_in_rank"] and r["identical"]
    assert len({r["digest"] for r in results}) == 1


@pytest.mark.parametrize("world", [4, 8])
def test_many_small_buckets_never_hang(world):
    runs, steps = 20, 3
    results = run_ranks(hook_workers.many_small_buckets, world, runs, steps, timeout=900)
    for r in results:
        assert all(r["identical"]), r["identical"]
        assert r["steps"] == [steps] * runs
        assert min(r["buckets"]) >= 25  # many buckets indeed (one per layer)


def run_with_a_victim(world: int, victim: int, transport: str, timeout_s: float, deadline_s: float):
    """Like run_ranks, but one rank is expected to die: returns the survivors'
    results, or fails when one of them has not reported by the deadline."""
    ctx = rank_context()
    results = ctx.Queue()
    port = free_port()
    args = (victim, transport, timeout_s)
    environ = dict(os.environ)
    procs = [ctx.Process(target=_entry, args=(hook_workers.victim_dies_mid_step, r, world, port, results, args,
                                              environ), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    end = time.monotonic() + deadline_s
    try:
        while len(got) < world - 1:
            left = end - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world)) - set(got) - {victim})
                pytest.fail(f"ranks {missing} neither failed nor finished within {deadline_s:.0f} s of the start")
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            assert ok, f"rank {rank} crashed outside the training loop:\n{value}"
            got[rank] = value
        return got, procs[victim]
    finally:
        for p in procs:
            p.join(timeout=10)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)


@pytest.mark.parametrize("transport", ["torch", "gradzip"])
def test_a_killed_rank_makes_the_others_fail_within_the_timeout(transport):
    if transport == "gradzip" and not gradzip.BUILD["ucx"]:
        pytest.skip("this gradzip build has no UCX transport")
    timeout_s = 10.0
    # Start-up (spawn, torch import, 3 steps) plus the timeout, with room: a
    # survivor that waits past its timeout still fails here.
    survivors, victim = run_with_a_victim(4, 2, transport, timeout_s, deadline_s=120 + 2 * timeout_s)
    assert victim.exitcode == -9, victim.exitcode  # it did die, by SIGKILL
    for rank, r in survivors.items():
        assert r["error"] is not None, f"rank {rank} finished training with a dead peer"
        assert r["step"] >= 3, r
        assert r["failed_after_s"] <= 2 * timeout_s, r
        assert "IoError" in r["error"] or "closed" in r["error"].lower(), r["error"]
