"""gradzip.torch on CUDA tensors, for scripts/gpu-check.sh: the DDP hook,
FSDP2's reduce-scatter and BlockMomentum, each as small training runs on one
GPU (ranks share it), each check on its own so that one failure does not hide
the others.

    python3 tests/python/gpu_torch_check.py [--json FILE] [--list]

Checks (2 ranks share the GPU over gloo, whose point-to-point calls take no
CUDA tensors, so their gradzip exchanges go over gradzip's own UCX transport,
which stages device buffers through host memory; NCCL needs a GPU per rank,
so its checks run one rank):
  ddp_hook_ucx_2ranks      DDP hook, transport="gradzip", onebit and topk: same parameters on both ranks
  ddp_hook_nccl_1rank      DDP hook over a one-rank NCCL group (torch transport), codec none = no hook
  fsdp2_ucx_2ranks         fully_shard + gradzip.torch.fsdp.register, onebit: finite, same on both ranks
  bmuf_ucx_2ranks          BlockMomentum (onebit, transport="gradzip"), 2 blocks: same global model
  cadamw_ucx_2ranks        CompressedAdamW(codec="onebit", transport="gradzip") under DDP, past its
                           warm-up into the compressed stage, in fp32 and under bf16 autocast (the
                           optimizer keeps float32 parameters): same on both ranks
  cadamw_nccl_1rank        CompressedAdamW over a one-rank NCCL group (torch transport): compressed stage reached
  ddp_hook_bf16_ucx_2ranks a bfloat16 model through the DDP hook (onebit, qsgd): same on both ranks
  backend_ddp_1rank        DDP (no hook) on a "cpu:gradzip,cuda:gradzip" group, float32 and bfloat16
                           models, one rank: exact (the backend compresses nothing alone), DDP = no DDP
  backend_ddp_2gpus        the same on 2 ranks, a GPU each: compressed (qsgd 4-bit), same on both
                           ranks, a compressed all_reduce of device tensors = the host path's bits.
                           Skipped (not failed) on a machine with one GPU: the backend's CUDA path
                           runs over NCCL, which refuses two ranks on one device.
Exit status 0 when every check passed (a check that cannot run here, e.g. no
GPU, counts as skipped and fails the run: this script is only run where a GPU is).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from dist_util import run_ranks  # noqa: E402


# Where the checks run: "cuda" on the GPU machine; "cpu" (--device cpu) runs
# the same code on host tensors, so CI catches a broken check before GPU time
# is spent on it (tests/python/test_gpu_check_smoke.py).
DEVICE = os.environ.get("GZ_CHECK_DEVICE", "cuda")


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(DEVICE)


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in module.parameters()])


def _same_on_every_rank(x: torch.Tensor) -> bool:
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return all(torch.equal(parts[0], p) for p in parts)


def _batch(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(1000 * step + rank)
    return torch.randn(32, 256, device=DEVICE, generator=g)


def _train(ddp: torch.nn.Module, rank: int, steps: int = 4) -> None:
    """`steps` SGD steps of `ddp` on this rank's batches, then a device sync."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        ddp(_batch(rank, step)).square().mean().backward()
        opt.step()
    _sync()


def ddp_hook_ucx(rank: int, world: int) -> Dict[str, Any]:
    from gradzip.torch import CompressionState, compression_hook

    out = {}
    for codec in ("onebit", "topk:density=0.01", "fp16"):
        net = _net(0)
        ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.25)
        state = CompressionState(codec=codec, transport="gradzip")
        ddp.register_comm_hook(state, compression_hook)
        _train(ddp, rank)
        flat = _flat(net)
        out[codec] = bool(torch.isfinite(flat).all()) and _same_on_every_rank(flat) and state.step == 4
        del ddp, state
    return out


