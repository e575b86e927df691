"""gradzip.Codec and gradzip.ErrorFeedback on numpy arrays and torch tensors."""

import io
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import gradzip
from cuda_util import skip_unless_cuda_codecs

# Every registered codec's benchmark specs, and options that take other paths.
SPECS = list(dict.fromkeys(["none", "fp16", "bf16", "onebit", "onebit:block=64", "onebit:ef=off",
                            "topk:density=0.01", "topk:k=7,ef=off", "topk:density=0.05,select=sample"]
                           + [spec for c in gradzip.codec_info() for _, spec in c["bench_specs"]]))
N = 10_001  # odd, not a multiple of any block


def grad(seed=0, n=N):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def state_for(codec):
    return gradzip.ErrorFeedback() if codec.error_feedback else None


@pytest.mark.parametrize("spec", SPECS)
def test_error_feedback_invariant(spec):
    """decoded + new residual == gradient + old residual, step after step."""
    codec = gradzip.Codec(spec)
    state = state_for(codec)
    for step in range(3):
        g = grad(step)
        before = np.zeros(N, np.float32) if state is None or state.residual is None else state.residual.copy()
        payload = codec.encode(g, state)
        assert payload.dtype == np.uint8 and payload.ndim == 1
        if codec.fixed_size:
            assert payload.size == codec.max_payload_bytes(N)
        else:
            assert payload.size <= codec.max_payload_bytes(N)
        decoded = np.zeros(N, np.float32)
        codec.decode_accumulate(payload, decoded)
        if state is not None:
            np.testing.assert_allclose(decoded + state.residual, g + before, rtol=1e-5, atol=1e-5)
        elif spec == "none":
            np.testing.assert_array_equal(decoded, g)


@pytest.mark.parametrize("spec", SPECS)
def test_torch_and_numpy_give_the_same_bits(spec):
    codec = gradzip.Codec(spec)
    s_np, s_t = state_for(codec), state_for(codec)
    for step in range(2):
        g = grad(step)
        p_np = codec.encode(g, s_np)
        p_t = codec.encode(torch.from_numpy(g.copy()), s_t)
        assert isinstance(p_t, torch.Tensor) and p_t.dtype == torch.uint8
        np.testing.assert_array_equal(p_np, p_t.numpy())
        out = torch.zeros(N)
        codec.decode_accumulate(p_t, out)
        np.testing.assert_array_equal(codec.decode(p_np, max_n=N), out.numpy())


def test_arrays_are_used_in_place():
    codec = gradzip.Codec("onebit")
    state = gradzip.ErrorFeedback()
    g = torch.from_numpy(grad())
    codec.encode(g, state)
    residual = state.residual
    ptr = residual.data_ptr()
    codec.encode(g, state)
    assert state.residual is residual and residual.data_ptr() == ptr

    out = np.empty(codec.max_payload_bytes(N) + 64, np.uint8)
    payload = codec.encode(g, state, out=out)
    assert np.shares_memory(payload, out)

    acc = torch.zeros(N)
    codec.decode_accumulate(payload, acc)
    once = acc.clone()
    codec.decode_accumulate(payload, acc)
    torch.testing.assert_close(acc, 2 * once)


def test_multidimensional_and_grad_requiring_tensors():
    codec = gradzip.Codec("fp16")
    w = torch.randn(30, 40, requires_grad=True)
    payload = codec.encode(w, gradzip.ErrorFeedback())
    assert gradzip.payload_info(payload)["count"] == 1200


def test_bytes_payloads_and_payload_info():
    codec = gradzip.Codec("topk:k=5")
    payload = codec.encode(grad(), gradzip.ErrorFeedback())
    info = gradzip.payload_info(payload)
    assert info == {"codec": "topk", "count": N, "param": 5, "bytes": payload.size}
    out = np.zeros(N, np.float32)
    codec.decode_accumulate(payload.tobytes(), out)
    assert np.count_nonzero(out) == 5


