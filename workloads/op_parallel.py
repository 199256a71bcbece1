"""Costs of a pipeline stage whose ops have their own tensor-parallel degrees (Aceso §3–4).

Aceso (Liu et al., EuroSys'24) lets every op of a stage of G GPUs pick a tensor-parallel degree
t_i (dividing G); the op then runs on dp_i = G / t_i data-parallel replicas, each taking
B·t_i/G samples of the stage's micro-batch of B samples. Megatron-LM's one-degree stage is the
case t_i = T for every op. This module costs such a stage per GPU; stage_costs.py calls it
when `OpDegrees` names an op at a degree other than the stage's.

Per op: its FLOPs, bytes and saved activations are those of the op built at its own batch
share and sharded at its own degree (`Op.sharded(t_i)`, Megatron's default partition, the
first of `op.shardings`); its own collectives (column GEMM's backward all-reduce, row GEMM's
forward all-reduce) run over groups of t_i consecutive ranks (`CommNeed.group_size = t_i`).
Parameters per GPU are grouped by degree (`InstructionCosts.params_by_tp`), since the
gradients of an op at degree t are reduced over its t data-parallel groups of G/t ranks.

**Resharding model.** Between consecutive ops a → b of different degrees (t_a ≠ t_b) the
activation passes through the layout "replicated within the tp group, batch split over dp"
(Aceso §4.1's resharding between ops of different (tp, dp); the same collectives Megatron-LM
uses for sequence parallelism, Korthikanti et al. 2022 §4.2.2):

* forward: if a's output is split over its group (column / heads partition, not reduced), an
  all-gather over t_a of the output at a's batch S_a; then, if t_b > t_a, each group of t_b
  ranks gathers its t_b/t_a times larger batch: an all-gather over t_b of S_b = S_a·t_b/t_a
  (exact for t_a = 1; for t_a > 1 the t_a copies of each share make it an upper bound).
  If t_b < t_a, each rank keeps a slice of its batch: no communication. If b takes a split
  input (row, heads, or an elementwise op after a column GEMM), it slices locally.
* backward (the gradient flows b → a): if b's input is split, its input gradient is too and
  is all-gathered over t_b (S_b); if t_b < t_a, a's group gathers the gradient of its larger
  batch: an all-gather over t_a (S_a). Gathers of the forward become local slices: the
  gradient of a replicated tensor is the same on every rank of the group (b's own backward
  all-reduce made it so), so slicing is its exact transpose.

Ops are treated as a chain in model order: an op reading something other than its predecessor
(Wide-ResNet's downsample branch, T5's cross-attention K/V reading the encoder output) is
resharded as if it read its predecessor; the moves change a block's attention or MLP ops
together, so such ops share a degree with their neighbours and need no reshard.

A stage's input and output keep the stage's layout (degree T, replicated, B·T/G samples per
replica) so pipeline transfers are unchanged: the stage's first op reshards from it and its
last op back to it (not for an embedding or stem op, which reads its samples from the data
loader, nor after the LM head). Under recompute a reshard is repeated when both ops around it
are recomputed within one layer (full recompute keeps each layer's input at its first op's
layout, so the reshard into a layer is not repeated). T5's encoder output read by cross
attention travels with the pipeline transfers and is not resharded here.

Not modelled (refused by the plan): sequence parallelism, expert parallelism and ZeRO with
per-op degrees — each assumes one tp group per stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trainsim.workloads.model import Layer
from trainsim.workloads.op_work import (
    InstructionCosts,
    Work,
    op_pass_work,
    shared_params,
    weight_inputs,
)
from trainsim.workloads.ops import CommNeed, Op

LayersAt = Callable[[int], Sequence[Layer]]
"""The stage's layers built for another per-replica batch size (same order and length)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpDegrees:
    """Per-op degrees of one stage, and how to build its layers at another batch size."""

    degrees: tuple[tuple[str, int], ...]
    """(op name, tensor-parallel degree); ops not named run at the stage's tp."""
    batch_size: int
    """Samples one replica at the stage's degree runs (the batch of the `layers` passed)."""
    layers_at: LayersAt
    """Batch size -> the stage's layers built at that batch (an op at degree t takes
    `batch_size * t / tp` samples)."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"OpDegrees.batch_size={self.batch_size} must be >= 1")
        for name, t in self.degrees:
            if t < 1:
                raise ValueError(f"OpDegrees: degree {t} of {name!r} must be >= 1")

    def uniform(self, tp: int) -> bool:
        """Whether every named op runs at the stage's degree (costs equal Megatron's)."""
        return all(t == tp for _, t in self.degrees)


@dataclass(frozen=True, slots=True)
class _OpAt:
    """One op at its own degree: the per-GPU op and its layout."""

    op: Op
    """Per-GPU op (built at its batch share, sharded at its degree)."""
    tp: int
    output_bytes: float
    """Full (unsharded) output bytes at the op's batch share."""
    split_in: bool
    """Whether the op takes its input split over its tp group."""
    split_out: bool
    """Whether its output stays split over its tp group (not reduced)."""
    reads_data: bool = False
    """An embedding/stem op: its input comes from the data loader, never resharded."""


