"""What the gradzip.Communicator tests run on every rank (see dist_util.run_ranks)."""

from __future__ import annotations

import os
from typing import Any, Dict

import numpy as np
import torch
import torch.distributed as dist

import gradzip
from dist_util import free_port
from gradzip.experiments.two_phase import ScatterReduceModel


def data(rank: int, step: int, n: int) -> np.ndarray:
    return np.random.default_rng(100 * step + rank).standard_normal(n).astype(np.float32)


def gathered_equal(x: np.ndarray) -> bool:
    t = torch.from_numpy(np.ascontiguousarray(x))
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t)
    return all(torch.equal(everyone[0], e) for e in everyone)


def comm_suite(rank: int, world: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    n = 4099
    comm = gradzip.Communicator.from_torch()
    out["repr"] = repr(comm)
    out["rank_size"] = (comm.rank, comm.size)
    exact = sum(data(r, 0, n) for r in range(world))

    # none: the exact sum / average, on numpy and torch buffers.
    for algorithm in ("allgather", "scatter_reduce", "ring"):
        x = data(rank, 0, n)
        stats = comm.allreduce(x, gradzip.Codec("none"), gradzip.ErrorFeedback(), op="sum", algorithm=algorithm)
        out[f"none_sum/{algorithm}"] = float(np.abs(x - exact).max())
        out[f"stats/{algorithm}"] = stats
        t = torch.from_numpy(data(rank, 0, n))
        comm.allreduce(t, gradzip.Codec("none"), gradzip.ErrorFeedback(), op="avg", algorithm=algorithm)
        out[f"none_avg/{algorithm}"] = float(np.abs(t.numpy() - exact / world).max())

    # Lossy codecs: every rank ends with the same bits.
    for spec in ("onebit", "topk:density=0.01", "fp16", "topk:density=0.05,select=sample"):
        codec, state = gradzip.Codec(spec), gradzip.ErrorFeedback()
        for step in range(3):
            x = data(rank, step, n)
            comm.allreduce(x, codec, state)
        out[f"identical/{spec}"] = gathered_equal(x)
        out[f"layout/{spec}"] = state.layout
        # The ring over UCX processes: the same bits everywhere too.
        codec, state = gradzip.Codec(spec), gradzip.ErrorFeedback()
        for step in range(3):
            x = data(rank, step, n)
            comm.allreduce(x, codec, state, algorithm="ring")
        out[f"identical/{spec}/ring"] = gathered_equal(x)

    # scatter_reduce is the documented two-phase algorithm, bit for bit: the
    # NumPy model of it with gradzip.Codec that gradzip.experiments.two_phase
    # measures with (worker EF per chunk, the chunk sum re-encoded with the
    # server codec and server EF, average = sum x 1/P) gives the same output:
    # with the default server codec (fp16 for onebit) and with one given
    # (onebit, the former default).
    same = []
    out["server_codec_spec/onebit"] = gradzip.server_codec_spec("onebit")
    out["server_codec_spec/onebit/same"] = gradzip.server_codec_spec("onebit", "same")
    for server in (None, "onebit", "same"):  # "same": the codec itself, as every entry point reads it
        codec, state = gradzip.Codec("onebit"), gradzip.ErrorFeedback()
        model = ScatterReduceModel("onebit", world, "onebit" if server == "same" else server)
        for step in range(3):
            grads = [data(r, step, n) for r in range(world)]
            x = grads[rank].copy()
            comm.allreduce(x, codec, state, op="avg", algorithm="scatter_reduce", server_codec=server)
            same.append(bool(np.array_equal(model(grads), x)))
    out["scatter_reduce_matches_model"] = all(same)

    # Save and restore: continues bit-identically.
    codec = gradzip.Codec("onebit")
    state = gradzip.ErrorFeedback()
    for step in range(2):
        comm.allreduce(data(rank, step, n), codec, state, algorithm="scatter_reduce")
    saved = state.state_dict()
    after = [data(rank, step, n) for step in (2, 3)]
    for x in after:
        comm.allreduce(x, codec, state, algorithm="scatter_reduce")
    # This release's state dict, and the literal one gradzip.AllreduceState gave.
    for name, saved_dict in (("resume", saved), ("resume_v1", {"version": 1, "data": saved["data"]})):
        restored = gradzip.ErrorFeedback()
        restored.load_state_dict(saved_dict)
        again = [data(rank, step, n) for step in (2, 3)]
        for x in again:
            comm.allreduce(x, codec, restored, algorithm="scatter_reduce")
        out[name] = all(np.array_equal(a, b) for a, b in zip(after, again))

    # A state serves one role: one that Codec.encode bound is refused by the
    # collective before anything is sent (the same on every rank), and the
    # reverse.
    encoded, shared = gradzip.ErrorFeedback(), gradzip.ErrorFeedback()
    codec.encode(data(rank, 0, n), encoded)
    comm.allreduce(data(rank, 0, n), codec, shared)
    for name, call in (("encode_then_allreduce", lambda: comm.allreduce(data(rank, 0, n), codec, encoded)),
                       ("allreduce_then_encode", lambda: codec.encode(data(rank, 0, n), shared))):
        try:
            call()
            out[name] = None
        except gradzip.InvalidArgument as e:
            out[name] = str(e)

    # Ranks that disagree get the same clear error.
    spec = "onebit" if rank == 0 else "fp16"
    try:
        comm.allreduce(data(rank, 0, n), gradzip.Codec(spec), gradzip.ErrorFeedback())
        out["disagree"] = None
    except gradzip.InvalidArgument as e:
        out["disagree"] = str(e)

    # Bad input is refused before anything is sent.
    try:
        comm.allreduce(np.zeros(10), gradzip.Codec("none"), gradzip.ErrorFeedback())
    except gradzip.InvalidArgument as e:
        out["bad_dtype"] = str(e)
    for bad in ("twobit", 3):  # a server codec that is not one: refused before anything is sent
        try:
            comm.allreduce(np.zeros(10, np.float32), gradzip.Codec("onebit"), gradzip.ErrorFeedback(),
                           server_codec=bad)
        except gradzip.InvalidArgument as e:
            out[f"bad_server_codec/{bad}"] = str(e)
    comm.close()
    out["closed"] = repr(comm)

    # from_env: its own store, on a port other than torch's.
    port = torch.tensor([free_port() if rank == 0 else 0])
    dist.broadcast(port, 0)
    os.environ["MASTER_PORT"] = str(int(port))
    with gradzip.Communicator.from_env("ucx", timeout=30) as env_comm:
        x = data(rank, 0, n)
        env_comm.allreduce(x, gradzip.Codec("none"), gradzip.ErrorFeedback(), op="sum")
        out["from_env"] = float(np.abs(x - exact).max())
    return out
