"""Sharding specs of activation tensors and resharding between them as collectives.

Every activation in the zoo's graphs is a 2-D tensor [rows, features]: rows are tokens
(batch × sequence) or, between an MoE dispatch and combine, the expert-grouped token buffer.
A spec gives, per mesh axis, one letter (the GSPMD/Alpa notation, one axis at a time):

* ``R`` replicated along the axis;
* ``T`` rows (tokens) split along the axis;
* ``F`` features split (hidden units, attention heads, vocabulary);
* ``E`` rows split by expert (each device holds the tokens routed to its experts);
* ``P`` partial: every device holds a full-size addend (a row-parallel GEMM's output).

`reshard(a, b)` lists the collectives that turn spec a into spec b, one axis at a time in axis
order: S→R all-gather, P→R all-reduce, P→S reduce-scatter, S→S' (another dim) all-to-all,
R→S a local slice (free). Each collective's size is the tensor's bytes on one group of the
axis: the full tensor divided by the axes (other than this one) that shard it at that moment,
as `simulator.collectives.plan_collective` takes S; an all-to-all's S is one device's send
buffer (its shard). Nothing ever reshards *to* P: partial sums arise only as outputs.

Backward edges are the transposes (`grad_spec_of_output`, `grad_spec_of_input`): the
gradient of a tensor a consumer read replicated while splitting its work on that axis (a
column-parallel GEMM reading R) comes back partial, so resharding it to the producer's R is an
all-reduce — Megatron's backward all-reduce (Shoeybi et al. 2019, "f" operator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsim.errors import SpecError
from trainsim.workloads.sharding.mesh import DeviceMesh

LETTERS = ("R", "T", "F", "E", "P")
SHARDED = frozenset("TFE")

Spec = tuple[str, ...]
"""One letter of `LETTERS` per mesh axis."""


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective along one mesh axis (run by every group of that axis at once)."""

    axis: int
    kind: str
    """"all_gather", "all_reduce", "reduce_scatter" or "all_to_all"."""
    size_bytes: float
    """S as `plan_collective` takes it (full tensor on one group; a2a: one device's buffer)."""


def check_spec(spec: Spec, mesh: DeviceMesh) -> None:
    """Raise SpecError unless `spec` has one known letter per mesh axis."""
    if len(spec) != mesh.ndim or any(x not in LETTERS for x in spec):
        raise SpecError(f"spec {''.join(spec)!r} needs one of {'/'.join(LETTERS)} per axis of "
                        f"mesh {mesh.describe()}")


def shard_factor(spec: Spec, mesh: DeviceMesh, skip_axis: int = -1) -> int:
    """How many pieces the tensor is cut into by the axes that shard it (P and R cut nothing)."""
    return math.prod(n for a, (x, n) in enumerate(zip(spec, mesh.shape, strict=True))
                     if x in SHARDED and a != skip_axis)


def local_bytes(spec: Spec, mesh: DeviceMesh, full_bytes: float) -> float:
    """Bytes of the tensor one device holds."""
    return full_bytes / shard_factor(spec, mesh)


def _axis_step(src: str, dst: str) -> str | None:
    """The collective turning letter `src` into `dst` on one axis (None: nothing moves)."""
    if src == dst or src == "R":
        if dst == "P" and src != "P":
            raise SpecError(f"cannot reshard {src} to a partial sum P")
        return None
    if dst == "P":
        raise SpecError(f"cannot reshard {src} to a partial sum P")
    if src == "P":
        return "all_reduce" if dst == "R" else "reduce_scatter"
    if dst == "R":
        return "all_gather"
    return "all_to_all"


def reshard(src: Spec, dst: Spec, mesh: DeviceMesh, full_bytes: float) -> list[Collective]:
    """Collectives turning a tensor of `full_bytes` laid out as `src` into `dst` (axis order).

    Raises SpecError for a target with P where the source has none (no legal collective)."""
    check_spec(src, mesh)
    check_spec(dst, mesh)
    cur = list(src)
    out: list[Collective] = []
    for axis in range(mesh.ndim):
        kind = _axis_step(cur[axis], dst[axis])
        if kind is not None and mesh.shape[axis] > 1:
            group_bytes = full_bytes / shard_factor(tuple(cur), mesh, skip_axis=axis)
            size = group_bytes / mesh.shape[axis] if kind == "all_to_all" else group_bytes
            out.append(Collective(axis=axis, kind=kind, size_bytes=size))
        cur[axis] = dst[axis]
    return out


def grad_spec_of_output(out_spec: Spec) -> Spec:
    """Layout a producer needs its output's gradient in: its output layout, with a partial
    output's gradient replicated (each addend's gradient is the whole upstream gradient)."""
    return tuple("R" if x == "P" else x for x in out_spec)


def grad_spec_of_input(in_spec: Spec, work_split: tuple[bool, ...]) -> Spec:
    """Layout of the gradient a consumer hands back for an input it read as `in_spec`: where it
    read R but split its work along the axis, each device holds a partial gradient."""
    return tuple("P" if x == "R" and split else x
                 for x, split in zip(in_spec, work_split, strict=True))


def format_spec(spec: Spec) -> str:
    """`S(0)`-style text for one tensor: e.g. ("T", "F") -> "T0F1", ("R",) -> "R"."""
    if all(x == "R" for x in spec):
        return "R"
    return "".join(f"{x}{a}" for a, x in enumerate(spec) if x != "R")


__all__ = ["LETTERS", "SHARDED", "Collective", "Spec", "check_spec", "format_spec",
           "grad_spec_of_input", "grad_spec_of_output", "local_bytes", "reshard",
           "shard_factor"]
