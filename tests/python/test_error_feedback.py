"""gradzip.ErrorFeedback: one state class for Codec.encode and for the
Communicator's collectives. Its roles, its state dicts (this release's and
the older ones of both roles), and the deprecated AllreduceState alias.
The collectives' own use of it runs on real ranks in test_comm.py and
test_fsdp.py; here a collective's state comes from bytes in its saved format."""

import io
import pickle
import warnings

import numpy as np
import pytest
import torch

import gradzip
from saved_state import saved_state

needs_comm = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="this gradzip build has no communicator")


def grad(seed, n=1000):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def encodes(codec, state, first, steps):
    return [bytes(np.asarray(codec.encode(grad(s), state))) for s in range(first, first + steps)]


def collective_state(**kw):
    ef = gradzip.ErrorFeedback()
    ef.load_state_dict({"version": 2, "role": "collective", "data": saved_state(**kw)})
    return ef


def test_a_new_state_is_unbound_and_takes_either_role():
    ef = gradzip.ErrorFeedback()
    assert (ef.role, ef.bound, ef.spec, ef.layout, ef.residual, ef.bytes, ef.step) == (None, False, None, None,
                                                                                        None, 0, 0)
    assert repr(ef) == "ErrorFeedback(unbound)"
    assert ef.state_dict() == {"version": 2, "role": None}
    gradzip.Codec("onebit").encode(grad(0), ef)
    assert (ef.role, ef.bound, ef.layout, ef.step) == ("codec", True, {"codec": "onebit:block=512", "n": 1000}, 1)
    assert ef.bytes == 4000 and ef.residual.shape == (1000,)
    assert repr(ef) == "ErrorFeedback(role='codec', codec='onebit:block=512', n=1000, step=1)"


@needs_comm
def test_a_collective_state_shows_its_layout():
    ef = collective_state(n=8)
    assert (ef.role, ef.bound, ef.spec, ef.residual, ef.step) == ("collective", True, "onebit", None, 0)
    assert ef.layout == {"codec": "onebit", "n": 8, "rank": 0, "world_size": 1, "algorithm": "allgather"}
    assert repr(ef) == "ErrorFeedback(role='collective', codec='onebit', n=8, rank=0/1, algorithm='allgather')"
    assert ef.state_dict() == {"version": 2, "role": "collective", "data": saved_state(n=8)}


@needs_comm
def test_a_collective_state_gives_its_residuals_and_changes_its_codec():
    ef = collective_state(n=8, residual=0.25)
    worker, server = ef.residuals()
    assert worker.dtype == np.float32 and worker.tolist() == [0.25] * 8 and server.size == 0
    ef.respec("topk:density=0.5")  # the same residual sizes under allgather
    assert ef.spec == "topk:density=0.5" and ef.residuals()[0].tolist() == [0.25] * 8
    with pytest.raises(gradzip.InvalidArgument, match="residuals would have 0"):
        ef.respec("none")  # no error feedback: no residual to keep
    assert ef.spec == "topk:density=0.5"
    for unbound in (gradzip.ErrorFeedback(), codec_state()):
        with pytest.raises(gradzip.InvalidArgument, match="collective"):
            unbound.residuals()
        with pytest.raises(gradzip.InvalidArgument, match="collective"):
            unbound.respec("onebit")


def codec_state():
    ef = gradzip.ErrorFeedback()
    gradzip.Codec("onebit").encode(grad(0), ef)
    return ef


@needs_comm
def test_a_state_serves_one_role_until_reset():
    codec = gradzip.Codec("onebit")
    collective = collective_state()
    for c in (codec, gradzip.Codec("onebit:ef=off")):  # without a residual too: its step keys draws
        with pytest.raises(gradzip.InvalidArgument) as e:
            c.encode(grad(0), collective)
        assert "Codec.encode" in str(e.value) and "collective" in str(e.value) and "reset()" in str(e.value)
    assert collective.state_dict()["data"] == saved_state()  # refused, untouched

    encoded = gradzip.ErrorFeedback()
    codec.encode(grad(0), encoded)
    before = encoded.residual.copy()
    with pytest.raises(gradzip.InvalidArgument) as e:
        encoded.load_state_dict({"version": 1, "data": saved_state()})
    assert "Codec.encode" in str(e.value) and "collective" in str(e.value)
    with pytest.raises(gradzip.InvalidArgument, match="Codec.encode"):
        collective.load_state_dict(encoded.state_dict())
    assert np.array_equal(encoded.residual, before) and encoded.role == "codec"

    collective.reset()  # unbinds the role as well
    assert collective.role is None and not collective.bound
    codec.encode(grad(0), collective)
    assert collective.role == "codec"
    encoded.reset()
    encoded.load_state_dict({"version": 1, "data": saved_state()})
    assert encoded.role == "collective"