def stage_op_degrees(plan: Any, stage: int, batch_size: int, layers_at: LayersAt
                     ) -> OpDegrees | None:
    """The `op_degrees` argument of `instruction_costs` for physical stage `stage` of `plan`
    (None where every op runs at the stage's degree): `batch_size` is the samples of one
    replica at the stage's degree (`plan.replica_batch(stage, micro_batch)`), `layers_at`
    builds the stage's layers at another per-replica batch size."""
    if not plan.has_op_tp(stage):
        return None
    return OpDegrees(degrees=tuple(sorted(plan.op_tp_of_stage(stage).items())),
                     batch_size=batch_size, layers_at=layers_at)


def _split_in(op: Op, name: str, t: int) -> bool:
    """Row GEMMs, attention heads and elementwise ops after a column GEMM (GeLU, the
    vocab-parallel cross entropy) take a split input (Shoeybi et al. 2019, Fig. 3)."""
    return t > 1 and (name in ("row", "heads") or (name == "column" and not op.is_matmul))


def _split_out(sharding: Any, t: int) -> bool:
    """Column and head partitions leave the output split unless a forward all-reduce joins it."""
    reduced = any(c.phase == "fwd" and c.collective == "all_reduce" for c in sharding.comm)
    return t > 1 and sharding.name in ("column", "heads") and not reduced


def reshard(a_tp: int, a_split: bool, a_bytes: float, b_tp: int, b_split: bool
            ) -> tuple[list[CommNeed], list[CommNeed]]:
    """(forward, backward) collectives moving op a's output (a_bytes at a's batch, unsharded)
    to op b's layout (module docstring)."""
    fwd: list[CommNeed] = []
    bwd: list[CommNeed] = []
    if a_tp == b_tp:
        return fwd, bwd
    b_bytes = a_bytes * b_tp / a_tp
    if a_split and a_tp > 1:
        fwd.append(CommNeed(phase="fwd", collective="all_gather", size_bytes=a_bytes,
                            group_size=a_tp))
    if b_tp > a_tp:
        fwd.append(CommNeed(phase="fwd", collective="all_gather", size_bytes=b_bytes,
                            group_size=b_tp))
    if b_split and b_tp > 1:
        bwd.append(CommNeed(phase="bwd", collective="all_gather", size_bytes=b_bytes,
                            group_size=b_tp))
    if b_tp < a_tp:
        bwd.append(CommNeed(phase="bwd", collective="all_gather", size_bytes=a_bytes,
                            group_size=a_tp))
    return fwd, bwd


@dataclass(slots=True)
class _Totals:
    """Running totals of a stage's costs (mirrors stage_costs._LayerSum)."""

    work: dict[str, Any]
    comm: dict[str, list[CommNeed]] = field(default_factory=lambda: {
        k: [] for k in ("fwd", "bwd", "rec")})
    kept: float = 0.0
    extra: float = 0.0
    recomputed: float = 0.0
    """The recomputed activations alone, summed over layers (`recompute_sum_bytes`)."""
    params: dict[int, int] = field(default_factory=dict)


