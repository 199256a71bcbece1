"""Per-stage costs: what one pipeline instruction of one stage costs on one GPU.

Lowering asks, for a (virtual) stage holding some layers, a micro-batch shape, a tensor-parallel
degree and an SM frequency: how long do its forward, backward (or input-grad and weight-grad
halves), and recompute take, at what power, which tensor-parallel collectives do they need, and
how many activation bytes does one micro-batch keep from forward to backward. The answers come
from the op graph (workloads/model.py) and an op cost model (hwmodels/opcost.py), summed per op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from trainsim.workloads.model import Layer
from trainsim.workloads.op_parallel import OpDegrees, op_parallel_costs
from trainsim.workloads.op_work import (
    InstructionCosts,
    Work,
    op_pass_work,
    shared_params,
    weight_inputs,
)
from trainsim.workloads.ops import CommNeed


def instruction_costs(layers: Sequence[Layer], *, tp: int, sp: bool, ep: int,
                      recompute: str | tuple[str, ...], cost_model: Any, gpu: Any,
                      freq_mhz: float | None, dtype: str,
                      op_degrees: OpDegrees | None = None,
                      layer_cache: dict[Any, tuple[Layer, _LayerSum]] | None = None,
                      tied_owned: bool = False) -> InstructionCosts:
    """Sum the per-GPU costs of `layers` (one stage) for one micro-batch.

    Args:
        layers: the stage's layers in order.
        tp, sp, ep: tensor-parallel degree, sequence parallelism, expert-parallel degree.
        recompute: "none", "selective", "full", or a tuple of op names to recompute.
        cost_model: an `OpCostModel` (roofline or profile database).
        gpu: the GPU type running the stage.
        freq_mhz: SM clock (None = maximum).
        dtype: compute precision.
        op_degrees: per-op tensor-parallel degrees of the stage (Aceso); when some op's
            degree differs from `tp`, the stage is costed by `op_parallel.op_parallel_costs`
            (needs sp off and ep = 1), else exactly as without it.
        layer_cache: Per-layer costs kept between calls (a lowering cache's, whose graphs
            hold the layers alive); each entry keeps its layer, so a reused id never hits.
        tied_owned: the stage's GPUs also hold the owner of tied weights its layers read
            (a V-shaped schedule puts the head's chunk beside the embedding's): no copy
            (`op_work.shared_params`).
    """
    if op_degrees is not None and not op_degrees.uniform(tp):
        if sp or ep > 1:
            raise ValueError("per-op tensor-parallel degrees need sp=False and ep=1")
        return op_parallel_costs(layers, tp=tp, degrees=op_degrees, recompute=recompute,
                                 cost_model=cost_model, gpu=gpu, freq_mhz=freq_mhz,
                                 dtype=dtype, tied_owned=tied_owned)
    total = _LayerSum()
    names = set(recompute) if isinstance(recompute, tuple) else set()
    cache: dict[int, _LayerSum] = {}
    shared = (id(cost_model), gpu.name, tp, sp, ep, recompute, freq_mhz, dtype)
    for layer in layers:
        key = id(layer)  # repeated blocks are one object: cost them once
        if key not in cache:
            kept = layer_cache.get((key, shared)) if layer_cache is not None else None
            if kept is not None and kept[0] is layer:
                cache[key] = kept[1]
            else:
                cache[key] = _layer_costs(layer, tp=tp, sp=sp, ep=ep, recompute=recompute,
                                          names=names, cost_model=cost_model, gpu=gpu,
                                          freq_mhz=freq_mhz, dtype=dtype,
                                          layer_cache=layer_cache)
                if layer_cache is not None:
                    layer_cache[(key, shared)] = (layer, cache[key])
        total.add(cache[key])
    total.params += 0 if tied_owned else shared_params(layers, tp)
    last = layers[-1]
    out_bytes = last.output_bytes / (tp if (sp and tp > 1 and last.kind != "head") else 1)
    return InstructionCosts(
        forward=total.fwd, backward=total.bwd, backward_input=total.bwd_in,
        backward_weight=total.bwd_w, recompute=total.rec,
        fwd_comm=tuple(total.comm["fwd"]), bwd_comm=tuple(total.comm["bwd"]),
        recompute_comm=tuple(total.comm["rec"]), fwd_ep_comm=tuple(total.comm["fwd_ep"]),
        bwd_ep_comm=tuple(total.comm["bwd_ep"]), recompute_ep_comm=tuple(total.comm["rec_ep"]),
        kept_activation_bytes=total.kept, recompute_activation_bytes=total.extra,
        output_bytes=out_bytes, params=total.params, expert_params=total.expert_params,
        recompute_sum_bytes=total.recomputed)


@dataclass(slots=True)
class _LayerSum:
    """Running totals of one layer's (or one stage's) costs."""

    fwd: Work = field(default_factory=Work)
    bwd: Work = field(default_factory=Work)
    bwd_in: Work = field(default_factory=Work)
    bwd_w: Work = field(default_factory=Work)
    rec: Work = field(default_factory=Work)
    comm: dict[str, list[CommNeed]] = field(default_factory=lambda: {
        k: [] for k in ("fwd", "bwd", "rec", "fwd_ep", "bwd_ep", "rec_ep")})
    kept: float = 0.0
    extra: float = 0.0
    recomputed: float = 0.0
    """The recomputed activations a deferred weight-gradient pass reads, summed over layers
    (`op_work.weight_inputs`)."""
    params: int = 0
    expert_params: int = 0

    def add(self, other: _LayerSum) -> None:
        self.fwd, self.bwd, self.bwd_in = self.fwd + other.fwd, self.bwd + other.bwd, \
            self.bwd_in + other.bwd_in
        self.bwd_w, self.rec = self.bwd_w + other.bwd_w, self.rec + other.rec
        for key, needs in other.comm.items():
            self.comm[key] += needs
        self.kept += other.kept
        # Recompute runs layer by layer before each layer's backward (Megatron's
        # checkpointed blocks), so only one layer's recomputed activations are alive at once.
        self.extra = max(self.extra, other.extra)
        self.recomputed += other.recomputed
        self.params += other.params
        self.expert_params += other.expert_params


_OpWork = tuple[Any, tuple[Work, Work, Work, Work], str, list[CommNeed], list[CommNeed]]
"""(sharded op, its (forward, backward, input-grad, weight-grad) work, "_ep" or "", forward
needs, backward needs): what a layer's costs read of each op, whatever the recompute policy."""


