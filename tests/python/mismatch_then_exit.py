"""One rank of a job whose ranks disagree (run under gradzip-run, so that
rank 0 hosts torch's store, as with a plain init_process_group): each rank
prints the error it got and exits at once, rank 0 taking the store with it.
Rank 1 reads the agreement slowly. Usage: mismatch_then_exit.py hook|fsdp_codec|fsdp_factor"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trust_paths_workers as w  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fn = {"hook": w.hook_mismatch_then_leave, "fsdp_codec": w.fsdp_codec_then_leave,
          "fsdp_factor": w.fsdp_factor_then_leave}[sys.argv[1]]
    message = fn(rank, dist.get_world_size())
    print(f"RESULT {rank} {message.replace(chr(10), ' | ')}", flush=True)
    os._exit(0)  # at once, as a script that ends with the error would (rank 0 takes the store with it)


if __name__ == "__main__":
    main()
