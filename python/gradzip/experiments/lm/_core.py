"""The LM experiment's model, data, methods and training (the package doc: gradzip.experiments.lm)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import _backend_method

DEFAULT_METHODS = ["fp32", "torch-bf16", "onebit", "topk:density=0.01", "onebit@cm"]

LICENSES = "/usr/share/common-licenses"
# The distinct texts (GPL, LGPL and GFDL are links to the newest version).
LICENSE_FILES = ("Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.2", "GFDL-1.3", "GPL-1", "GPL-2", "GPL-3",
                 "LGPL-2", "LGPL-2.1", "LGPL-3", "MPL-1.1", "MPL-2.0")


@dataclass
class Settings:
    """Training settings; the defaults are the ones BENCHMARKS.md reports."""

    steps: int = 400              # 4 ranks: about 2 minutes on the loaded 2-vCPU machine; 600: about 3
    batch_per_rank: int = 8       # sequences per rank per step
    context: int = 64             # characters per sequence
    width: int = 64               # 0.21M parameters; 96: 0.46M (twice the compute)
    layers: int = 4
    heads: int = 4
    lr: float = 3e-3              # AdamW's peak; linear warm-up, then cosine to lr/10
    lr_warmup: int = 30
    weight_decay: float = 0.1
    betas: Tuple[float, float] = (0.9, 0.99)
    eval_every: int = 50          # validation loss of the shared model every N steps (and at the end)
    eval_sequences: int = 64
    threads_per_rank: int = 1
    corpus: str = "licenses"      # the text (text()): "licenses" (240 kB) or "stdlib" (about 10 MB of Python)
    device: str = "cpu"           # where the model and batches live (cuda: every rank on its current GPU)


@dataclass
class Result:
    method: str
    seed: int
    ranks: int
    steps: int
    val_loss: float
    train_loss: float
    wire_bytes: float             # this rank, over the whole run
    fp32_wire_bytes: float        # what fp32 DDP's ring allreduce sends over the same steps
    seconds: float
    curve: List[Tuple[int, float]] = field(default_factory=list)  # (step, validation loss)
    extra: Dict[str, Any] = field(default_factory=dict)
    # Rank 0's training seconds (evaluations left out) at each point of `curve`: time to accuracy.
    curve_seconds: List[float] = field(default_factory=list)
    lr: float = 0.0               # the peak learning rate the run used


# -- data -----------------------------------------------------------------------


CORPORA = ("licenses", "stdlib")
# What "stdlib" leaves out of the standard library: tests, IDLE, 2to3, installed packages.
STDLIB_SKIP = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__"}


def text(corpus: str = "licenses") -> Tuple[str, str, str]:
    """(training text, validation text, what it is); every file split 90/10.

    licenses: Debian's license texts (about 240 kB; Python's pydoc_data.topics where
    they are missing). A run long enough to converge sees them dozens of times over,
    and the validation loss then depends on how each run overfits.
    stdlib: the .py files of this interpreter's standard library (about 10 MB on
    Python 3.11), non-ASCII characters as '?': a few million characters of training
    text, so that a run of a few thousand steps sees each about once."""
    parts = []
    if corpus == "stdlib":
        import sysconfig

        root = sysconfig.get_paths()["stdlib"]
        files = []
        for here, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in STDLIB_SKIP and not d.startswith("config-"))
            files += [os.path.join(here, n) for n in names if n.endswith(".py")]
        for path in sorted(files, key=lambda f: os.path.relpath(f, root)):
            with open(path, "rb") as f:
                parts.append(f.read().decode("ascii", errors="replace").replace("\ufffd", "?"))
        what = (f"the standard library of Python {sys.version_info.major}.{sys.version_info.minor}."
                f"{sys.version_info.micro} ({root}: {len(parts)} files, {sum(map(len, parts)) / 1e6:.1f} MB)")
    elif corpus == "licenses":
        for name in LICENSE_FILES:
            path = os.path.join(LICENSES, name)
            if not os.path.isfile(path):
                parts = []
                break
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
        what = f"{LICENSES} ({len(parts)} texts)"
        if not parts:
            import pydoc_data.topics as topics

            parts = [topics.topics[k] for k in sorted(topics.topics)]
            what = f"pydoc_data.topics (Python {sys.version_info.major}.{sys.version_info.minor})"
    else:
        raise ValueError(f"corpus {corpus!r}: one of {', '.join(CORPORA)}")
    train, val = [], []
    for p in parts:
        cut = int(len(p) * 0.9)
        train.append(p[:cut])
        val.append(p[cut:])
    return "\n".join(train), "\n".join(val), what


class Corpus:
    """The text as character ids, with deterministic batches."""

    def __init__(self, settings: Settings) -> None:
        import torch

        train, val, self.what = text(settings.corpus)
        chars = sorted(set(train) | set(val))
        self.vocab = len(chars)
        # Character -> id through a table over the code points (millions of characters: no Python loop).
        table = torch.zeros(max(map(ord, chars)) + 1, dtype=torch.long)
        table[torch.tensor([ord(c) for c in chars])] = torch.arange(len(chars))
        self.train, self.val = (table[torch.frombuffer(bytearray(t.encode("utf-32-le")), dtype=torch.int32).long()]
                                for t in (train, val))
        self.settings = settings
        t = settings.context
        starts = torch.linspace(0, len(self.val) - t - 2, settings.eval_sequences).long()
        self.val_x = torch.stack([self.val[s:s + t] for s in starts])
        self.val_y = torch.stack([self.val[s + 1:s + t + 1] for s in starts])

    def batch(self, seed: int, step: int, rank: int) -> Tuple[Any, Any]:
        import torch

        g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1009 + rank)
        t = self.settings.context
        starts = torch.randint(0, len(self.train) - t - 1, (self.settings.batch_per_rank,), generator=g)
        x = torch.stack([self.train[s:s + t] for s in starts])
        y = torch.stack([self.train[s + 1:s + t + 1] for s in starts])
        return x, y


# -- model ----------------------------------------------------------------------


def model(vocab: int, settings: Settings, seed: int) -> Any:
    """A GPT-style decoder: token and position embeddings, pre-norm blocks
    (causal self-attention, 4x MLP with GELU), a final norm, a tied output head."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = settings.width
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(settings.context, d)
            self.blocks = nn.ModuleList(Block(d, settings.heads) for _ in range(settings.layers))
            self.ln = nn.LayerNorm(d)

        def forward(self, idx: Any) -> Any:
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for b in self.blocks:
                x = b(x)
            return self.ln(x) @ self.tok.weight.t()

    torch.manual_seed(seed)
    net = GPT()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.zero_()
    return net


