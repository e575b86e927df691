"""Issue 12 from Python: the DDP hook's agreement (both transports), typed
errors from the gradzip transport, bounded decodes, and saved states that are
checked before use."""

import math
import struct
import tracemalloc

import numpy as np
import pytest

import gradzip
import trust_workers
from dist_util import run_ranks
from saved_state import saved_state

HAS_UCX = gradzip.BUILD["comm"] and gradzip.BUILD["ucx"]


@pytest.fixture(scope="module")
def mismatches():
    return run_ranks(trust_workers.hook_mismatch_suite, 2, ["torch", "gradzip"] if HAS_UCX else ["torch"],
                     timeout=300)


CASES = [name for name, _, _ in trust_workers.MISMATCHES] + ["restored_on_one_rank"]


@pytest.mark.parametrize("transport", ["torch", "gradzip"])
@pytest.mark.parametrize("case", CASES)
def test_hook_mismatch_fails_on_every_rank_naming_ranks_and_values(mismatches, transport, case):
    # Before: one rank SIGABRT (gloo size mismatch), both ranks hung, a silent
    # acceptance, or "RuntimeError: Unable to cast ..." from the gradzip transport.
    if transport == "gradzip" and not HAS_UCX:
        pytest.skip("this gradzip build has no UCX transport")
    for rank, result in enumerate(mismatches):
        message, seconds = result[f"{transport}/{case}"]
        assert message.startswith("gradzip.InvalidArgument: gradzip DDP hook"), f"rank {rank}: {message}"
        assert "rank 0 '" in message and "rank 1 '" in message, message
        assert seconds < 30, f"rank {rank} took {seconds:.1f} s"


@pytest.mark.skipif(not HAS_UCX, reason="this gradzip build has no UCX transport")
def test_gradzip_transport_errors_keep_their_type():
    result = run_ranks(trust_workers.silent_peer, 2, timeout=120)
    assert result[1] == "silent"
    assert result[0].startswith("gradzip.IoError"), result[0]


def topk_payload_claiming(count: int) -> np.ndarray:
    codec = gradzip.Codec("topk:k=2")
    payload = codec.encode(np.ones(8, dtype=np.float32), gradzip.ErrorFeedback())
    p = payload.copy()
    p[16:24] = np.frombuffer(struct.pack("<Q", count), dtype=np.uint8)  # the header's element count
    return p


def test_decode_never_allocates_more_than_the_caller_allows():
    # Before: decode(payload) of 32 bytes allocated 4 GiB, then rejected it.
    codec = gradzip.Codec("topk:k=2")
    payload = topk_payload_claiming(1 << 30)
    tracemalloc.start()
    with pytest.raises(gradzip.InvalidArgument, match="max_n"):
        codec.decode(payload)
    with pytest.raises(gradzip.PayloadError):
        codec.decode(payload, max_n=1 << 20)
    with pytest.raises(gradzip.PayloadError):
        codec.decode(payload, 16)  # another count than the payload's
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated"
    good = codec.encode(np.arange(8, dtype=np.float32), gradzip.ErrorFeedback())
    assert codec.decode(good, max_n=8).shape == (8,)
    assert codec.decode(good, 8).shape == (8,)


def test_size_arithmetic_is_checked():
    for spec in ("none", "fp16", "onebit", "topk:density=0.01"):
        with pytest.raises(gradzip.InvalidArgument, match="limit"):
            gradzip.Codec(spec).max_payload_bytes(1 << 62)


@pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")
def test_saved_states_are_checked_before_use():
    state = gradzip.ErrorFeedback()
    state.load_state_dict({"version": 1, "data": saved_state()})  # the format as saved_state.py writes it is right
    assert state.layout["n"] == 8
    good = saved_state()
    cases = {
        "a damaged byte": (good[:-20] + bytes([good[-20] ^ 1]) + good[-19:], "checksum"),
        "NaN residual": (saved_state(residual=math.nan), "not finite"),
        "3e38 where the checksum disagrees": (good[:-12] + struct.pack("<f", 3e38) + good[-8:], "checksum"),
        "infinite residual": (saved_state(residual=math.inf), "not finite"),
        "3e38 with the checksum recomputed": (saved_state(residual=3e38), "over the limit of 2\\^64"),
        "n = 2^62": (saved_state(n=1 << 62, count=0), "limit"),
        "non-UTF-8 spec": (saved_state(spec=b"one\xffbit"), "printable"),
        "world 2^32-1": (saved_state(world=0xFFFFFFFF), "world size"),
    }
    for name, (data, word) in cases.items():
        for version in ({"version": 1}, {"version": 2, "role": "collective"}):
            with pytest.raises(gradzip.InvalidArgument, match=word):
                gradzip.ErrorFeedback().load_state_dict({**version, "data": data})
    with pytest.raises(gradzip.InvalidArgument):
        gradzip.ErrorFeedback().load_state_dict({"version": 1, "data": "not bytes"})


def test_error_feedback_rejects_non_finite_residuals():
    for bad in (math.nan, math.inf):
        residual = np.zeros(4, dtype=np.float32)
        residual[2] = bad
        with pytest.raises(gradzip.InvalidArgument, match="NaN or infinite"):
            gradzip.ErrorFeedback().load_state_dict({"version": 1, "codec": "onebit:block=512", "n": 4,
                                                     "residual": residual})
