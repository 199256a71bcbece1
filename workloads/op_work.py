"""What one op's passes cost on one GPU, and the per-instruction totals of a stage.

`Work` is time and energy; `op_pass_work` costs one op's forward, backward and the backward's
input- and weight-gradient halves with an op cost model; `InstructionCosts` is what a stage's
pipeline instructions cost for one micro-batch (stage_costs.py sums it over a stage's ops, and
op_parallel.py where the ops have their own tensor-parallel degrees).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainsim.workloads.model import Layer
from trainsim.workloads.ops import CommNeed, Op, flops_per_element


@dataclass(frozen=True, kw_only=True, slots=True)
class Work:
    """Time and energy of a sequence of kernels on one GPU."""

    time_s: float = 0.0
    energy_j: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(time_s=self.time_s + other.time_s, energy_j=self.energy_j + other.energy_j)

    @property
    def power_w(self) -> float:
        """Average power over the work (0 for no work)."""
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class InstructionCosts:
    """Costs of one stage's pipeline instructions for one micro-batch shape on one GPU."""

    forward: Work
    backward: Work
    """Full backward (input and weight gradients)."""
    backward_input: Work
    """Zero-bubble split: gradients w.r.t. inputs (and every non-GEMM backward)."""
    backward_weight: Work
    """Zero-bubble split: gradients w.r.t. weights (the weight-grad GEMMs)."""
    recompute: Work
    """Forward work run again before the backward under the plan's recompute policy."""
    fwd_comm: tuple[CommNeed, ...]
    """Tensor-parallel collectives of the forward (repeated by recompute)."""
    bwd_comm: tuple[CommNeed, ...]
    """Tensor-parallel collectives of the backward."""
    recompute_comm: tuple[CommNeed, ...]
    """Tensor-parallel collectives the recomputed forward repeats."""
    fwd_ep_comm: tuple[CommNeed, ...] = ()
    """Expert-parallel all-to-alls of the forward (dispatch and combine; GShard §2.2)."""
    bwd_ep_comm: tuple[CommNeed, ...] = ()
    """Expert-parallel all-to-alls of the backward."""
    recompute_ep_comm: tuple[CommNeed, ...] = ()
    """Expert-parallel all-to-alls the recomputed forward repeats."""
    kept_activation_bytes: float
    """Bytes one micro-batch holds from its forward until its backward."""
    recompute_activation_bytes: float
    """Extra bytes the recompute materialises for the backward (freed by it): the largest one
    layer's, since recompute runs one layer at a time before that layer's backward."""
    output_bytes: float
    """Bytes the stage sends to the next stage per micro-batch (per GPU)."""
    params: int
    """Parameters of the stage's layers on one GPU (tied copies included)."""
    recompute_sum_bytes: float = 0.0
    """The recomputed activations the stage's weight-gradient pass reads again, over all its
    layers: the saved inputs of recomputed ops with weights (dW = Xᵀ·dY; `weight_inputs`).
    What a backward split into I and a later W (zero-bubble schedules) holds from the
    recompute until W (`split_working_set`). 0 without recompute, and under Megatron's
    selective recompute (the attention core it rebuilds has no weights)."""

    def split_working_set(self) -> float:
        """Bytes a micro-batch holds from its recompute (or, without one, its I pass) until
        its W under a split backward: the recomputed inputs W reads, at least the one-layer
        working set (a layer's recomputation, the loss's gradient buffers)."""
        return max(self.recompute_sum_bytes, self.recompute_activation_bytes)
    expert_params: int = 0
    """Of `params`, those of expert-sharded ops (MoE experts, 1/ep of them per GPU): their
    gradients are reduced, and ZeRO shards them, over the expert-data-parallel group
    (`LoweringLayout.expert_dp_groups`), not the data-parallel group."""
    params_by_tp: tuple[tuple[int, int], ...] = ()
    """Empty for a stage with one tensor-parallel degree; with per-op degrees, (t, parameters
    per GPU of the ops at degree t), ascending t, summing to `params`: their gradients are
    reduced over the stage's data-parallel groups of that degree (workloads/op_parallel.py)."""


FP8_CAST_BYTES_PER_ELEMENT = 5.0
"""Device-memory bytes of one dynamic (tensorwise) cast of a BF16 element to FP8: a pass that
reads it for the tensor's absolute maximum (2 bytes), then a pass that reads it again, scales
and writes the FP8 value (2 + 1 bytes) -- torchao's ``hp_tensor_to_float8_dynamic``
(``tensor_to_scale`` then ``to_float8``); torch.compile may fuse the passes (not modelled)."""
FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT = 4.0
"""Device-memory bytes of one delayed-scaling cast of a BF16 element: Transformer Engine's
``cast_transpose`` reads it once (2 bytes; the scale comes from the amax history, the new amax
is reduced in the same pass) and writes the FP8 value and its transpose for the weight
gradient (1 + 1)."""


def op_dtype(op: Op, dtype: str) -> str:
    """The precision `op` runs at under the plan's `dtype`: under "fp8" only the linear layers
    marked `Op.fp8` run in FP8 (torchao Float8Linear / Transformer Engine); the attention core,
    the LM head and everything else run in BF16."""
    if dtype == "fp8" and not op.fp8:
        return "bf16"
    return dtype