class TestErrors:
    codec = gradzip.Codec("onebit")

    def test_hierarchy(self):
        assert issubclass(gradzip.InvalidArgument, ValueError)
        assert issubclass(gradzip.PayloadError, gradzip.InvalidArgument)
        assert issubclass(gradzip.IoError, RuntimeError)
        assert issubclass(gradzip.CudaError, RuntimeError)
        for e in (gradzip.InvalidArgument, gradzip.PayloadError, gradzip.IoError, gradzip.CudaError):
            assert issubclass(e, gradzip.GradzipError) and e.__module__ == "gradzip"

    def test_unknown_spec(self):
        with pytest.raises(gradzip.InvalidArgument, match="valid codecs"):
            gradzip.Codec("twobit")
        with pytest.raises(ValueError, match="block"):
            gradzip.Codec("onebit:block=0")

    @pytest.mark.parametrize("bad", [np.zeros(10, np.float64), np.zeros(10, np.int32), torch.zeros(10, dtype=torch.int16)])
    def test_wrong_dtype(self, bad):
        with pytest.raises(gradzip.InvalidArgument, match="grad must be float32, float16 or bfloat16"):
            self.codec.encode(bad, gradzip.ErrorFeedback())

    @pytest.mark.parametrize("bad", [np.zeros((10, 10), np.float32)[:, ::2], torch.zeros(10, 10).t()])
    def test_non_contiguous(self, bad):
        with pytest.raises(gradzip.InvalidArgument, match="contiguous"):
            self.codec.encode(bad, gradzip.ErrorFeedback())
        with pytest.raises(gradzip.InvalidArgument, match="contiguous"):
            self.codec.decode_accumulate(self.codec.encode(np.zeros(50, np.float32), gradzip.ErrorFeedback()), bad)

    def test_not_an_array(self):
        with pytest.raises(gradzip.InvalidArgument, match="numpy array or a torch tensor"):
            self.codec.encode([1.0, 2.0], gradzip.ErrorFeedback())

    def test_error_feedback_needs_a_state(self):
        with pytest.raises(gradzip.InvalidArgument, match="error feedback on"):
            self.codec.encode(grad())
        gradzip.Codec("onebit:ef=off").encode(grad())  # fine without

    def test_state_is_bound_to_one_buffer(self):
        state = gradzip.ErrorFeedback()
        self.codec.encode(grad(n=100), state)
        with pytest.raises(gradzip.InvalidArgument, match="one state per buffer"):
            self.codec.encode(grad(n=200), state)
        with pytest.raises(gradzip.InvalidArgument, match="one state per buffer"):
            gradzip.Codec("topk").encode(grad(n=100), state)
        with pytest.raises(gradzip.InvalidArgument, match="another framework"):
            self.codec.encode(torch.from_numpy(grad(n=100)), state)
        state.reset()
        self.codec.encode(grad(n=200), state)

    def test_read_only_and_small_outputs(self):
        payload = self.codec.encode(grad(), gradzip.ErrorFeedback())
        out = np.zeros(N, np.float32)
        out.flags.writeable = False
        with pytest.raises(gradzip.InvalidArgument, match="read-only"):
            self.codec.decode_accumulate(payload, out)
        with pytest.raises(gradzip.InvalidArgument, match="too small"):
            self.codec.encode(grad(), gradzip.ErrorFeedback(), out=np.zeros(16, np.uint8))

    def test_overlapping_buffers(self):
        g = grad()
        with pytest.raises(gradzip.InvalidArgument, match="overlap"):
            self.codec.encode_into(g, g, np.zeros(self.codec.max_payload_bytes(N), np.uint8))

    def test_payload_must_be_bytes(self):
        payload = self.codec.encode(grad(), gradzip.ErrorFeedback())
        with pytest.raises(gradzip.InvalidArgument, match="payload must be uint8"):
            self.codec.decode_accumulate(payload.view(np.int8), np.zeros(N, np.float32))

    @pytest.mark.parametrize("damage", ["truncate", "extend", "magic", "codec", "count"])
    def test_malformed_payload_leaves_out_untouched(self, damage):
        payload = self.codec.encode(grad(), gradzip.ErrorFeedback()).copy()
        n = N
        if damage == "truncate":
            payload = payload[:-4]
        elif damage == "extend":
            payload = np.concatenate([payload, np.zeros(4, np.uint8)])
        elif damage == "magic":
            payload[0] ^= 0xFF
        elif damage == "codec":
            payload = gradzip.Codec("fp16").encode(grad(), gradzip.ErrorFeedback())
        elif damage == "count":
            n = N - 1
        out = np.full(n, 7.0, np.float32)
        with pytest.raises(gradzip.PayloadError):
            self.codec.decode_accumulate(payload, out)
        assert (out == 7.0).all()

    def test_topk_indices_are_checked(self):
        codec = gradzip.Codec("topk:k=4")
        payload = codec.encode(grad(), gradzip.ErrorFeedback()).copy()
        payload[32:36] = payload[36:40]  # first index == second: not increasing
        with pytest.raises(gradzip.PayloadError):
            codec.decode_accumulate(payload, np.zeros(N, np.float32))