def test_old_codec_state_dicts_load_and_continue_bit_identically():
    codec = gradzip.Codec("topk:density=0.02")
    original = gradzip.ErrorFeedback()
    encodes(codec, original, 0, 4)
    residual = original.residual.copy()
    continued = encodes(codec, original, 4, 4)
    # The dict gradzip.ErrorFeedback.state_dict() returned before it served collectives.
    old = {"version": 1, "codec": "topk:density=0.02", "n": 1000, "residual": residual, "step": 4}
    for framework in ("numpy", "torch"):
        saved = dict(old, residual=torch.from_numpy(residual)) if framework == "torch" else old
        fresh = gradzip.ErrorFeedback()
        fresh.load_state_dict(saved)
        assert (fresh.role, fresh.step) == ("codec", 4)
        assert encodes(codec, fresh, 4, 4) == continued, framework
    stepless = gradzip.ErrorFeedback()  # version 1 before it counted steps
    stepless.load_state_dict({"version": 1, "codec": "onebit", "n": 3, "residual": np.zeros(3, np.float32)})
    assert (stepless.role, stepless.step, stepless.layout["n"]) == ("codec", 0, 3)
    stepless.load_state_dict({"version": 1, "codec": None, "n": 0, "residual": None, "step": 0})  # unbound
    assert stepless.role is None and not stepless.bound


@needs_comm
def test_old_collective_state_dicts_load():
    # The dict gradzip.AllreduceState.state_dict() returned.
    ef = gradzip.ErrorFeedback()
    ef.load_state_dict({"version": 1, "data": saved_state(n=8, residual=0.25)})
    assert ef.role == "collective" and ef.layout["n"] == 8
    assert ef.state_dict()["data"] == saved_state(n=8, residual=0.25)  # the residuals came through
    ef.load_state_dict({"version": 1, "data": None})  # an unbound AllreduceState's
    assert ef.role is None and not ef.bound
    # (test_comm.py: such a dict continues a real allreduce bit-identically.)


@pytest.mark.parametrize("bad", [
    None, [], {"version": 3, "role": "codec"}, {"version": 2, "role": "server"}, {"version": 1},
    {"version": 2, "role": "collective", "data": "not bytes"},
    {"version": 2, "role": "codec", "codec": "onebit", "n": 4, "residual": np.zeros(3, np.float32)},
    {"version": 2, "role": "codec", "codec": "onebit", "n": 3, "residual": np.zeros(3, np.float32), "step": -1},
])
def test_malformed_state_dicts_are_refused(bad):
    ef = gradzip.ErrorFeedback()
    with pytest.raises(gradzip.InvalidArgument):
        ef.load_state_dict(bad)
    assert ef.role is None


@pytest.mark.parametrize("role", ["codec", pytest.param("collective", marks=needs_comm)])
def test_state_dicts_and_pickles_round_trip(role):
    ef = gradzip.ErrorFeedback()
    if role == "codec":  # on torch tensors: weights_only loads tensors, not numpy arrays
        for s in range(2):
            gradzip.Codec("onebit").encode(torch.from_numpy(grad(s)), ef)
    else:
        ef = collective_state()
    buf = io.BytesIO()
    torch.save(ef.state_dict(), buf)  # the way a checkpoint travels
    for copy in (gradzip.ErrorFeedback(), pickle.loads(pickle.dumps(ef))):
        if not copy.bound:
            copy.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
        assert (copy.role, copy.layout, copy.step, copy.bytes) == (ef.role, ef.layout, ef.step, ef.bytes)
        if role == "codec":
            assert torch.equal(copy.residual, ef.residual)
        else:
            assert copy.state_dict() == ef.state_dict()


@needs_comm
def test_allreduce_state_is_a_deprecated_alias():
    with pytest.warns(DeprecationWarning, match="use gradzip.ErrorFeedback"):
        old = gradzip.AllreduceState()
    assert isinstance(old, gradzip.ErrorFeedback)
    # The calls it had keep working, on the collective role.
    old.restore(saved_state())
    assert old.save() == saved_state() and old.role == "collective"
    assert old.memory_bytes == old.bytes
    assert repr(old).startswith("AllreduceState(role='collective'")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gradzip.ErrorFeedback()  # the name to use warns nothing
        assert pickle.loads(pickle.dumps(old)).save() == saved_state()
