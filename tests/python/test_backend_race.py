"""The gradzip backend's identity rule does not depend on its worker thread's
timing (gpu_torch_check.py's backend_ddp_2gpus hung now and then on a loaded
machine: rank 0 in an exchange, rank 1 in a store wait, both until the
timeout).

A compressed all_reduce's job completes its Work, which wakes the caller, and
only then returns and lets go of the call's tensor. Where the worker thread
was descheduled in between, a buffer the program had freed (DDP's first-step
bucket, replaced by its rebuild; a loop's previous tensor) was still alive at
the next call on that rank only: that rank took a fresh error-feedback state,
whose first call runs the engine's agreement round in the store, while the
other took the freed buffer's state and started the exchange. Here rank 1's
worker thread sleeps after every completed Work, which forces that timing.
"""

import pytest

import backend_race_workers
from dist_util import run_ranks


@pytest.mark.parametrize("loop", ["plain", "ddp"])
def test_a_slow_worker_thread_changes_no_state_choice(loop):
    r0, r1 = run_ranks(backend_race_workers.slow_worker, 2, loop, timeout=120, env={"GRADZIP_TIMEOUT_S": "10"})
    assert r0 == r1, (r0, r1)  # the same results, states and calls on both ranks
    # Every call continued the one state: the freed buffer's, taken over by the next.
    assert r0["states"] == 1 and r0["compressed_calls"] == backend_race_workers.STEPS, r0