@pytest.mark.parametrize("spec", ["onebit", "topk:density=0.01", "topk:density=0.02,select=sample",
                                  "qsgd:bits=2,stochastic=on"])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_state_dict_restores_bit_identically(spec, framework):
    codec = gradzip.Codec(spec)
    wrap = (lambda a: a) if framework == "numpy" else torch.from_numpy

    def run(state, first, steps):
        return [bytes(np.asarray(codec.encode(wrap(grad(s)), state))) for s in range(first, first + steps)]

    original = gradzip.ErrorFeedback()
    run(original, 0, 4)
    saved = original.state_dict()
    if framework == "torch":  # the way a checkpoint travels
        buf = io.BytesIO()
        torch.save(saved, buf)
        saved = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    continued = run(original, 4, 4)

    fresh = gradzip.ErrorFeedback()
    fresh.load_state_dict(saved)
    assert run(fresh, 4, 4) == continued

    bound = gradzip.ErrorFeedback()
    run(bound, 100, 1)  # already bound: the restore copies in place
    bound.load_state_dict(saved)
    assert run(bound, 4, 4) == continued

    with pytest.raises(gradzip.InvalidArgument):
        gradzip.ErrorFeedback().load_state_dict({"version": 99})


def test_stochastic_rounding_is_keyed_by_the_state_step():
    codec = gradzip.Codec("qsgd:stochastic=on")
    g = grad(3)
    a, b = gradzip.ErrorFeedback(), gradzip.ErrorFeedback()
    first = bytes(codec.encode(g, a))
    assert a.step == 1
    assert bytes(codec.encode(g, b)) == first  # same residual, same step: same bits
    b.reset()
    assert bytes(codec.encode(g, b, step=7)) != first  # another step: other draws
    off = gradzip.Codec("qsgd:stochastic=on,ef=off")
    assert bytes(off.encode(g, step=2)) == bytes(off.encode(g, step=2))
    assert bytes(off.encode(g, step=2)) != bytes(off.encode(g, step=3))


def test_numpy_state_restores_into_torch():
    codec = gradzip.Codec("onebit")
    a = gradzip.ErrorFeedback()
    codec.encode(grad(0), a)
    b = gradzip.ErrorFeedback()
    b.load_state_dict(a.state_dict())
    p_a = codec.encode(grad(1), a)
    p_b = codec.encode(torch.from_numpy(grad(1)), b)
    np.testing.assert_array_equal(p_a, p_b.numpy())
    assert isinstance(b.residual, torch.Tensor)