def op_parallel_costs(layers: Sequence[Layer], *, tp: int, degrees: OpDegrees,
                      recompute: str | tuple[str, ...], cost_model: Any, gpu: Any,
                      freq_mhz: float | None, dtype: str,
                      tied_owned: bool = False) -> InstructionCosts:
    """Per-GPU costs of one stage whose ops run at their own degrees (module docstring).

    Args:
        layers: the stage's layers at `degrees.batch_size` samples (the stage-degree replica).
        tp: the stage's tensor-parallel degree T (stage layout at its input and output).
        degrees: per-op degrees and the layer builder for other batch sizes.
        recompute, cost_model, gpu, freq_mhz, dtype: as in `stage_costs.instruction_costs`.

    Returns:
        `InstructionCosts` with `params_by_tp` set and every collective's `group_size`.
    """
    deg = dict(degrees.degrees)
    names = set(recompute) if isinstance(recompute, tuple) else set()
    by_batch: dict[int, Sequence[Layer]] = {degrees.batch_size: layers}

    def layers_of(t: int) -> Sequence[Layer]:
        b = degrees.batch_size * t // tp
        if b not in by_batch:
            built = degrees.layers_at(b)
            if len(built) != len(layers):
                raise ValueError(f"OpDegrees.layers_at({b}) gave {len(built)} layers, "
                                 f"expected {len(layers)}")
            by_batch[b] = built
        return by_batch[b]

    zero = Work()
    tot = _Totals(work={k: zero for k in ("fwd", "bwd", "bwd_in", "bwd_w", "rec")})
    prev: _OpAt | None = None
    if layers and layers[0].kind not in ("embedding", "stem"):
        # the stage's input, in the stage's layout (degree T, replicated)
        prev = _OpAt(op=layers[0].ops[0], tp=tp, output_bytes=layers[0].input_bytes,
                     split_in=False, split_out=False)
    op_cache: dict[tuple[int, int, int], _OpAt] = {}
    for k, layer in enumerate(layers):
        full = recompute == "full" and layer.recomputable
        prev_redo = False
        for j, base in enumerate(layer.ops):
            t = deg.get(base.name, tp)
            key = (id(layer), j, t)
            if key not in op_cache:
                whole = layers_of(t)[k].ops[j]
                op = whole.sharded(t, False, 1)
                sh = op.shardings[0]
                op_cache[key] = _OpAt(
                    op=replace(op, shardings=(replace(sh, comm=tuple(
                        replace(c, group_size=t) for c in sh.comm)),)),
                    tp=t, output_bytes=whole.output_bytes, split_in=_split_in(op, sh.name, t),
                    split_out=_split_out(sh, t),
                    reads_data=j == 0 and layer.kind in ("embedding", "stem"))
            cur = op_cache[key]
            op = cur.op
            redo = full or (recompute == "selective" and op.selective_recompute) \
                or op.name in names
            if prev is not None and not cur.reads_data:
                fwd_r, bwd_r = reshard(prev.tp, prev.split_out, prev.output_bytes, cur.tp,
                                       cur.split_in)
                tot.comm["fwd"] += fwd_r
                tot.comm["bwd"] += bwd_r
                if redo and prev_redo and j > 0:
                    tot.comm["rec"] += fwd_r
            f, b, i, w = op_pass_work(cost_model, gpu, op, freq_mhz, dtype)
            for name, part in (("fwd", f), ("bwd", b), ("bwd_in", i), ("bwd_w", w)):
                tot.work[name] = tot.work[name] + part
            own = op.shardings[0].comm
            tot.comm["fwd"] += [c for c in own if c.phase == "fwd"]
            tot.comm["bwd"] += [c for c in own if c.phase == "bwd"]
            if redo:
                tot.work["rec"] = tot.work["rec"] + f
                if full or op.name in names:
                    tot.comm["rec"] += [c for c in own if c.phase == "fwd"]
            tot.params[t] = tot.params.get(t, 0) + op.params
            prev, prev_redo = cur, redo
        kept, extra, reread = _saved(layer, k, layers_of, deg, tp, full, recompute, names,
                                     op_cache)
        tot.kept += kept
        tot.extra = max(tot.extra, extra)  # one layer recomputed at a time (see stage_costs)
        tot.recomputed += reread
        # the loss's backward buffers, as stage_costs counts them (the stage's tp)
        tot.extra = max(tot.extra, layer.backward_workspace(tp))
    last = layers[-1]
    if prev is not None and last.kind != "head":
        fwd_r, bwd_r = reshard(prev.tp, prev.split_out, prev.output_bytes, tp, False)
        tot.comm["fwd"] += fwd_r
        tot.comm["bwd"] += bwd_r
    shared = 0 if tied_owned else shared_params(layers, tp)
    if shared:
        tot.params[tp] = tot.params.get(tp, 0) + shared
    by_tp = tuple(sorted((t, p) for t, p in tot.params.items()))
    return InstructionCosts(
        forward=tot.work["fwd"], backward=tot.work["bwd"], backward_input=tot.work["bwd_in"],
        backward_weight=tot.work["bwd_w"], recompute=tot.work["rec"],
        fwd_comm=tuple(tot.comm["fwd"]), bwd_comm=tuple(tot.comm["bwd"]),
        recompute_comm=tuple(tot.comm["rec"]), kept_activation_bytes=tot.kept,
        recompute_activation_bytes=tot.extra, output_bytes=last.output_bytes,
        params=sum(p for _, p in by_tp), params_by_tp=by_tp, recompute_sum_bytes=tot.recomputed)


def _saved(layer: Layer, k: int, layers_of: Callable[[int], Sequence[Layer]],
           deg: Mapping[str, int], tp: int, full: bool, recompute: str | tuple[str, ...],
           names: set[str], op_cache: Mapping[tuple[int, int, int], _OpAt]
           ) -> tuple[float, float, float]:
    """(kept, extra, re-read) activation bytes of one layer: each op's saved tensors at its
    own degree and batch share (Korthikanti et al. 2022 §4.1); full recompute keeps the
    layer's input at its first op's layout (its batch share, replicated); re-read: what a
    deferred weight-gradient pass reads of the recomputed ones (`op_work.weight_inputs`)."""
    ops = [op_cache[(id(layer), j, deg.get(o.name, tp))].op for j, o in enumerate(layer.ops)]
    none = sum(op.activation_bytes for op in ops)
    if full:
        first_t = deg.get(layer.ops[0].name, tp)
        kept = layers_of(first_t)[k].input_bytes
        return kept, none - kept, weight_inputs(ops, lambda op: 1.0)
    if recompute == "selective":
        kept = sum(op.saved_bytes("selective") for op in ops)
        return kept, none - kept, weight_inputs(
            ops, lambda op: 1.0 if op.selective_recompute else 0.0)
    dropped = sum(op.activation_bytes for op in ops if op.name in names)
    return none - dropped, dropped, weight_inputs(
        ops, lambda op: 1.0 if op.name in names else 0.0)


__all__ = ["LayersAt", "OpDegrees", "op_parallel_costs", "reshard", "stage_op_degrees"]
