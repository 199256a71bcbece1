"""The sharding algebra: resharding between any two legal layouts is a valid collective chain."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.errors import SpecError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.simulator.collectives import plan_collective
from trainsim.workloads.sharding.mesh import DeviceMesh, parse_mesh
from trainsim.workloads.sharding.spec import (
    grad_spec_of_input,
    grad_spec_of_output,
    local_bytes,
    reshard,
)

CLUSTER = parse_cluster("2x4xA100-SXM4-40GB")
MESHES = [DeviceMesh((8,)), DeviceMesh((2, 4)), DeviceMesh((4, 2)), DeviceMesh((4,))]


def test_mesh_groups_follow_row_major_axes() -> None:
    mesh = DeviceMesh((2, 4))
    assert mesh.groups(0) == [(0, 4), (1, 5), (2, 6), (3, 7)]  # across the two nodes
    assert mesh.groups(1) == [(0, 1, 2, 3), (4, 5, 6, 7)]  # inside a node
    assert parse_mesh("2x4", 8) == mesh
    with pytest.raises(SpecError):
        parse_mesh("4x4", 8)


def test_hand_checked_reshards() -> None:
    mesh = DeviceMesh((4,))
    size = 1000.0
    assert reshard(("R",), ("T",), mesh, size) == []  # a local slice
    (ag,) = reshard(("T",), ("R",), mesh, size)
    assert (ag.kind, ag.size_bytes) == ("all_gather", size)
    (ar,) = reshard(("P",), ("R",), mesh, size)
    assert (ar.kind, ar.size_bytes) == ("all_reduce", size)
    (rs,) = reshard(("P",), ("F",), mesh, size)
    assert rs.kind == "reduce_scatter"
    (a2a,) = reshard(("T",), ("E",), mesh, size)  # MoE dispatch: each device sends its shard
    assert (a2a.kind, a2a.size_bytes) == ("all_to_all", size / 4)
    with pytest.raises(SpecError):
        reshard(("R",), ("P",), mesh, size)


def test_megatron_backward_all_reduce_is_the_transpose() -> None:
    """A column-parallel GEMM reads its input replicated and splits its work: the input's
    gradient comes back partial and is all-reduced (Shoeybi et al. 2019, operator f)."""
    mesh = DeviceMesh((8,))
    grad = grad_spec_of_input(("R",), (True,))
    (c,) = reshard(grad, grad_spec_of_output(("R",)), mesh, 64.0)
    assert c.kind == "all_reduce"
    # a row-parallel GEMM's partial output needs its gradient replicated: nothing moves back
    assert reshard(("R",), grad_spec_of_output(("P",)), mesh, 64.0) == []


LETTERS = st.sampled_from("RTFEP")


@settings(max_examples=200, deadline=None)
@given(mesh_i=st.integers(0, len(MESHES) - 1), src=st.lists(LETTERS, min_size=2, max_size=2),
       dst=st.lists(st.sampled_from("RTFE"), min_size=2, max_size=2),
       size=st.floats(1.0, 1e9))
def test_any_reshard_between_legal_specs_is_a_valid_collective(
        mesh_i: int, src: list[str], dst: list[str], size: float) -> None:
    mesh = MESHES[mesh_i]
    a, b = tuple(src[:mesh.ndim]), tuple(dst[:mesh.ndim])
    chain = reshard(a, b, mesh, size)
    assert len(chain) <= mesh.ndim
    for c in chain:
        n = mesh.shape[c.axis]
        assert n > 1 and 0 < c.size_bytes <= size
        for group in mesh.groups(c.axis):
            assert len(group) == n
            plan_collective(c.kind, group, c.size_bytes, CLUSTER)  # raises if invalid
        if c.kind == "all_gather":  # gathers the shards into what the group holds
            assert c.size_bytes <= size
    # the bytes held after the chain are those of the target layout
    assert local_bytes(b, mesh, size) == pytest.approx(size / _pieces(b, mesh))


def _pieces(spec: tuple[str, ...], mesh: DeviceMesh) -> int:
    out = 1
    for x, n in zip(spec, mesh.shape, strict=True):
        out *= n if x in "TFE" else 1
    return out


def test_every_pair_of_2d_specs_has_a_chain_unless_it_targets_a_partial_sum() -> None:
    mesh = DeviceMesh((2, 4))
    for a, b in itertools.product(itertools.product("RTFEP", repeat=2), repeat=2):
        if any(y == "P" and x != "P" for x, y in zip(a, b, strict=True)):
            with pytest.raises(SpecError):
                reshard(a, b, mesh, 8.0)
        else:
            for c in reshard(a, b, mesh, 8.0):
                assert c.kind in ("all_gather", "all_reduce", "reduce_scatter", "all_to_all")