def ddp_hook_nccl_1rank(rank: int, world: int) -> Dict[str, Any]:
    import torch.distributed as dist

    from gradzip.torch import CompressionState, compression_hook

    nccl = dist.new_group(backend="nccl")

    def train(codec):
        net = _net(0)
        ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=nccl, bucket_cap_mb=0.25)
        if codec is not None:
            ddp.register_comm_hook(CompressionState(codec=codec, process_group=nccl), compression_hook)
        _train(ddp, rank)
        return _flat(net)

    plain = train(None)
    out = {"none_equals_no_hook": torch.equal(train("none"), plain)}
    for codec in ("onebit", "qsgd", "fp8"):
        out[codec] = bool(torch.isfinite(train(codec)).all())
    return out


def _host_staged_all_gather() -> Any:
    """FSDP2's parameter all-gather through host memory on the gloo group.

    The two ranks share one GPU, so NCCL cannot run them, and gloo's
    all_gather_into_tensor on CUDA tensors reads device memory from the host
    (a segfault in gloo::allgather, seen with torch 2.11). The all-gather is
    not what this check tests: gradzip replaces FSDP2's reduce-scatter only.
    """
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather

    class HostStaged(AllGather):
        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            out = torch.empty(output_tensor.shape, dtype=output_tensor.dtype)
            dist.all_gather_into_tensor(out, input_tensor.cpu(), group=group)
            output_tensor.copy_(out)
            return None

    return HostStaged()


def _full_on_host(model: torch.nn.Module) -> torch.Tensor:
    """The full parameters, gathered from each rank's local shards on the host
    (DTensor.full_tensor would all-gather CUDA tensors over gloo)."""
    import torch.distributed as dist

    parts = []
    for p in model.parameters():
        local = p.to_local().detach().float().cpu().contiguous()
        rows = torch.tensor([local.shape[0]])
        all_rows = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
        dist.all_gather(all_rows, rows)
        width = max(int(r) for r in all_rows)
        padded = torch.zeros((width,) + tuple(local.shape[1:]))
        padded[: local.shape[0]] = local
        gathered = [torch.empty_like(padded) for _ in all_rows]
        dist.all_gather(gathered, padded)
        parts += [g[: int(r)].reshape(-1) for g, r in zip(gathered, all_rows)]
    return torch.cat(parts)


def fsdp2_ucx(rank: int, world: int) -> Dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    from gradzip.torch import fsdp as gz_fsdp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(DEVICE)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if hasattr(module, "set_custom_all_gather"):
            module.set_custom_all_gather(_host_staged_all_gather())
    state = gz_fsdp.register(model, codec="onebit")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        g = torch.Generator(device=DEVICE).manual_seed(100 * step + rank)
        x = torch.randn(16, 64, device=DEVICE, generator=g)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    _sync()
    full = _full_on_host(model)
    s = state.compression_stats()
    return {"finite": bool(torch.isfinite(full).all()), "same": _same_on_every_rank(full),
            "compressed": s["calls"] > 0 and s["wire_ratio"] > 4}


def bmuf_ucx(rank: int, world: int) -> Dict[str, Any]:
    from gradzip.torch import BlockMomentum

    net = _net(0)
    local = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.8)
    opt = BlockMomentum(net, local, block_steps=2, codec="onebit", transport="gradzip")
    for step in range(4):
        local.zero_grad()
        net(_batch(rank, step)).square().mean().backward()
        opt.step()
    _sync()
    with opt.global_model():
        flat = _flat(net)
    blocks = opt.compression_stats()["blocks"]
    opt.close()
    return {"finite": bool(torch.isfinite(flat).all()), "same": _same_on_every_rank(flat), "blocks": blocks == 2}


