"""One rank of a job on the gradzip backend whose peer fails, as a user's
script meets it: started by test_backend_trust.py (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT set; rank 0 hosts torch's store), nothing caught.
A rank that raises ends with Python's exit status 1 and its traceback; one
that gets through prints DONE and ends with 0.

Usage: backend_adversary.py CASE, with CASE one of:
  avg_stuck       exact AVG all_reduces; rank 1 stops calling and sleeps
  avg_killed      exact AVG all_reduces; rank 1 kills itself (SIGKILL)
  compressed_stuck / compressed_killed   the same with compressed all_reduces
  collectives     every collective the group runs, each once with rank 1 absent (side by side)
  init            init_process_group alone, then one all_reduce of each kind
"""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

TIMEOUT_S = float(os.environ.get("GZ_TEST_TIMEOUT_S", "3"))
STEPS = 5000  # far more than a peer's failure lets through


def say(*what: object) -> None:
    print(f"[{dist.get_rank() if dist.is_initialized() else '?'}]", *what, flush=True)


def loop(make: "callable", rank: int, how: str) -> None:
    """STEPS all_reduces of make() on a group with a short timeout; rank 1
    fails after 3 of them."""
    from gradzip.torch.backend import Policy

    group = dist.new_group(backend="gradzip", timeout=datetime.timedelta(seconds=TIMEOUT_S),
                           pg_options=Policy(min_elements=1 << 14))
    for step in range(STEPS):
        if rank == 1 and step == 3:
            if how == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(6 * TIMEOUT_S + 30)  # stuck: alive, never calls again
            os._exit(3)
        t = make()
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
        assert torch.isfinite(t).all()
    say("DONE", STEPS, "steps")


def collectives(rank: int, world: int) -> None:
    """Each collective twice on a group of its own: once with every rank
    (it works), then with rank 1 absent: rank 0's wait() must raise."""
    def cases():
        big = lambda: torch.ones(1 << 15)  # noqa: E731 (compressed: at least min_elements)
        yield "all_reduce exact AVG", lambda g: dist.all_reduce(torch.ones(8), op=dist.ReduceOp.AVG, group=g,
                                                                 async_op=True)
        yield "all_reduce exact SUM", lambda g: dist.all_reduce(torch.ones(8), group=g, async_op=True)
        yield "all_reduce int64", lambda g: dist.all_reduce(torch.ones(8, dtype=torch.int64), group=g,
                                                             async_op=True)
        yield "all_reduce MAX", lambda g: dist.all_reduce(torch.ones(8), op=dist.ReduceOp.MAX, group=g,
                                                           async_op=True)
        yield "all_reduce compressed AVG", lambda g: dist.all_reduce(big(), op=dist.ReduceOp.AVG, group=g,
                                                                      async_op=True)
        yield "all_reduce compressed SUM", lambda g: dist.all_reduce(big(), group=g, async_op=True)
        yield "all_reduce_coalesced", lambda g: dist.all_reduce_coalesced([torch.ones(8), torch.ones(4)], group=g,
                                                                           async_op=True)
        yield "broadcast", lambda g: dist.broadcast(torch.ones(8), src=1, group=g, async_op=True)
        yield "all_gather", lambda g: dist.all_gather([torch.empty(8) for _ in range(world)], torch.ones(8),
                                                      group=g, async_op=True)
        yield "all_gather_into_tensor", lambda g: dist.all_gather_into_tensor(torch.empty(8 * world),
                                                                              torch.ones(8), group=g, async_op=True)
        yield "reduce", lambda g: dist.reduce(torch.ones(8), dst=0, group=g, async_op=True)
        yield "reduce_scatter_tensor", lambda g: dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * world),
                                                                            group=g, async_op=True)
        yield "all_to_all_single", lambda g: dist.all_to_all_single(torch.empty(8 * world),
                                                                    torch.ones(8 * world), group=g, async_op=True)
        yield "gather", lambda g: dist.gather(torch.ones(8), [torch.empty(8) for _ in range(world)] if rank == 0
                                              else None, dst=0, group=g, async_op=True)
        yield "scatter", lambda g: dist.scatter(torch.empty(8), None if rank == 0 else
                                                [torch.ones(8) for _ in range(world)], src=1, group=g,
                                                async_op=True)
        yield "recv", lambda g: (dist.irecv(torch.empty(8), src=1, group=g) if rank == 0
                                 else dist.isend(torch.ones(8), dst=0, group=g))
        yield "barrier", lambda g: dist.barrier(group=g, async_op=True)

    from gradzip.torch.backend import Policy

    sync = dist.new_group(backend="gloo")
    groups = []
    for name, call in cases():
        group = dist.new_group(backend="gradzip", timeout=datetime.timedelta(seconds=TIMEOUT_S),
                               pg_options=Policy(min_elements=1 << 14))
        call(group).wait()  # every rank: the call works on this group
        groups.append((name, call, group))
    dist.barrier(group=sync)
    if rank == 0:
        # Rank 1 is absent from every second call. The groups are independent,
        # so rank 0 starts them all at once and their timeouts run side by
        # side (one after the other they took 17 timeouts); each is timed
        # from this start, when its own call began.
        t0 = time.monotonic()
        started = []
        for name, call, group in groups:
            try:
                started.append((name, call(group), None))
            except Exception as e:  # raised by the call itself: what the test inspects
                started.append((name, None, e))
        for name, work, error in started:
            try:
                if error is not None:
                    raise error
                work.wait()
                say("RESULT", name, "| no error", f"| {time.monotonic() - t0:.1f}")
            except Exception as e:  # what the test inspects
                say("RESULT", name, f"| {type(e).__name__}: {str(e)[:120]!r}", f"| {time.monotonic() - t0:.1f}")
    dist.barrier(group=sync)
    say("DONE collectives")


def main() -> None:
    case = sys.argv[1]
    torch.set_num_threads(1)
    flag = os.environ.get("GZ_TEST_WAIT_FOR")
    if flag:  # this rank reaches the backend's policy agreement once the stranger has written its record
        from gradzip.torch import backend

        agree = backend._agree

        def late(*args: object) -> None:
            deadline = time.monotonic() + 60
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
            # Rank 0, already waiting for this rank's record, reads the forged
            # one before this rank's own write replaces it: without the pause
            # a loaded machine let rank 1 write first (a fresh-clone CI saw
            # both ranks report the genuine mismatch instead).
            time.sleep(1.0)
            agree(*args)

        backend._agree = late
    # The default group waits long (ranks start at their own pace); the
    # groups the cases fail on have a short timeout.
    dist.init_process_group("cpu:gradzip", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    say("INIT OK", repr(dist.group.WORLD.policy))
    if case == "init":
        dist.all_reduce(torch.ones(8), op=dist.ReduceOp.AVG)
        dist.all_reduce(torch.ones(1 << 15), op=dist.ReduceOp.AVG)
        say("DONE")
    elif case in ("avg_stuck", "avg_killed"):
        loop(lambda: torch.full((8,), float(rank)), rank, case.split("_")[1])
    elif case in ("compressed_stuck", "compressed_killed"):
        loop(lambda: torch.full((1 << 15,), float(rank)), rank, case.split("_")[1])
    elif case == "collectives":
        collectives(rank, world)
    else:
        raise SystemExit(f"unknown case {case!r}")


if __name__ == "__main__":
    main()