def lr_at(step: int, settings: Settings) -> float:
    """Linear warm-up to lr, then cosine to lr/10 at the last step (a factor for LambdaLR)."""
    if step < settings.lr_warmup:
        return (step + 1) / settings.lr_warmup
    frac = (step - settings.lr_warmup) / max(settings.steps - settings.lr_warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0)))


# -- methods --------------------------------------------------------------------


@dataclass
class Method:
    forward: Any                          # what the batches go through
    optimizer: Any                        # zero_grad(), step()
    wire_bytes: Callable[[int], float]    # (steps) -> this rank's wire bytes over the run
    shared_model: Callable[[], Any] = contextlib.nullcontext
    finish: Callable[[], None] = lambda: None
    on_step: Callable[[int], None] = lambda step: None  # before each step's optimizer step
    extra: Dict[str, Any] = field(default_factory=dict)


def _options(method: str, family: str) -> Tuple[str, Dict[str, str]]:
    spec, _, rest = method.partition("@" + family)
    opts: Dict[str, str] = {}
    if rest:
        if not rest.startswith(":"):
            raise ValueError(f"method {method!r}: write <spec>@{family}:key=value,...")
        for item in rest[1:].split(","):
            key, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"method {method!r}: {item!r} is not key=value")
            opts[key] = value
    return spec, opts