def _cadamw_run(rank: int, dtype: torch.dtype, **kwargs: Any) -> Dict[str, Any]:
    """CompressedAdamW on `_net` under DDP, computing in `dtype` (bf16: autocast;
    the optimizer keeps float32 parameters and refuses others): 3 warm-up
    steps, then compressed ones; finite, compressing, the same on every rank."""
    import contextlib

    from gradzip.torch import CompressedAdamW

    net = _net(0)
    group = kwargs.pop("process_group", None)
    ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=group)
    opt = CompressedAdamW(net.parameters(), lr=1e-3, codec="onebit", min_warmup_steps=3, max_warmup_steps=3,
                          process_group=group, **kwargs)
    opt.register_ddp(ddp)
    for step in range(8):
        opt.zero_grad()
        with (torch.autocast(DEVICE, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()):
            loss = ddp(_batch(rank, step)).float().square().mean()
        loss.backward()
        opt.step()
    _sync()
    flat = _flat(net)
    return {"finite": bool(torch.isfinite(flat).all()), "compressing": opt.compressing,
            "same": group is not None or _same_on_every_rank(flat)}


def cadamw_ucx(rank: int, world: int) -> Dict[str, Any]:
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        out.update({f"{name}_{k}": v for k, v in _cadamw_run(rank, dtype, transport="gradzip").items()})
    return out


def cadamw_nccl_1rank(rank: int, world: int) -> Dict[str, Any]:
    import torch.distributed as dist

    return _cadamw_run(rank, torch.float32, process_group=dist.new_group(backend="nccl"), transport="torch")


def ddp_hook_bf16_ucx(rank: int, world: int) -> Dict[str, Any]:
    from gradzip.torch import CompressionState, compression_hook

    out = {}
    for codec in ("onebit", "qsgd:bits=4"):
        net = _net(0).to(torch.bfloat16)
        ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.25)
        state = CompressionState(codec=codec, transport="gradzip")
        ddp.register_comm_hook(state, compression_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(4):
            opt.zero_grad()
            ddp(_batch(rank, step).to(torch.bfloat16)).float().square().mean().backward()
            opt.step()
        _sync()
        flat = _flat(net)
        out[codec] = bool(torch.isfinite(flat).all()) and _same_on_every_rank(flat) and state.step == 4
        del ddp, state
    return out


def _backend_device(rank: int) -> torch.device:
    """This rank's device in the backend checks: a GPU of its own (NCCL, which
    the backend's CUDA path runs on, refuses two ranks on one GPU)."""
    if DEVICE != "cuda":
        return torch.device("cpu")
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def _backend_ddp(rank: int, world: int) -> Dict[str, Any]:
    """DDP with no hook on the gradzip backend's group ("cpu:gradzip,cuda:gradzip",
    the whole change a user makes), a float32 and a bfloat16 model: finite, the
    same on every rank; with one rank exact (the backend forwards every call,
    so DDP equals training without it, bit for bit); with more, compressed by
    the default policy (qsgd 4-bit), and a compressed all_reduce of device
    tensors equal to the same call on host tensors (the host engine's bits)."""
    import torch.distributed as dist

    from gradzip.torch import backend

    dev = _backend_device(rank)  # DEVICE's current GPU, so _net and _batch land there
    out: Dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        net = _net(0).to(dtype)
        twin = copy.deepcopy(net)
        ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[dev.index] if dev.type == "cuda" else None)
        before = backend.compression_stats()
        for model in (ddp, twin):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(4):
                opt.zero_grad()
                model(_batch(rank, step).to(dtype)).float().square().mean().backward()
                opt.step()
            if world > 1:
                break  # the twin compares only where the backend is exact
        if dev.type == "cuda":
            torch.cuda.synchronize()
        after = backend.compression_stats()
        flat = _flat(net)
        out[f"{name}_finite"] = bool(torch.isfinite(flat).all())
        out[f"{name}_same"] = _same_on_every_rank(flat)
        compressed = after["compressed_calls"] - before["compressed_calls"]
        if world == 1:
            out[f"{name}_exact"] = compressed == 0 and torch.equal(flat, _flat(twin))
        else:
            out[f"{name}_compressed"] = compressed > 0
        del ddp
    if world > 1:
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(1 << 16, generator=g)
        on_device, on_host = x.to(dev), x.clone()
        dist.all_reduce(on_device)
        dist.all_reduce(on_host)
        out["device_equals_host"] = torch.equal(on_device.cpu(), on_host)
    return out


