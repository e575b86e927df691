"""One rank of training runs inside a real stack (transformers Trainer,
Accelerate, Lightning), with gradzip installed through its integration;
run under torchrun by test_stacks.py.

    stack_workers.py STACK ENTRY MODE FOLDER [ENTRY MODE FOLDER ...]

Each (ENTRY, MODE, FOLDER) is a job of its own, run one after the other in
the same two ranks (one torchrun launch: importing a stack on both ranks
costs more than its 8 steps): its own process group (made by the stack, or
by the job for the backend), destroyed at its end, the stack's process-wide
state (Accelerate's) reset, and the rank's stdout and stderr in a file of
the job's own, FOLDER/MODE-rank<r>.out. A job never reads what an earlier
one left in memory: test_stacks.py resumes in another launch than the one
that trained.

STACK: trainer | accelerate | lightning. ENTRY: hook | adamw | backend (| backend_rebuild:
Accelerate with DDP's default find_unused_parameters=False).
MODE: ``full`` trains STEPS steps and saves through the stack at step
SAVE_AT; ``resume`` resumes from that checkpoint and trains to STEPS;
``plain`` is ``resume`` without gradzip's integration (the stack's own
checkpoint only); ``top1`` (Lightning) is ``full`` keeping only the latest
checkpoint and last.ckpt; ``broken`` resumes after rank 1's gradzip file was
overwritten with garbage. Every rank writes one line to FOLDER/MODE-rank<r>.txt:
``RESULT rank=<r> digest=<sha256 of its parameters> gz=<what gradzip saw>``, or
``ERROR rank=<r> <exception>``. The launch exits 1 when a job raised, but for
``broken`` ones (whose error the test reads).
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings

import torch
import torch.distributed as dist

STEPS, SAVE_AT, BATCH, SEQ, VOCAB = 8, 4, 4, 16, 64


def digest(params) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


def tokens(n: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, VOCAB, (n, SEQ), generator=g)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def compression(entry: str, params=None):
    import gradzip.torch as gzt

    if entry == "hook":
        return gzt.CompressionState(warmup_steps=2)
    if entry == "adamw":
        return gzt.CompressedAdamW(params, lr=1e-3, min_warmup_steps=2, max_warmup_steps=3)
    if entry.startswith("backend"):
        return gzt.backend
    raise SystemExit(f"unknown entry {entry}")


def seen(entry: str, obj) -> str:
    if entry == "hook":
        return f"step{obj.step}"
    if entry == "adamw":
        return f"step{obj.compression_stats()['steps']}-compressing{int(obj.compressing)}"
    return "backend"


def rank_files(folder: str) -> None:
    if os.environ.get("RANK") == "1":
        for name in os.listdir(folder):
            if name.startswith("gradzip-rank1-"):
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(b"\x00not a checkpoint" * 7)


# -- transformers Trainer -------------------------------------------------------

def trainer(entry: str, mode: str, folder: str) -> str:
    from transformers import Trainer, TrainingArguments

    import gradzip.integrations.transformers as gz_trainer

    if entry == "backend":
        dist.init_process_group("cpu:gradzip,cuda:gradzip")
    data = [{"input_ids": t, "labels": t} for t in tokens()]
    args = TrainingArguments(output_dir=folder, max_steps=STEPS, save_steps=SAVE_AT, save_strategy="steps",
                             per_device_train_batch_size=BATCH, learning_rate=1e-3, logging_steps=1000,
                             report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0, save_only_model=False,
                             disable_tqdm=True, lr_scheduler_type="constant", warmup_steps=0)
    model = gpt2()
    obj = compression(entry, list(model.parameters()))
    t = Trainer(model=model, args=args, train_dataset=data,
                optimizers=(obj, None) if entry == "adamw" else (None, None))
    if mode != "plain":
        gz_trainer.compress(t, obj)
    elif entry == "hook":  # the stack's own checkpoint only: the hook installed by hand, its state not carried
        t.add_callback(_HookOnly(t, obj))
    if mode == "full":
        t.train()
    else:
        if mode == "broken":
            rank_files(os.path.join(folder, f"checkpoint-{SAVE_AT}"))
        t.train(resume_from_checkpoint=os.path.join(folder, f"checkpoint-{SAVE_AT}"))
    return f"digest={digest(model.parameters())} gz={seen(entry, obj)}"


try:
    from transformers import TrainerCallback

    class _HookOnly(TrainerCallback):
        def __init__(self, t, state):
            self.t, self.state = t, state

        def on_train_begin(self, args, state, control, **kw):
            from gradzip.torch import compression_hook

            self.t.model_wrapped.register_comm_hook(self.state, compression_hook)
except ImportError:  # pragma: no cover - the test skips without transformers
    pass


# -- Accelerate -----------------------------------------------------------------

def accelerate(entry: str, mode: str, folder: str) -> str:
    from accelerate import Accelerator, DistributedDataParallelKwargs
    from accelerate.utils import set_seed

    import gradzip.integrations.accelerate as gz_acc

    if entry.startswith("backend"):
        dist.init_process_group("cpu:gradzip,cuda:gradzip")
    # The backend resumes bit-identically only where DDP keeps one bucket layout (docs/python.md):
    # find_unused_parameters=True, as Trainer sets it.
    # ("backend_rebuild": DDP's default, which lays its buckets out again after the first step.)
    handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)] if entry == "backend" else []
    acc = Accelerator(cpu=True, kwargs_handlers=handlers)
    set_seed(0)
    model = gpt2()
    opt = compression("adamw", list(model.parameters())) if entry == "adamw" else \
        torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(tokens(), batch_size=BATCH, shuffle=True)
    model, opt, data = acc.prepare(model, opt, data)
    obj = opt if entry == "adamw" else compression(entry)
    if entry == "backend_rebuild":
        assert gz_acc._install.rebuilds_buckets(model)
    gz_acc.compress(acc, model, obj)
    ckpt = os.path.join(folder, "ckpt")
    start = 0
    if mode != "full":
        if mode == "broken":
            rank_files(ckpt)
        acc.load_state(ckpt)
        start = SAVE_AT
    step = 0
    while step < STEPS:
        skip = start - step if 0 < start - step < len(data) else 0
        loader = acc.skip_first_batches(data, skip) if skip else data
        step += skip
        for batch in loader:
            if step >= STEPS:
                break
            loss = model(input_ids=batch, labels=batch).loss
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            step += 1
            if mode == "full" and step == SAVE_AT:
                acc.save_state(ckpt)
    inner = opt.optimizer if entry == "adamw" else obj
    entry = "backend" if entry.startswith("backend") else entry
    return f"digest={digest(acc.unwrap_model(model).parameters())} gz={seen(entry, inner)}"


# -- Lightning ------------------------------------------------------------------

def lightning(entry: str, mode: str, folder: str) -> str:
    import lightning.pytorch as pl

    import gradzip.integrations.lightning as gz_pl

    class LM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = gpt2()

        def training_step(self, batch, _):
            return self.net(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            if entry == "adamw":
                return compression("adamw", list(self.parameters()))
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            # Every step shows a rank the same batch (rank 0 samples 0, 2, 4, 6; rank 1 the odd ones):
            # Lightning 2.6 resumes mid-epoch by replaying the epoch's batches from its start (a plain
            # DataLoader has no position to restore), so only data that does not depend on the position
            # makes the resumed run comparable bit for bit.
            data = tokens(2 * BATCH).repeat(STEPS, 1)
            sampler = torch.utils.data.DistributedSampler(data, shuffle=False)
            return torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)

    pl.seed_everything(0, verbose=False)
    module = LM()
    obj = compression(entry) if entry not in ("adamw", "none") else "optimizer"
    keep = 1 if mode == "top1" else -1  # top1: Lightning keeps the latest checkpoint (and last.ckpt) only
    ckpt_cb = pl.callbacks.ModelCheckpoint(dirpath=folder, every_n_train_steps=SAVE_AT, save_top_k=keep,
                                           filename="{step}", save_last=mode == "top1")
    strategy = pl.strategies.DDPStrategy(process_group_backend="cpu:gradzip,cuda:gradzip", find_unused_parameters=True) \
        if entry == "backend" else pl.strategies.DDPStrategy(process_group_backend="gloo")
    callbacks = [ckpt_cb] + ([gz_pl.GradzipCallback(obj)] if mode != "plain" and entry != "none" else [])
    t = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=STEPS, callbacks=callbacks,
                   logger=False, enable_progress_bar=False, enable_model_summary=False,
                   num_sanity_val_steps=0, use_distributed_sampler=False)
    path = os.path.join(folder, f"step={SAVE_AT}.ckpt")
    if mode == "broken":
        rank_files(os.path.join(folder, "gradzip", f"step-{SAVE_AT}"))
    t.fit(module, ckpt_path=None if mode in ("full", "top1") else path)
    what = "none" if entry == "none" else seen(entry, t.optimizers[0] if entry == "adamw" else obj)
    return f"digest={digest(module.parameters())} gz={what}"


def job(stack: str, entry: str, mode: str, folder: str, launch: "Launch", i: int) -> bool:
    """Runs one job on this rank; whether it succeeded."""
    rank = os.environ.get("RANK")

    def report(line: str) -> None:  # a file per rank: the ranks' stdout lines interleave
        print(line, flush=True)
        with open(os.path.join(folder, f"{mode}-rank{rank}.txt"), "w") as f:
            f.write(line + "\n")

    try:
        line = {"trainer": trainer, "accelerate": accelerate, "lightning": lightning}[stack](entry, mode, folder)
        report(f"RESULT rank={rank} {line}")
        return True
    except Exception as e:  # the test reads every rank's error
        import traceback

        traceback.print_exc()
        report(f"ERROR rank={rank} {type(e).__name__}: {e}")
        return False
    finally:
        import gc

        gc.collect()
        launch.end(i)
        if dist.is_initialized():
            dist.destroy_process_group()
        if stack != "lightning":  # Accelerate's process-wide state (Trainer runs on it): the next job starts anew
            from accelerate.state import AcceleratorState, GradientState

            AcceleratorState._reset_state(reset_partial_state=True)
            GradientState._reset_state()


class Launch:
    """What the jobs of one launch share: torchrun's store, through which
    each job gets a store of its own (a new job's: no key of an earlier
    job's process group is left in it), hosted by rank 0 on a free port."""

    def __init__(self) -> None:
        import datetime

        self.rank = int(os.environ["RANK"])
        self.store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                   timeout=datetime.timedelta(seconds=120))
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # rank 0 hosts each job's store

    def begin(self, i: int) -> None:
        import socket

        key = f"stack_workers/{i}/port"
        if self.rank == 0:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                self.store.set(key, str(sock.getsockname()[1]))
        os.environ["MASTER_PORT"] = self.store.get(key).decode()

    def end(self, i: int) -> None:
        """Both ranks are done with job i (before rank 0 closes its store)."""
        import time

        key = f"stack_workers/{i}/done"
        self.store.add(key, 1)
        while self.store.add(key, 0) < 2:
            time.sleep(0.01)


def main() -> None:
    stack, jobs = sys.argv[1], sys.argv[2:]
    if not jobs or len(jobs) % 3:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    warnings.simplefilter("always", RuntimeWarning)
    launch = Launch()
    ok = True
    saved = os.dup(1), os.dup(2)
    for i in range(0, len(jobs), 3):
        entry, mode, folder = jobs[i:i + 3]
        launch.begin(i)
        sys.stdout.flush(), sys.stderr.flush()
        with open(os.path.join(folder, f"{mode}-rank{launch.rank}.out"), "w") as out:  # this job's output alone
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            try:
                if not job(stack, entry, mode, folder, launch, i) and mode != "broken":
                    ok = False
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
