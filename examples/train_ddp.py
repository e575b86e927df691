"""Data-parallel training with gradzip-compressed gradients, checkpoints and resume.

A script to copy: torchrun starts the ranks, DDP averages gradients through
gradzip's communication hook (1-bit SGD with error feedback by default), and
every --save-every steps each rank writes a checkpoint that holds everything
the next step depends on: model, optimizer, the hook's error-feedback state,
the data order and the step. A run resumed from it continues bit-identically:
the same parameters, step for step, as a run that never stopped.

    torchrun --nproc-per-node=2 examples/train_ddp.py --steps 200 --checkpoint-dir ckpt
    torchrun --nproc-per-node=2 examples/train_ddp.py --steps 400 --checkpoint-dir ckpt --resume

Checkpoints are per rank (ckpt/rank0.pt, ...): the hook's residuals differ
from rank to rank, so a resumed job needs the same world size (the hook's
state says so if it differs). Model and optimizer are the same on every rank;
they are saved with each rank's file so that one file is a complete restart
point for its rank.

Data: scikit-learn's digits (8x8 images, 10 classes), split across the ranks
by DistributedSampler; any map-style dataset works the same way.
"""

import argparse
import gc
import hashlib
import os
import pathlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from gradzip.torch import CompressionState, compression_hook


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--codec", default="onebit", help="gradzip codec spec (default onebit; e.g. topk:density=0.01)")
    p.add_argument("--steps", type=int, default=200, help="train until this global step (default 200)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--warmup-steps", type=int, default=0, help="uncompressed steps first (default 0)")
    p.add_argument("--checkpoint-dir", type=pathlib.Path, default=None, help="where each rank saves rank<r>.pt")
    p.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps and at the end (default 50)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def dataset() -> TensorDataset:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y, dtype=torch.int64))


def fingerprint(model: torch.nn.Module) -> str:
    """A short hash of every parameter's bytes: equal on all ranks, and equal
    between a straight run and a resumed one."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial model on every rank

    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = DistributedDataParallel(net)
    state = CompressionState(codec=args.codec, warmup_steps=args.warmup_steps)
    model.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    step = 0
    ckpt = args.checkpoint_dir / f"rank{rank}.pt" if args.checkpoint_dir else None
    if args.resume:
        if ckpt is None or not ckpt.exists():
            raise SystemExit(f"--resume: no checkpoint at {ckpt}")
        saved = torch.load(ckpt, weights_only=False)  # our own file (pickled hook state): trust it as you trust the script
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state.load_state_dict(saved["gradzip"])
        step = saved["step"]

    def save() -> None:
        if ckpt is None:
            return
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                    "gradzip": state.state_dict(), "step": step}, tmp)
        os.replace(tmp, ckpt)  # a crash mid-save leaves the previous checkpoint whole

    per_epoch = len(loader)
    while step < args.steps:
        # The data order is a function of (seed, epoch), so a resumed run
        # replays the epoch it stopped in and skips the batches it had done.
        epoch, done = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < done:
                continue
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            if step % args.save_every == 0:
                save()
            if step % 50 == 0 and rank == 0:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
            if step >= args.steps:
                break
    save()
    stats = state.compression_stats()
    print(f"rank {rank}: step {step}, params {fingerprint(model.module)}, "
          f"{stats['ratio']:.1f}x fewer bytes per step", flush=True)
    del model, opt
    gc.collect()  # DDP holds the group: free it so gloo's threads stop before exit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