def _adamw(params: Any, settings: Settings) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay)


def setup(method: str, net: Any, settings: Settings) -> Method:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradzip.torch import CompressionState, compression_hook

    p = dist.get_world_size()
    dense = 4.0 * sum(q.numel() for q in net.parameters())
    ring = 2.0 * (p - 1) / p
    if "@bmuf" in method:
        from .._digits_bmuf import parse
        from gradzip.torch import BlockMomentum

        head, _, opts = method.partition("@bmuf:")
        items = opts.split(",")
        lookahead = "eval=ahead" in items
        ramp = [float(i[5:]) for i in items if i.startswith("lrto=")]
        late = [tuple(int(v) for v in i[6:].split(":")) for i in items if i.startswith("hlate=")]
        spec, kwargs = parse(f"{head}@bmuf:" + ",".join(i for i in items if i != "eval=ahead" and not
                                                         i.startswith(("lrto=", "hlate="))))
        kwargs.setdefault("transport", "torch")
        opt = BlockMomentum(net, _adamw(net.parameters(), settings), codec=spec, **kwargs)
        lr0 = opt.block_lr

        def on_step(step: int) -> None:  # lrto=X: block_lr from lr at step 0 to X at the last step
            if ramp:
                opt.block_lr = lr0 + (ramp[0] - lr0) * step / max(settings.steps - 1, 1)
            for at, h in late:  # hlate=S:H: blocks of H steps from step S on
                if step == at:
                    opt.block_steps = h

        def finish() -> None:
            opt.sync()
            opt.close()

        return Method(net, opt, lambda steps: opt.compression_stats()["wire_bytes_per_step"] * steps,
                      shared_model=lambda: opt.global_model(lookahead=lookahead), finish=finish, on_step=on_step,
                      extra={"block_momentum": opt.block_momentum, "block_lr": opt.block_lr,
                             "sync_steps": opt.sync_steps, "lookahead": lookahead,
                             "exact_below": opt.exact_below})
    if "@cm" in method:
        from gradzip.torch import CompressedAdamW

        spec, opts = _options(method, "cm")
        kw: Dict[str, Any] = {}
        if "warmup" in opts:
            kw["max_warmup_steps"] = int(opts["warmup"])
            kw["min_warmup_steps"] = min(int(opts["warmup"]), int(opts.get("min", 10 ** 9)),
                                         CompressedAdamW.DEFAULT_MIN_WARMUP)
        if "min" in opts:
            kw["min_warmup_steps"] = int(opts["min"])
        if "wcodec" in opts:  # '+' stands for ',' inside it: wcodec=fp8:block=32+ef=off
            kw["warmup_codec"] = opts["wcodec"].replace("+", ",")
        if "refresh" in opts:
            kw["variance_refresh"] = int(opts["refresh"])
        if "tol" in opts:
            kw["variance_tolerance"] = float(opts["tol"])
        if "server" in opts:
            kw["server_codec"] = opts["server"]
        if "mode" in opts:  # momentum | innovation (what travels: the momentum, or its change)
            kw["compress"] = opts["mode"]
        if "sw" in opts:  # DGC's sparsity warm-up: compressed steps, start density, stages
            kw["sparsity_warmup"] = int(opts["sw"])
        if "sws" in opts:
            kw["sparsity_start"] = float(opts["sws"])
        if "stages" in opts:
            kw["sparsity_stages"] = int(opts["stages"])
        if "clip" in opts:
            kw["clip_norm"] = float(opts["clip"])
        if "lvar" in opts:  # mode=update: each rank's own second moment, never frozen
            kw["local_variance"] = opts["lvar"] in ("1", "on", "true")
        if "mask" in opts:  # DGC's momentum factor masking (mode=update)
            kw["factor_masking"] = opts["mask"] in ("1", "on", "true")
        ddp = DDP(net)
        opt = CompressedAdamW(ddp.parameters(), lr=settings.lr, betas=settings.betas,
                              weight_decay=settings.weight_decay, codec=spec, **kw)
        opt.register_ddp(ddp)

        def extra_of() -> Dict[str, Any]:
            return {"warmup_steps": opt.compression_stats()["warmup_steps"]}

        m = Method(ddp, opt, lambda steps: opt.compression_stats()["wire_bytes"])
        m.finish = lambda: m.extra.update(extra_of())
        return m
    if _backend_method.belongs(method):
        return _backend(method, net, settings)
    if "@diloco" in method:  # torchft's DiLoCo, its exchange through gradzip's torchft group (_diloco.py)
        from . import _diloco

        return _diloco.setup(method, net, settings)
    ddp = DDP(net)
    opt = _adamw(ddp.parameters(), settings)
    if method == "fp32":
        return Method(ddp, opt, lambda steps: ring * dense * steps)
    if method == "torch-bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        return Method(ddp, opt, lambda steps: ring * dense / 2 * steps)
    if method == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return Method(ddp, opt, lambda steps: ring * dense / 2 * steps)
    from .._digits_bmuf import exact_below_of

    spec, opts = _options(method, "hook")
    kw = {}
    for key, value in opts.items():
        if key == "warmup":
            kw["warmup_steps"] = int(value)
        elif key == "algorithm":
            kw["algorithm"] = value
        elif key == "server":
            kw["server_codec"] = value
        elif key == "exact":
            kw["exact_below"] = "auto" if value == "auto" else exact_below_of(method, value)  # auto: the hook's own
        elif key == "until":  # the measured warm-up (CompressionState's warmup_until)
            kw["warmup_until"] = float(value)
        elif key == "patience":
            kw["warmup_patience"] = int(value)
        elif key == "wmax":
            kw["warmup_max"] = int(value)
        elif key in ("adaptive", "pre"):
            kw["adaptive" if key == "adaptive" else "precondition"] = {"on": True, "off": False, "auto": "auto"}[value]
        else:
            raise ValueError(f"method {method!r}: unknown hook option {key!r} (warmup, algorithm, server, exact, "
                             "adaptive, pre, until, patience, wmax)")
    state = CompressionState(codec=spec, **kw)
    ddp.register_comm_hook(state, compression_hook)
    m = Method(ddp, opt, lambda steps: state.compression_stats()["wire_bytes_per_step"] * steps,
               extra={"state": repr(state)})
    if state.warmup_until is not None:
        m.finish = lambda: m.extra.update({"uncompressed_steps": state.compression_stats()["uncompressed_steps"],
                                           "warmup_ended_at": state.compression_stats()["warmup_ended_at"],
                                           "warmup_trace": [list(t) for t in state._warm.trace]})
    return m


