"""Legal SPMD strategies per op: a role per mesh axis, and what each role does to the op.

A strategy picks one role on every mesh axis (Alpa's per-op strategy list, built axis by axis
as GSPMD does). A role fixes the layout of the op's input and output along that axis, whether
the work and the weights are split, and whether the weight gradients must be summed over it:

====== ===== ====== ====== ======= =====================================================
role   input output work   weights
====== ===== ====== ====== ======= =====================================================
dp     T     T      split  full    batch/token split; weight grads all-reduced (data par.)
col    R     F      split  split   column-parallel GEMM (Shoeybi et al. 2019, Fig. 3 f)
row    F     P      split  split   row-parallel GEMM: partial output (Fig. 3 g)
heads  F     F      split  —       attention core split by heads (needs heads % n = 0,
                                   and kv_heads % n = 0 under GQA)
split  F     F      split  —       feature-split elementwise op (GeLU/SwiGLU after col; the
                                   vocab-parallel cross entropy, which all-reduces 3 fp32
                                   values per token, Shoeybi et al. 2019 §3)
ep     E     E      split  split   expert-sharded MoE GEMM (GShard §2.2): the tokens reach
                                   their experts by the all-to-all of the T→E reshard
vocab  —     P      split  split   vocab-parallel embedding: partial lookups (Megatron)
rep    R     R      all    full    replicated: every device does the whole op
====== ===== ====== ====== ======= =====================================================

Which roles an op may take depends on its family (`ROLES_OF_CLASS`): norms need whole feature
rows (dp or rep), the attention core needs whole sequences (its dp splits samples, so the
micro-batch must divide), residual adds and elementwise ops follow their input. A T split
needs the rows to divide among the axes that split them, an E split the experts.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from trainsim.workloads.model import ModelGraph
from trainsim.workloads.ops import Op
from trainsim.workloads.sharding.graph import SIDE_BRANCH, Node
from trainsim.workloads.sharding.mesh import DeviceMesh
from trainsim.workloads.sharding.spec import Collective, Spec, shard_factor

ROLE_IO: dict[str, tuple[str, str, bool, bool, bool]] = {
    "dp": ("T", "T", True, False, True),
    "col": ("R", "F", True, True, False),
    "row": ("F", "P", True, True, False),
    "heads": ("F", "F", True, False, False),
    "split": ("F", "F", True, False, False),
    "ep": ("E", "E", True, True, False),
    "vocab": ("R", "P", True, True, False),
    "rep": ("R", "R", False, False, False),
}
"""role -> (input letter, output letter, work split, weights split, weight grads summed)."""

ROLES_OF_CLASS: dict[str, tuple[str, ...]] = {
    "matmul": ("dp", "col", "row", "rep"),
    "expert": ("dp", "ep", "col", "row", "rep"),
    "router": ("dp", "rep"),
    "attention": ("dp", "heads", "rep"),
    "norm": ("dp", "rep"),
    "elementwise": ("dp", "split", "rep"),
    "expert_elementwise": ("dp", "ep", "split", "rep"),
    "residual": ("dp", "split", "rep"),
    "embedding": ("dp", "vocab", "rep"),
    "cross_entropy": ("dp", "split", "rep"),
}
"""Roles each op family may take on one axis."""

HEAVY_KINDS = frozenset({"matmul", "attention_score", "attention_context", "flash_attention",
                         "conv2d", "router"})
"""Ops whose compute Alpa's ILP counts (split evenly); the others are light (merged)."""


@dataclass(frozen=True, slots=True)
class Strategy:
    """One op's sharding on the mesh: a role per axis and what follows from it."""

    roles: tuple[str, ...]
    in_specs: tuple[Spec, ...]
    """Layout each input must have (one per `Node.srcs`)."""
    out_spec: Spec
    work_split: tuple[bool, ...]
    """Per axis: whether the work is divided along it (else every device repeats it)."""
    work_div: int
    """Devices the FLOPs and bytes are divided among."""
    param_div: int
    """Pieces the weights are cut into."""
    act_div: int
    """Pieces the saved activations are cut into (the inputs' shard count)."""
    sync_axes: tuple[int, ...]
    """Axes over which the weight gradients are summed (weights replicated, batch split)."""
    fwd_comm: tuple[Collective, ...] = ()
    """Collectives inside the op in the forward pass (vocab-parallel cross entropy)."""

    @property
    def name(self) -> str:
        """"col" on a 1-D mesh, "dp+col" on a 2-D one."""
        return "+".join(self.roles)


def node_class(node: Node) -> str:
    """The family whose roles apply (elementwise ops between expert GEMMs may stay on E)."""
    if node.role_class == "elementwise" and ".experts." in node.op.name:
        return "expert_elementwise"
    return node.role_class


def rows_of(node: Node, graph: ModelGraph) -> int:
    """Rows a T split divides: samples for the attention core (whole sequences stay together),
    a GEMM's m, the [CLS] rows on BERT's pooler branch, else the micro-batch's tokens."""
    if node.role_class == "attention":
        return graph.micro_batch_size
    if node.op.kind == "matmul" and node.op.shape is not None and len(node.op.shape) == 3:
        return int(node.op.shape[0])
    if node.op.name.split(".")[0] in SIDE_BRANCH:
        return graph.micro_batch_size
    return graph.tokens


