"""The algorithm registry from Python (issue 23): one list of names, from C++,
and each algorithm's cost formula."""

import pytest

import gradzip

pytestmark = pytest.mark.skipif(not gradzip.BUILD["comm"], reason="built without gradzip's communication")


def test_names_come_from_the_registry() -> None:
    names = gradzip.allreduce_algorithm_names()
    assert names == ["auto", "allgather", "scatter_reduce", "hierarchical", "ring"]
    every = gradzip.algorithms()
    assert [a["name"] for a in every] == ["allgather", "scatter_reduce", "hierarchical", "reduce_scatter", "ring"]
    assert [a["name"] for a in every if a["allreduce"]] == names[1:]
    assert all(a["summary"] for a in every)
    assert [a["name"] for a in every if a["uniform_nodes"]] == ["hierarchical"]


def test_python_entry_points_take_the_registry_names() -> None:
    torch = pytest.importorskip("torch")
    from gradzip.torch import CompressionState

    for name in gradzip.allreduce_algorithm_names():
        CompressionState(codec="onebit", algorithm=name)
    with pytest.raises(ValueError, match="hierarchical"):
        CompressionState(codec="onebit", algorithm="butterfly")
    del torch


def test_wire_cost_is_the_payloads_the_algorithm_moves() -> None:
    from gradzip._core import scatter_reduce_chunks

    n, P = 262_912, 4
    onebit = gradzip.Codec("onebit")

    def body(codec: gradzip.Codec, k: int) -> int:  # a fixed-size payload crosses without its header
        return codec.max_payload_bytes(k) - 32

    c = gradzip.algorithm_wire_cost("allgather", "onebit", n, P)
    assert c["bytes"] == (P - 1) * body(onebit, n)
    assert c["rounds"] == 1 and c["messages"] == P - 1
    # scatter_reduce: each other rank's chunk (whole 512-element blocks), then
    # this rank's chunk sum (fp16 by default) to P-1 ranks.
    chunks = scatter_reduce_chunks(n, P, "onebit")
    assert [k for _, k in chunks] == [66_048, 66_048, 65_536, 65_280]
    fp16 = gradzip.Codec("fp16")
    c = gradzip.algorithm_wire_cost("scatter_reduce", "onebit", n, P, rank=0)
    assert c["bytes"] == sum(body(onebit, k) for _, k in chunks[1:]) + (P - 1) * body(fp16, chunks[0][1])
    assert c["rounds"] == 2
    same = gradzip.algorithm_wire_cost("scatter_reduce", "onebit", n, P, rank=1, server_codec="onebit")
    others = sum(body(onebit, k) for j, (_, k) in enumerate(chunks) if j != 1)
    assert same["bytes"] == others + (P - 1) * body(onebit, chunks[1][1])
    # Two nodes of two: only the shard's allgather across crosses to the other node.
    h = gradzip.algorithm_wire_cost("hierarchical", "onebit", n, P, nodes=[0, 0, 1, 1])
    assert h["remote_bytes"] == body(onebit, n // 2)
    assert h["rounds"] == 3
    # ring: every chunk but rank+1's partial sum, every chunk but rank+2's sum, all to one peer, in 2(P-1) rounds.
    r = gradzip.algorithm_wire_cost("ring", "onebit", n, P, rank=0)
    assert r["bytes"] == sum(body(onebit, k) for j, (_, k) in enumerate(chunks) if j != 1) + \
        sum(body(fp16, k) for j, (_, k) in enumerate(chunks) if j != 2)
    assert r["rounds"] == 2 * (P - 1) and r["messages"] == 2 * (P - 1)
    with pytest.raises(gradzip.InvalidArgument, match="unknown algorithm"):
        gradzip.algorithm_wire_cost("auto", "onebit", n, P)
    with pytest.raises(gradzip.InvalidArgument, match="rank"):
        gradzip.algorithm_wire_cost("allgather", "onebit", n, P, rank=P)