def _backend(method: str, net: Any, settings: Settings) -> Method:
    """DDP without a hook on a gradzip backend group (the method list's ``backend``)."""
    ddp, wire, extra = _backend_method.setup(method, net)
    m = Method(ddp, _adamw(ddp.parameters(), settings), wire)
    m.finish = lambda: m.extra.update(extra())
    return m


# -- training -------------------------------------------------------------------


def clock(dev: Any) -> float:
    """perf_counter once the device's queued work is done (CUDA runs ahead of the host)."""
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter()


def train_one(method: str, seed: int, settings: Settings, corpus: Corpus) -> Result:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rank, ranks = dist.get_rank(), dist.get_world_size()
    dev = torch.device(settings.device)
    net = model(corpus.vocab, settings, seed).to(dev)
    m = setup(method, net, settings)
    inner = getattr(m.optimizer, "local_optimizer", m.optimizer)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: lr_at(s, settings))
    val_x, val_y = corpus.val_x.to(dev), corpus.val_y.to(dev)

    def val_loss() -> float:
        with torch.no_grad(), m.shared_model():
            logits = net(val_x)
            return float(F.cross_entropy(logits.reshape(-1, corpus.vocab), val_y.reshape(-1)))

    curve: List[Tuple[int, float]] = []
    curve_seconds: List[float] = []
    paused, loss_sum, loss_n = 0.0, 0.0, 0
    t0 = clock(dev)
    for step in range(settings.steps):
        x, y = (z.to(dev) for z in corpus.batch(seed, step, rank))
        m.optimizer.zero_grad()
        loss = F.cross_entropy(m.forward(x).reshape(-1, corpus.vocab), y.reshape(-1))
        loss.backward()
        m.on_step(step)
        m.optimizer.step()
        sched.step()
        if step >= settings.steps - 50:
            loss_sum += loss.item()
            loss_n += 1
        if settings.eval_every and (step + 1) % settings.eval_every == 0 and step + 1 < settings.steps:
            te = clock(dev)
            curve_seconds.append(te - t0 - paused)
            curve.append((step + 1, val_loss()))
            # Every rank evaluates; they start the next step together, so that no rank's
            # evaluation shows up as another's wait in the exchange (the clock is paused).
            dist.barrier()
            paused += time.perf_counter() - te
    m.finish()
    seconds = clock(dev) - t0 - paused
    final = val_loss()
    curve.append((settings.steps, final))
    curve_seconds.append(seconds)
    with torch.no_grad(), m.shared_model():
        flat = torch.cat([q.detach().reshape(-1) for q in net.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(ranks)]
    dist.all_gather(everyone, flat)
    extra = dict(m.extra)
    extra["identical_on_all_ranks"] = all(torch.equal(everyone[0], e) for e in everyone)
    extra["parameters"] = int(flat.numel())
    extra["text"] = corpus.what
    dense = 4.0 * flat.numel()
    return Result(method, seed, ranks, settings.steps, final, loss_sum / max(loss_n, 1),
                  float(m.wire_bytes(settings.steps)), 2.0 * (ranks - 1) / ranks * dense * settings.steps,
                  seconds, curve, extra, curve_seconds, settings.lr)


def _train_all(runs: Sequence[Tuple[str, int, Optional[float]]], settings: Settings,
               records: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every (method, seed, learning rate) of `runs` in order (None: settings.lr); rank 0
    appends each run's record, with its settings, to `records` (JSON lines) as it ends."""
    import torch.distributed as dist

    corpus = Corpus(settings)
    out = []
    for method, seed, lr in runs:
        run_settings = settings if lr is None else replace(settings, lr=lr)
        r = asdict(train_one(method, seed, run_settings, corpus))
        out.append(r)
        if dist.get_rank() == 0:
            print(f"  seed {seed} lr {run_settings.lr:.4g} {method:<36} val {r['val_loss']:.4f} wire "
                  f"{r['fp32_wire_bytes'] / r['wire_bytes']:.1f}x fewer ({r['seconds']:.0f} s)", file=sys.stderr,
                  flush=True)
            if records:
                with open(records, "a") as f:
                    f.write(json.dumps({**r, "settings": asdict(run_settings)}) + "\n")
    return out


def runs_of(methods: Sequence[str], seeds: Sequence[int]) -> List[Tuple[str, int, Optional[float]]]:
    """Every method with every seed (seed by seed) at the settings' learning rate."""
    return [(m, s, None) for s in seeds for m in methods]


def _worker(rank: int, ranks: int, port: int, runs: Sequence[Tuple[str, int, Optional[float]]],
            settings: Settings, records: Optional[str], out_path: str) -> None:
    from ..digits import Settings as DigitsSettings, _in_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ranks),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ranks))
    group_settings = DigitsSettings(threads_per_rank=settings.threads_per_rank)
    results = _in_group(rank, ranks, group_settings, lambda: _train_all(runs, settings, records))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def run(methods: Sequence[str], seeds: Sequence[int] = (0,), ranks: int = 4, settings: Optional[Settings] = None,
        timeout: float = 3600.0) -> List[Dict[str, Any]]:
    """Trains every method with every seed on `ranks` local CPU processes; one
    dict per (seed, method) (the fields of :class:`Result`)."""
    return run_list(runs_of(methods, seeds), ranks, settings, timeout)