def _legal(node: Node, roles: tuple[str, ...], mesh: DeviceMesh, graph: ModelGraph) -> bool:
    def ways(*names: str) -> int:
        return math.prod(n for r, n in zip(roles, mesh.shape, strict=True) if r in names)

    if rows_of(node, graph) % ways("dp") != 0:
        return False
    spec = graph.spec
    heads = ways("heads")
    if heads > 1 and (spec.num_heads % heads != 0 or int(spec.num_kv_heads or spec.num_heads)
                      % heads != 0):
        return False
    experts = ways("ep")
    return not (experts > 1 and spec.num_experts % experts != 0)


def make_strategy(node: Node, roles: tuple[str, ...], mesh: DeviceMesh) -> Strategy:
    """The strategy of `node` with one role per axis (no legality check)."""
    ins = tuple(ROLE_IO[r][0] for r in roles)
    out = tuple(ROLE_IO[r][1] for r in roles)
    split = tuple(ROLE_IO[r][2] and n > 1 for r, n in zip(roles, mesh.shape, strict=True))
    work_div = math.prod(n for s, n in zip(split, mesh.shape, strict=True) if s)
    param_div = math.prod(n for r, n in zip(roles, mesh.shape, strict=True) if ROLE_IO[r][3])
    sync = tuple(a for a, r in enumerate(roles)
                 if ROLE_IO[r][4] and (node.op.params > 0 or node.tied_params > 0)
                 and mesh.shape[a] > 1)
    in_specs = tuple(ins for _ in node.srcs)
    act_div = shard_factor(ins, mesh) if node.srcs else 1
    comm: list[Collective] = []
    if node.role_class == "cross_entropy":
        stats = sum(c.size_bytes for s in node.op.shardings for c in s.comm if c.phase == "fwd")
        for a, r in enumerate(roles):
            if r == "split" and mesh.shape[a] > 1:
                size = stats / shard_factor(ins, mesh, skip_axis=a)
                comm.append(Collective(axis=a, kind="all_reduce", size_bytes=size))
    return Strategy(roles=roles, in_specs=in_specs, out_spec=out, work_split=split,
                    work_div=work_div, param_div=param_div, act_div=act_div, sync_axes=sync,
                    fwd_comm=tuple(comm))


def strategies(node: Node, mesh: DeviceMesh, graph: ModelGraph) -> list[Strategy]:
    """Every legal strategy of `node` on `mesh`, in a fixed order (roles per axis in the
    family's order); an axis of size 1 takes only "rep" (nothing to split)."""
    per_axis = [ROLES_OF_CLASS[node_class(node)] if n > 1 else ("rep",) for n in mesh.shape]
    return [make_strategy(node, roles, mesh) for roles in itertools.product(*per_axis)
            if _legal(node, roles, mesh, graph)]


def sharded_op(op: Op, strategy: Strategy, out_div: int) -> Op:
    """The per-device op under `strategy` (`out_div`: pieces of the output tensor).

    The kernel shape is dropped: the roofline model reads sizes, and a profile database's
    shapes would be those of the whole op."""
    w = strategy.work_div
    return replace(op, fwd_flops=op.fwd_flops / w, bwd_flops=op.bwd_flops / w,
                   fwd_bytes=op.fwd_bytes / w, bwd_bytes=op.bwd_bytes / w,
                   params=-(-op.params // strategy.param_div), replicated_params=0,
                   activation_bytes=op.activation_bytes / strategy.act_div,
                   selective_kept_bytes=op.selective_kept_bytes / strategy.act_div,
                   output_bytes=op.output_bytes / out_div, shape=None)


def sync_collectives(strategy: Strategy, mesh: DeviceMesh, grad_bytes: float
                     ) -> list[Collective]:
    """The weight-gradient reduction over `strategy.sync_axes` for `grad_bytes` of local
    gradients: an all-reduce on one axis; on two, reduce-scatter on the inner axis, all-reduce
    of the shard on the outer, all-gather on the inner (the hierarchical all-reduce)."""
    axes = sorted(strategy.sync_axes, reverse=True)
    if not axes or grad_bytes <= 0:
        return []
    if len(axes) == 1:
        return [Collective(axis=axes[0], kind="all_reduce", size_bytes=grad_bytes)]
    inner, outer = axes[0], axes[1]
    return [Collective(axis=inner, kind="reduce_scatter", size_bytes=grad_bytes),
            Collective(axis=outer, kind="all_reduce",
                       size_bytes=grad_bytes / mesh.shape[inner]),
            Collective(axis=inner, kind="all_gather", size_bytes=grad_bytes)]


__all__ = ["HEAVY_KINDS", "ROLES_OF_CLASS", "ROLE_IO", "Strategy", "make_strategy",
           "node_class", "rows_of", "sharded_op", "strategies", "sync_collectives"]
