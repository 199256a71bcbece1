"""Per-block costs on each GPU type: what the heterogeneous partitioner and the branch-and-bound
bound sum over a stage's layers.

A stage's instruction costs are the sum of its layers' costs (workloads/stage_costs.py), so the
planner costs each transformer block once per (GPU type, tp, micro-batch size, recompute) with
the Oracle's own cost model and adds them up, instead of lowering every partition it weighs.
Layers that are not blocks (embedding, final norm, LM head) are folded into the block whose
stage the lowering gives them (layout.py `_partition`: layers before the first block join
stage 0, the others the stage of the block before), so a stage of blocks i..j costs exactly
the sum of entries i..j.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainsim.hwmodels.cluster import Cluster
from trainsim.hwmodels.gpus import GpuSpec
from trainsim.hwmodels.opcost import OpCostModel, RooflineCostModel
from trainsim.workloads.model import ModelSpec, build_graph, trained_in
from trainsim.workloads.stage_costs import instruction_costs, state_bytes_per_param


@dataclass(frozen=True, slots=True)
class BlockCosts:
    """Per-block figures of one (GPU type, tp, micro-batch size, recompute), numpy arrays of
    one entry per block with the non-block layers folded in."""

    compute_s: np.ndarray
    """Forward + backward (+ recomputed forward) time of one micro-batch on one GPU: the
    compute-stream work the lowering emits for the block."""
    weight_s: np.ndarray
    """The weight-gradient part of the backward (the W pass a zero-bubble schedule defers)."""
    comm_s: np.ndarray
    """Estimated tensor-parallel collective time of one micro-batch (ring all-reduce over the
    node's link; an estimate for ranking only, never in the bound)."""
    static_bytes: np.ndarray
    """Weights, gradients and Adam states per GPU (no ZeRO)."""
    kept_bytes: np.ndarray
    """Activation bytes one in-flight micro-batch holds until its backward."""
    extra_bytes: np.ndarray
    """Bytes a recomputed layer materialises for its backward (a stage needs its largest)."""
    recomputed_bytes: np.ndarray
    """The block's recomputed activations (a backward split into I and a later W holds a
    stage's sum of them: `InstructionCosts.split_working_set`)."""
    extra_max: np.ndarray
    """extra_max[i, j] = the largest `extra_bytes` of blocks i..j-1 (i < j; `range_max`):
    the working set of a stage of those blocks, worked out once per table entry."""
    sums: dict[str, np.ndarray]
    """Prefix sums (leading 0; a stage of blocks i..j-1 costs p[j] - p[i]) of "estimate"
    (compute + tp collectives), "compute", "forward", "weight", "static", "kept" and
    "recomputed"."""


def range_max(values: np.ndarray) -> np.ndarray:
    """m[i, j] = max(values[i:j]) for i < j (0 elsewhere)."""
    n = len(values)
    out = np.zeros((n + 1, n + 1))
    for i in range(n):
        out[i, i + 1:] = np.maximum.accumulate(values[i:])
    return out


def prefix(what: np.ndarray) -> np.ndarray:
    """Prefix sums with a leading 0."""
    return np.concatenate(([0.0], np.cumsum(what)))


class BlockCostTable:
    """Block costs of one model on one cluster, computed on demand and cached."""

    def __init__(self, model: ModelSpec, cluster: Cluster, *, dtype: str = "fp16",
                 cost_model: OpCostModel | None = None, seq_len: int | None = None,
                 embedding_and_head: bool = True) -> None:
        model = trained_in(model, dtype)  # activations in the plans' bytes, as the lowering
        self.model, self.cluster, self.dtype = model, cluster, dtype
        self.cost_model = cost_model if cost_model is not None else RooflineCostModel()
        self.seq_len = seq_len
        self.embedding_and_head = embedding_and_head
        """False: the lowering leaves the non-block layers out (LoweringOptions), so do the
        sums, or the bound would count work the engine never runs."""
        self.gpus: dict[str, GpuSpec] = {g.gpu.name: g.gpu for g in cluster.node_groups}
        self._intra: dict[str, float] = {}
        first = 0
        for g in cluster.node_groups:
            if g.gpus_per_node > 1 and g.gpu.name not in self._intra:
                self._intra[g.gpu.name] = cluster.bottleneck_bytes_per_s(first, first + 1)
            first += g.num_gpus
        self._cache: dict[tuple[str, int, int, str, bool], BlockCosts] = {}
        self.num_blocks = len(build_graph(model, 1, seq_len).transformer_layers())

    def costs(self, gpu: str, tp: int, micro_batch_size: int, recompute: str,
              sp: bool = False) -> BlockCosts:
        """Block costs on GPU type `gpu` (a name in the cluster); `sp`: with sequence
        parallelism (tp > 1), as a framework's plan defaults run it."""
        key = (gpu, tp, micro_batch_size, recompute, sp and tp > 1)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._compute(*key)
        return found

    def _compute(self, gpu_name: str, tp: int, mbs: int, recompute: str,
                 sp: bool) -> BlockCosts:
        gpu = self.gpus[gpu_name]
        graph = build_graph(self.model, mbs, None if self.model.family == "wresnet"
                            else self.seq_len)
        w, g, o = state_bytes_per_param(self.dtype, self.model.grad_buffer,
                                        self.model.grad_reduce_dtype)
        n = self.num_blocks
        compute, forward, weight, comm, static, kept, extra, recomputed = (
            np.zeros(n) for _ in range(8))
        bw = self._intra.get(gpu_name, float("inf"))
        block, seen_block, cache = 0, False, {}
        for layer in graph.layers:
            if layer.recomputable:
                block = block + 1 if seen_block else 0
                seen_block = True
            elif not self.embedding_and_head:
                continue
            key = id(layer)
            if key not in cache:
                cache[key] = instruction_costs(
                    [layer], tp=tp, sp=sp, ep=1, recompute=recompute,
                    cost_model=self.cost_model, gpu=gpu, freq_mhz=None, dtype=self.dtype)
            c = cache[key]
            compute[block] += c.forward.time_s + c.backward.time_s + c.recompute.time_s
            forward[block] += c.forward.time_s
            weight[block] += c.backward_weight.time_s
            needs = (*c.fwd_comm, *c.bwd_comm, *c.recompute_comm)
            if tp > 1:
                comm[block] += sum(2 * (tp - 1) / tp * n_.size_bytes / bw for n_ in needs)
            static[block] += c.params * (w + g + o)
            kept[block] += c.kept_activation_bytes
            extra[block] = max(extra[block], c.recompute_activation_bytes)
            recomputed[block] += c.recompute_sum_bytes
        sums = {"estimate": prefix(compute + comm), "compute": prefix(compute),
                "forward": prefix(forward),
                "weight": prefix(weight), "static": prefix(static), "kept": prefix(kept),
                "recomputed": prefix(recomputed)}
        return BlockCosts(compute_s=compute, weight_s=weight, comm_s=comm, static_bytes=static,
                          kept_bytes=kept, extra_bytes=extra, recomputed_bytes=recomputed,
                          extra_max=range_max(extra), sums=sums)


__all__ = ["BlockCostTable", "BlockCosts"]