def _op_works(layer: Layer, *, tp: int, sp: bool, ep: int, cost_model: Any, gpu: Any,
              freq_mhz: float | None, dtype: str,
              layer_cache: dict[Any, Any] | None) -> tuple[_OpWork, ...]:
    """Each sharded op of `layer` and its work (`_OpWork`), kept in `layer_cache` (if given)
    for the layer's other recompute policies."""
    key = ("ops", id(layer), id(cost_model), gpu.name, tp, sp, ep, freq_mhz, dtype)
    kept = layer_cache.get(key) if layer_cache is not None else None
    if kept is not None and kept[0] is layer:
        return cast(tuple[_OpWork, ...], kept[1])
    out = []
    for op in layer.sharded_ops(tp, sp, ep):
        sharding = op.shardings[0]
        out.append((op, op_pass_work(cost_model, gpu, op, freq_mhz, dtype),
                    "_ep" if sharding.name == "expert" else "",
                    [c for c in sharding.comm if c.phase == "fwd"],
                    [c for c in sharding.comm if c.phase == "bwd"]))
    works = tuple(out)
    if layer_cache is not None:
        layer_cache[key] = (layer, works)
    return works


def _layer_costs(layer: Layer, *, tp: int, sp: bool, ep: int, recompute: str | tuple[str, ...],
                 names: set[str], cost_model: Any, gpu: Any, freq_mhz: float | None,
                 dtype: str, layer_cache: dict[Any, Any] | None = None) -> _LayerSum:
    """One layer's costs. Collectives of expert-sharded ops (MoE dispatch/combine all-to-alls)
    run over the expert-parallel group, every other op's over the tensor-parallel group."""
    works = _op_works(layer, tp=tp, sp=sp, ep=ep, cost_model=cost_model, gpu=gpu,
                      freq_mhz=freq_mhz, dtype=dtype, layer_cache=layer_cache)
    ops = [w[0] for w in works]
    out = _LayerSum()
    full = recompute == "full" and layer.recomputable
    shares = layer.selective_shares(tp, sp) if recompute == "selective" else {}
    for op, (f, b, i, w), suffix, fwd_needs, bwd_needs in works:
        out.fwd, out.bwd, out.bwd_in, out.bwd_w = out.fwd + f, out.bwd + b, out.bwd_in + i, \
            out.bwd_w + w
        out.comm["fwd" + suffix] += fwd_needs
        out.comm["bwd" + suffix] += bwd_needs
        share = 1.0 if full or op.name in names else shares.get(op.name, 0.0)
        if share:
            out.rec = out.rec + (f if share == 1.0 else
                                 Work(time_s=share * f.time_s, energy_j=share * f.energy_j))
            if full or op.name in names:
                out.comm["rec" + suffix] += fwd_needs
    same = tuple(ops) if ep == 1 else None  # the ops `activation_bytes` would shard again
    if full:
        kept = layer.activation_bytes(tp, sp, "full", ops=same)
        extra = layer.activation_bytes(tp, sp, "none", ops=same) - kept
    elif recompute == "selective":
        kept = layer.activation_bytes(tp, sp, "selective", ops=same)
        extra = layer.activation_bytes(tp, sp, "none", ops=same) - kept
    else:
        kept = layer.activation_bytes(tp, sp, "none", ops=same)
        dropped = sum(op.activation_bytes for op in ops if op.name in names)
        kept, extra = kept - dropped, dropped
    out.recomputed = weight_inputs(
        ops, lambda op: 1.0 if full or op.name in names else shares.get(op.name, 0.0))
    # the loss's gradient buffers live during the backward only, as recomputed activations
    # do; vocab-parallel cross entropy (tp > 1) holds 1/tp of them
    extra = max(extra, layer.backward_workspace(tp))
    out.kept, out.extra = kept, extra
    out.params = sum(op.params for op in ops)
    out.expert_params = sum(w[0].params for w in works if w[2] == "_ep")
    return out