def test_gil_is_released_while_encoding():
    codec = gradzip.Codec("topk:density=0.01")
    big = np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32)
    state = gradzip.ErrorFeedback()
    codec.encode(big, state)  # warm up the scratch

    ticks = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        time.sleep(0.05)
        seen = []
        for _ in range(3):
            before = ticks[0]
            codec.encode(big, state)  # tens of milliseconds
            seen.append(ticks[0] - before)
    finally:
        stop.set()
        t.join()
    # With the GIL held the counter could not move during the call.
    assert max(seen) > 1000, seen


def test_spec_helpers():
    info = gradzip.codec_info()
    assert gradzip.codec_names() == [c["name"] for c in info]
    assert gradzip.codec_names()[:5] == ["none", "fp16", "bf16", "onebit", "topk"]  # wire ids 1..5
    assert [c["id"] for c in info] == sorted(c["id"] for c in info)
    onebit = next(c for c in info if c["name"] == "onebit")
    assert onebit["keys"][0]["name"] == "block" and onebit["keys"][0]["default"] == 512
    topk = next(c for c in info if c["name"] == "topk")
    assert topk["sparse"] and topk["allgather_up_to_ranks"] == 16
    assert gradzip.Codec("topk").prefers_allgather(16) and not gradzip.Codec("fp16").prefers_allgather(3)
    assert gradzip.canonical_spec("onebit") == gradzip.Codec("onebit").spec
    # The parameters the C++ config holds, defaults included, typed.
    assert gradzip.Codec("topk:density=0.05").params == {"density": 0.05, "k": 0, "select": "exact"}
    assert gradzip.Codec("topk:k=7,select=sample").params["k"] == 7
    assert gradzip.Codec("onebit").params == {"block": 512}
    assert gradzip.Codec("fp8:format=e5m2").params["format"] == "e5m2"
    assert gradzip.Codec("none").params == {}
    assert gradzip.split_spec_list("none,fp16,topk:density=0.01,ef=off") == ["none", "fp16", "topk:density=0.01,ef=off"]
    assert len(gradzip.expand_spec_grid("topk:density=0.1,0.01,onebit:block=256,1024")) == 4
    assert gradzip.Codec("onebit").fixed_size and not gradzip.Codec("topk:select=sample").fixed_size
    assert "onebit" in repr(gradzip.Codec("onebit"))


def test_workspace_is_kept_per_codec_and_required_by_the_raw_calls():
    codec = gradzip.Codec("topk:density=0.01")
    g = grad(n=50_000)
    state = gradzip.ErrorFeedback()
    codec.encode(g, state)
    ws = codec._workspaces["cpu"]
    assert ws.nbytes >= codec.workspace_bytes(50_000)
    codec.encode(grad(1, n=50_000), state)
    assert codec._workspaces["cpu"] is ws  # reused, not reallocated
    codec.encode(grad(n=500_000), gradzip.ErrorFeedback())
    assert codec._workspaces["cpu"].nbytes >= codec.workspace_bytes(500_000)  # grown
    # The raw binding allocates nothing: without the workspace it asked for, it refuses.
    raw = gradzip._core.Codec("topk:density=0.01")
    payload = np.zeros(raw.max_payload_bytes(N), np.uint8)
    with pytest.raises(gradzip.InvalidArgument, match="needs a workspace"):
        raw.encode_into(grad(), np.zeros(N, np.float32), payload)
    raw.encode_into(grad(), np.zeros(N, np.float32), payload,
                    workspace=np.zeros(raw.workspace_bytes(N), np.uint8))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(scope="module")
def cuda_codecs():
    skip_unless_cuda_codecs()


@cuda
@pytest.mark.parametrize("spec", SPECS)
def test_cuda_matches_cpu_bit_for_bit(spec, cuda_codecs):
    codec = gradzip.Codec(spec)
    s_cpu, s_gpu = state_for(codec), state_for(codec)
    for step in range(2):
        g = torch.from_numpy(grad(step))
        p_cpu = codec.encode(g, s_cpu)
        p_gpu = codec.encode(g.cuda(), s_gpu)
        assert p_gpu.is_cuda
        assert torch.equal(p_cpu, p_gpu.cpu())
        if s_gpu is not None:
            assert s_gpu.residual.is_cuda and torch.equal(s_cpu.residual, s_gpu.residual.cpu())
        out = torch.zeros(N, device="cuda")
        codec.decode_accumulate(p_gpu, out)
        assert torch.equal(codec.decode(p_cpu, N), out.cpu())