def run_list(runs: Sequence[Tuple[str, int, Optional[float]]], ranks: int = 4, settings: Optional[Settings] = None,
             timeout: float = 3600.0, records: Optional[str] = None) -> List[Dict[str, Any]]:
    """Trains each (method, seed, peak learning rate or None for the settings') in
    one launch of `ranks` local CPU processes; `records`: see _train_all."""
    from ..digits import _run_ranks

    return _run_ranks(_worker, "lm", ranks, (list(runs), settings or Settings(), records), timeout)


def summarize(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (method, learning rate): mean final validation loss, % vs fp32 on the
    same seeds (fp32 at the same learning rate, or at its one rate when it ran at one
    only), wire ratio, time."""
    import statistics

    keys = list(dict.fromkeys((r["method"], r.get("lr")) for r in results))
    fp32 = [r for r in results if r["method"] == "fp32"]
    one_rate = len({r.get("lr") for r in fp32}) == 1
    base = {(r["seed"], None if one_rate else r.get("lr")): r["val_loss"] for r in fp32}
    rows = []
    for m, lr in keys:
        rs = [r for r in results if r["method"] == m and r.get("lr") == lr]
        at = [(r, base.get((r["seed"], None if one_rate else lr))) for r in rs]
        deltas = [100.0 * (r["val_loss"] / b - 1.0) for r, b in at if b is not None]
        rows.append({
            "method": m,
            "lr": lr,
            "ranks": rs[0]["ranks"],
            "val_loss": statistics.mean(r["val_loss"] for r in rs),
            "vs_fp32_percent": statistics.mean(deltas) if deltas else math.nan,
            "wire_bytes": statistics.mean(r["wire_bytes"] for r in rs),
            "wire_ratio": statistics.mean(r["fp32_wire_bytes"] for r in rs) / statistics.mean(
                r["wire_bytes"] for r in rs),
            "seconds": statistics.mean(r["seconds"] for r in rs),
            "identical_on_all_ranks": all(r["extra"].get("identical_on_all_ranks") for r in rs),
            "extra": rs[0]["extra"],
        })
    return rows


def describe_settings(settings: Settings, ranks: int, seeds: Sequence[int], parameters: Optional[int] = None,
                      text_: Optional[str] = None) -> str:
    """The run's settings in one sentence (above its tables); the learning rate is each run's."""
    where = "CPU ranks" if settings.device == "cpu" else f"ranks on {settings.device}"
    size = f"{parameters:,} parameters: " if parameters else ""
    return (f"Char-level GPT ({size}{settings.layers} layers, width {settings.width}, context {settings.context})"
            f"{' on ' + text_ if text_ else ''}, {ranks} {where} (gloo), {settings.steps} steps, batch "
            f"{settings.batch_per_rank}x{settings.context}/rank, AdamW (warm-up {settings.lr_warmup} steps, cosine "
            f"to a tenth of the peak) wd {settings.weight_decay:g}; seeds {', '.join(map(str, seeds))}.")


def describe(rows: List[Dict[str, Any]], settings: Settings, seeds: Sequence[int]) -> str:
    """describe_settings with the parameter count, the text and the peak learning rate(s) of `rows`."""
    r0 = rows[0]
    lrs = sorted({r["lr"] for r in rows if r.get("lr")}) or [settings.lr]
    return (describe_settings(settings, r0["ranks"], seeds, r0["extra"].get("parameters"), r0["extra"].get("text"))
            + f" Peak lr {', '.join(f'{lr:g}' for lr in lrs)}.")


def markdown(rows: List[Dict[str, Any]], settings: Settings, seeds: Sequence[int]) -> str:
    several = len({r.get("lr") for r in rows}) > 1
    lines = [
        describe(rows, settings, seeds) + (" vs fp32: fp32 at the same learning rate, not tuned (--tune compares "
                                           "with fp32 at its best)." if several else ""),
        "",
        "| method | lr | val loss | vs fp32 | wire ratio vs fp32 DDP | wire MB/rank | s | ranks identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        delta = "" if r["method"] == "fp32" else f"{r['vs_fp32_percent']:+.2f}%"
        lines.append(f"| {r['method']} | {r['lr'] or settings.lr:g} | {r['val_loss']:.4f} | {delta} | "
                     f"{r['wire_ratio']:.1f}x | {r['wire_bytes'] / 1e6:.1f} | {r['seconds']:.0f} | "
                     f"{r['identical_on_all_ranks']} |")
    return "\n".join(lines) + "\n"


def plateau(records: Sequence[Dict[str, Any]]) -> float:
    """How much the validation loss fell over the last 20% of the steps, in % of the final
    loss (from the evaluation at or just before 80% of the steps), mean over `records`."""
    import statistics

    out = []
    for r in records:
        at = 0.8 * r["steps"]
        before = [loss for step, loss in r["curve"] if step <= at]
        if not before:
            raise ValueError(f"{r['method']} seed {r['seed']}: no evaluation before 80% of the steps (--eval-every)")
        out.append(100.0 * (before[-1] / r["val_loss"] - 1.0))
    return statistics.mean(out)


def tune_plot(tuned: Any, path: str) -> None:
    """Final validation loss against the peak learning rate (first seed), one line per method;
    the other seeds as dots at each method's best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in tuned.t.methods:
        lrs, losses = zip(*tuned.grid_values(m))
        line, = ax.plot(lrs, losses, marker="o", label=m)
        best = tuned.best[m]
        ax.scatter([best] * len(tuned.seeds), tuned.values(m, best), color=line.get_color(), s=12, zorder=3)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final validation loss (nats/char)")
    ax.set_title("learning-rate grid (lines: first seed; dots: every seed at the best)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(results: List[Dict[str, Any]], path: str) -> None:
    """Validation loss against step, one line per (method, seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw_curves(ax, results, seconds=False)
    ax.set_title(f"char-level GPT, {results[0]['ranks']} ranks, AdamW")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_curves(ax: Any, results: List[Dict[str, Any]], seconds: bool) -> None:
    """Validation loss of each (method, seed) on a matplotlib axis, against the step or
    (seconds=True) the training seconds of Result.curve_seconds."""
    for r in results:
        steps, losses = zip(*r["curve"])
        ratio = r["fp32_wire_bytes"] / r["wire_bytes"]
        ax.plot(r["curve_seconds"] if seconds else steps, losses,
                label=f"{r['method']} ({ratio:.0f}x)" + (f" s{r['seed']}" if r["seed"] else ""))
    ax.set_xlabel("training seconds (rank 0, evaluations left out)" if seconds else "step")
    ax.set_ylabel("validation loss (nats/char)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def split_methods(text_: str) -> List[str]:
    """Methods may hold commas (topk:density=0.01,ef=off; onebit@bmuf:h=8,mu=0.5): an
    element that does not start with a method's or codec's name continues the previous one."""
    import gradzip

    names = {"fp32", "torch-bf16", "backend", *gradzip.codec_names()}
    out: List[str] = []
    for part in text_.split(","):
        name = part.split("@")[0].split("/")[0].split(":")[0].split("=")[0]
        if out and name not in names and not name.startswith("torch-"):  # torch's hooks: torch-bf16, torch-fp16
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def settings_args(settings: Settings) -> List[str]:
    """The command-line flags that give `settings` back through settings_of (a launched rank's)."""
    return ["--steps", str(settings.steps), "--batch", str(settings.batch_per_rank), "--eval-every",
            str(settings.eval_every), "--width", str(settings.width), "--layers", str(settings.layers),
            "--heads", str(settings.heads), "--context", str(settings.context), "--device", settings.device,
            "--eval-sequences", str(settings.eval_sequences), "--lr-warmup", str(settings.lr_warmup),
            "--corpus", settings.corpus]