def fp8_cast_elements(op: Op) -> tuple[float, float, float]:
    """Elements an FP8 linear layer casts to FP8: (forward, input-grad, weight-grad) passes.

    "dynamic" (torchao): ``matmul_with_hp_or_float8_args`` saves the BF16 input and weight and
    casts in every GEMM that needs them: forward casts the input (m·k) and weight (k·n); the
    input gradient casts the output gradient (m·n) and the weight again; the weight gradient
    casts the input again (the output gradient's cast is shared).

    "delayed" (Transformer Engine, Megatron-LM's default ``--fp8-recipe``): the forward casts
    the input unless the norm before it wrote it in FP8 (LayerNormLinear; `Op.fp8_input_fused`),
    with its transpose for the weight gradient; the backward casts the output gradient (m·n),
    with its transpose; weights are cast on a step's first micro-batch only and cached
    (``is_first_microbatch``), which is left out here.
    """
    if not op.fp8 or op.shape is None or len(op.shape) != 3:
        return 0.0, 0.0, 0.0
    m, n, k = op.shape
    if op.fp8_recipe == "delayed":
        return (0.0 if op.fp8_input_fused else float(m * k)), float(m * n), 0.0
    return float(m * k + k * n), float(m * n + k * n), float(m * k)


def fp8_cast_bytes(op: Op) -> float:
    """Device-memory bytes per element of `op`'s FP8 casts under its recipe."""
    return FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT if op.fp8_recipe == "delayed" \
        else FP8_CAST_BYTES_PER_ELEMENT


def _op_work(cost_model: Any, gpu: Any, op: Op, flops: float, nbytes: float,
             freq_mhz: float | None, dtype: str) -> Work:
    if flops <= 0 and nbytes <= 0:
        return Work()
    est = cost_model.estimate(op.kind, flops, nbytes, gpu, freq_mhz, op_dtype(op, dtype),
                              op.shape)
    return Work(time_s=est.time_s, energy_j=est.time_s * est.power_w)


def _cast_work(cost_model: Any, gpu: Any, elements: float, freq_mhz: float | None,
               bytes_per_element: float = FP8_CAST_BYTES_PER_ELEMENT) -> Work:
    """One FP8 cast kernel over `elements` BF16 elements (memory-bound, `elementwise`)."""
    if elements <= 0:
        return Work()
    est = cost_model.estimate("elementwise", elements * flops_per_element("elementwise"),
                              elements * bytes_per_element, gpu, freq_mhz, "bf16",
                              (int(elements),))
    return Work(time_s=est.time_s, energy_j=est.time_s * est.power_w)


def _weight_share(op: Op) -> float:
    """Share of an op's backward that computes weight gradients (ZB-H1's W).

    A GEMM with weights runs two GEMMs of its forward size backward: one for the input gradient,
    one for the weight gradient (Qi et al. 2024, §2). Ops without weights have no W part. Each
    half is costed as its own kernel and the full backward is their sum, so B = I + W exactly
    and splitting the backward changes the order of work, never its amount.
    """
    return 0.5 if (op.is_matmul and op.params > 0) else 0.0


def op_pass_work(cost_model: Any, gpu: Any, op: Op, freq_mhz: float | None, dtype: str
                 ) -> tuple[Work, Work, Work, Work]:
    """(forward, backward, input-grad, weight-grad) work of one op on one GPU.

    A GEMM's backward is two kernels of its forward size (`_weight_share`), costed apart, so
    backward = input-grad + weight-grad exactly; other ops have no weight-grad part. Under an
    "fp8" plan the FP8 linear layers add their casts to each pass (`fp8_cast_elements`) and
    the other ops run in BF16 (`op_dtype`).
    """
    f = _op_work(cost_model, gpu, op, op.fwd_flops, op.fwd_bytes, freq_mhz, dtype)
    cast_f = cast_i = cast_w = Work()
    if dtype == "fp8" and op.fp8:
        ef, ei, ew = fp8_cast_elements(op)
        per = fp8_cast_bytes(op)
        cast_f, cast_i, cast_w = (_cast_work(cost_model, gpu, e, freq_mhz, per)
                                  for e in (ef, ei, ew))
        f = f + cast_f
    share = _weight_share(op)
    if share <= 0:
        b = _op_work(cost_model, gpu, op, op.bwd_flops, op.bwd_bytes, freq_mhz, dtype)
        b = b + cast_i + cast_w
        return f, b, b, Work()
    w = _op_work(cost_model, gpu, op, op.bwd_flops * share, op.bwd_bytes * share, freq_mhz,
                 dtype) + cast_w
    i = _op_work(cost_model, gpu, op, op.bwd_flops * (1 - share), op.bwd_bytes * (1 - share),
                 freq_mhz, dtype) + cast_i
    return f, i + w, i, w


def weight_inputs(ops: Sequence[Op], share: Callable[[Op], float]) -> float:
    """Saved input bytes of the recomputed ops whose weight gradients the W pass computes (the
    GEMMs with weights, `_weight_share`), each times `share(op)` (the share of its forward run
    again): what a deferred weight-gradient pass (dW = Xᵀ·dY) reads of the recomputed
    activations. Per GPT block 14·s·b·h bytes (Korthikanti et al. 2022's GEMM inputs)."""
    return float(sum(share(op) * op.activation_bytes for op in ops if _weight_share(op) > 0))


def shared_params(layers: Sequence[Layer], tp: int) -> int:
    """Tied weights a stage keeps a copy of (a tied LM head's word embedding, sharded like it).

    Megatron-LM keeps a copy of the word embedding on the last stage when embedding and head
    are on different stages; on the stage that holds the embedding itself the head reuses it,
    so nothing is added (a stage counting it twice would double its weight memory and its
    gradient all-reduce). Several readers of the one table on a stage (a T5 stage running the
    decoder's embedding and the head) share one copy.
    """
    owned = max((la.params for la in layers if la.kind == "embedding"), default=0)
    return max((-(-la.shared_params // tp) for la in layers
                if la.shared_params and owned < la.shared_params), default=0)