# The gradzip backend's policy in its checks: the default codec, every tensor
# of the check's small model compressed, one algorithm on both transports (so
# that device and host bits can be compared).
_BACKEND_ENV = {"GRADZIP_POLICY": "codec=qsgd:bits=4;min_elements=1000;algorithm=allgather"}

CHECKS: Dict[str, tuple] = {
    "ddp_hook_ucx_2ranks": (ddp_hook_ucx, 2),
    "ddp_hook_nccl_1rank": (ddp_hook_nccl_1rank, 1),
    "fsdp2_ucx_2ranks": (fsdp2_ucx, 2),
    "bmuf_ucx_2ranks": (bmuf_ucx, 2),
    "cadamw_ucx_2ranks": (cadamw_ucx, 2),
    "cadamw_nccl_1rank": (cadamw_nccl_1rank, 1),
    "ddp_hook_bf16_ucx_2ranks": (ddp_hook_bf16_ucx, 2),
    # (fn, ranks, backend, environment, GPUs it needs)
    "backend_ddp_1rank": (_backend_ddp, 1, "cpu:gradzip,cuda:gradzip", _BACKEND_ENV, 1),
    "backend_ddp_2gpus": (_backend_ddp, 2, "cpu:gradzip,cuda:gradzip", _BACKEND_ENV, 2),
}


def run_check(fn: Callable, world: int, backend: str = "gloo", env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    start = time.monotonic()
    try:
        values = run_ranks(fn, world, timeout=150, backend=backend, env=env)
        flags = {k: all(bool(v[k]) for v in values) for k in values[0]}
        verdict = "PASS" if all(flags.values()) else "FAIL"
        detail = ", ".join(f"{k}={'ok' if ok else 'WRONG'}" for k, ok in flags.items())
    except BaseException as e:  # noqa: BLE001 - reported, the next check still runs
        verdict, detail = "FAIL", "".join(traceback.format_exception_only(type(e), e)).strip()[-2000:]
    return {"verdict": verdict, "detail": detail, "seconds": round(time.monotonic() - start, 1)}


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--list", action="store_true", help="print the checks' names and exit")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the same checks on host tensors (a smoke test of the script; NCCL checks skip)")
    ap.add_argument("--only", default="", help="comma-separated check names (default: all)")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(CHECKS))
        return 0
    os.environ["GZ_CHECK_DEVICE"] = args.device  # the ranks are new processes: they read DEVICE from it
    global DEVICE
    DEVICE = args.device
    chosen = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = sorted(set(chosen) - set(CHECKS))
    if unknown:
        ap.error(f"unknown checks {unknown}; --list shows them")
    results: Dict[str, Any] = {}
    if DEVICE == "cuda" and not torch.cuda.is_available():
        results = {name: {"verdict": "SKIP", "detail": "no CUDA device", "seconds": 0} for name in chosen}
    else:
        for name in chosen:
            fn, world, backend, env, gpus = (*CHECKS[name], "gloo", None, 0)[:5]
            if DEVICE == "cpu" and "nccl" in name:
                results[name] = {"verdict": "SKIP", "detail": "NCCL needs a GPU", "seconds": 0}
                continue
            if DEVICE == "cuda" and gpus > torch.cuda.device_count():
                results[name] = {"verdict": "SKIP", "seconds": 0, "needs_gpus": gpus,
                                 "detail": f"needs {gpus} GPUs (NCCL: a GPU per rank), this machine has "
                                           f"{torch.cuda.device_count()}"}
                print(f"SKIP {name}: {results[name]['detail']}", flush=True)
                continue
            results[name] = run_check(fn, world, backend, env)
            r = results[name]
            print(f"{r['verdict']} {name} ({r['seconds']} s): {r['detail']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    # On the GPU a skip fails the run, except a check that needs more GPUs
    # than the machine has.
    def passed(r: Dict[str, Any]) -> bool:
        return r["verdict"] == "PASS" or (r["verdict"] == "SKIP" and (DEVICE == "cpu" or "needs_gpus" in r))

    return 0 if all(passed(r) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