def optimizer_bytes_per_param(dtype: str) -> tuple[float, float, float]:
    """(weight, gradient, optimizer-state) bytes per parameter for Adam training.

    Mixed precision (fp16/bf16, and fp8, whose weights stay bf16): 2 + 2 + 12 (fp32 master
    weights, momentum, variance; Rajbhandari et al. 2020, ZeRO §3.1). fp32 and tf32 (fp32
    storage, tf32 only inside the tensor cores): 4 + 4 + 8 (momentum, variance).
    """
    if dtype in ("fp32", "tf32"):
        return 4.0, 4.0, 8.0
    return 2.0, 2.0, 12.0


def grad_reduce_bytes(policy: str, dtype: str) -> float:
    """Bytes per gradient the data-parallel reduction carries under `ModelSpec.grad_reduce_dtype`
    `policy` when training in `dtype`: fp32's 4 where the stack reduces in fp32 (Megatron-LM
    under bf16 or fp8, torchtitan's FSDP2 always), else the gradient's own bytes."""
    grad = optimizer_bytes_per_param(dtype)[1]
    if policy == "fp32" or (policy == "fp32-for-bf16" and dtype in ("bf16", "fp8")):
        return max(grad, 4.0)
    return grad


def state_bytes_per_param(dtype: str, grad_buffer: str = "param",
                          grad_reduce_dtype: str = "param") -> tuple[float, float, float]:
    """`optimizer_bytes_per_param`, with the gradients in the reduction's bytes where the stack
    keeps them so (`ModelSpec.grad_buffer` "reduce": Megatron-Core's fp32 gradient buffer under
    bf16: 2 + 4 + 12)."""
    w, g, o = optimizer_bytes_per_param(dtype)
    if grad_buffer == "reduce":
        g = grad_reduce_bytes(grad_reduce_dtype, dtype)
    return w, g, o


ADAM_STEP_BYTES_PER_PARAM = 28.0
"""Bytes an Adam step reads and writes per parameter it updates (mixed precision): reads the
fp32 master weight, the gradient (2), momentum and variance (4 each); writes master, momentum,
variance (4 each) and the fp16 weight (2). 4+2+4+4 + 4+4+4+2 = 28."""
ADAM_STEP_FLOPS_PER_PARAM = 12.0
"""Elementwise FLOPs of one Adam update per parameter (moments, bias correction, update)."""
