"""Rank bodies of test_backend_race.py: the gradzip backend's compressed calls
while rank 1's worker thread is slow to return after it completed a Work."""

import datetime
import hashlib
import time

import torch
import torch.distributed as dist

STEPS = 3
STALL_S = 0.5


def _stall_after_each_finished_work() -> None:
    """This rank's worker thread sleeps right after it completed a call's Work,
    while the woken caller runs on: a worker thread descheduled in that moment
    on a loaded machine, every time."""
    from gradzip.torch import backend

    finish = backend.Work._finish

    def finish_then_stall(self, error):
        finish(self, error)
        time.sleep(STALL_S)

    backend.Work._finish = finish_then_stall


def slow_worker(rank, world, loop):
    """`loop` "plain": an all_reduce of a new tensor each step, the previous
    one freed; "ddp": DDP without a hook, whose one bucket is replaced by its
    rebuild after the first step. Each compressed call should continue the
    state of the buffer freed before it, on every rank."""
    from gradzip.torch import backend

    group = dist.new_group(backend="gradzip", timeout=datetime.timedelta(seconds=10),
                           pg_options=backend.Policy("qsgd:bits=4", min_elements=1000))
    if rank == 1:
        _stall_after_each_finished_work()
    digest = hashlib.sha256()
    if loop == "plain":
        for step in range(STEPS):
            x = torch.full((1 << 14,), float(rank + step))
            dist.all_reduce(x, group=group)
            digest.update(x.numpy().tobytes())
            del x  # freed: the next call's new tensor takes its state over
    else:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(STEPS):
            g = torch.Generator().manual_seed(100 * step + rank)
            opt.zero_grad()
            ddp(torch.randn(8, 64, generator=g)).square().mean().backward()
            opt.step()
        for p in net.parameters():
            digest.update(p.detach().numpy().tobytes())
        del ddp, opt
    s = backend.compression_stats(group)
    return {"digest": digest.hexdigest(), "states": s["states"], "compressed_calls": s["compressed_calls"]}