@cuda
def test_cuda_device_mismatch_is_an_error():
    codec = gradzip.Codec("onebit")
    payload = codec.encode(torch.zeros(100), gradzip.ErrorFeedback())
    with pytest.raises(gradzip.InvalidArgument, match="same device"):
        codec.decode_accumulate(payload, torch.zeros(100, device="cuda"))


# 16-bit gradients: the payload and residual of a float16 / bfloat16 gradient
# are those of its float32 widening, and a 16-bit output gets the float sum
# rounded once (torch's .to() rounds to nearest even the same way).
@pytest.mark.parametrize("spec", ["onebit", "topk:density=0.05", "qsgd", "fp8", "bf16", "none", "onebit:ef=off",
                                  "topk:density=0.05,ef=off"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, np.float16], ids=["bf16", "fp16", "np_fp16"])
def test_16bit_gradients(spec, dtype):
    codec = gradzip.Codec(spec)
    n = 10007
    base = torch.randn(n, generator=torch.Generator().manual_seed(3))
    base[::101] = torch.tensor([0.0, -0.0, 1e-7, 65504.0, -1e-30] * 20)[: len(base[::101])]
    if dtype is np.float16:
        g16 = base.numpy().astype(np.float16)
        g32 = g16.astype(np.float32)
    else:
        g16 = base.to(dtype)
        g32 = g16.float()
    s16, s32 = gradzip.ErrorFeedback(), gradzip.ErrorFeedback()
    p16 = codec.encode(g16, s16)
    p32 = codec.encode(g32, s32)
    assert bytes(np.asarray(p16)) == bytes(np.asarray(p32))
    if codec.error_feedback:
        assert np.asarray(s16.residual).dtype == np.float32
        assert np.array_equal(np.asarray(s16.residual), np.asarray(s32.residual))
    out16 = g16.copy() if dtype is np.float16 else g16.clone()
    codec.decode_accumulate(p16, out16)
    ref = g32.copy() if dtype is np.float16 else g32.clone()
    codec.decode_accumulate(p32, ref)
    if dtype is np.float16:
        with np.errstate(over="ignore"):  # 65504 + a decoded value rounds to inf, as in gradzip
            assert np.array_equal(out16.view(np.uint16), ref.astype(np.float16).view(np.uint16))
    else:
        assert torch.equal(out16.view(torch.int16), ref.to(dtype).view(torch.int16))


def test_errors_say_what_is_wrong_and_name_the_source_only_when_asked():
    # An installed wheel's message is the message: no build folder, no file:line.
    with pytest.raises(gradzip.InvalidArgument) as plain:
        gradzip.Codec("qsgd:bits=9")
    assert str(plain.value).startswith("codec spec 'qsgd:bits=9': bits must be"), str(plain.value)
    assert not gradzip.error_locations()
    gradzip.set_error_locations(True)
    try:
        with pytest.raises(gradzip.InvalidArgument) as located:
            gradzip.Codec("qsgd:bits=9")
    finally:
        gradzip.set_error_locations(False)
    assert str(located.value) == "[compressors/spec.cc:" + str(located.value).split(":", 1)[1]
    assert str(located.value).endswith(str(plain.value))
    # GRADZIP_VERBOSE_ERRORS=1 at import turns them on.
    code = "import gradzip\ntry:\n    gradzip.Codec('qsgd:bits=9')\nexcept gradzip.InvalidArgument as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "GRADZIP_VERBOSE_ERRORS": "1"},
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.startswith("[compressors/spec.cc:"), out
