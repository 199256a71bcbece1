"""Gradient and parameter synchronisation in the lowering: data-parallel gradient buckets,
ZeRO-3 parameter gathers, and the optimizer step (with ZeRO-1/2's parameter all-gather).

A mixin of `lowering._Lowering`: it reads the lowering's plan, layout groups, task builder
(`self.b`) and collective lowering (`self.comm`), and records the dp tails the optimizer step
waits for. Kept apart from the per-instruction emission because it runs once per stage, not
once per micro-batch, and holds the ZeRO memory model.
"""

from __future__ import annotations

from typing import Any

from trainsim.simulator.actions import Action
from trainsim.workloads.lowering_comm import NO_META, Meta
from trainsim.workloads.stage_costs import (
    ADAM_STEP_BYTES_PER_PARAM,
    ADAM_STEP_FLOPS_PER_PARAM,
    InstructionCosts,
    optimizer_bytes_per_param,
)


class GradientSync:
    """Data-parallel and ZeRO traffic plus the optimizer step (mixin; see the module doc)."""

    plan: Any
    b: Any
    comm: Any
    fold: bool
    dp_tail: dict[int, list[int]]
    last_compute: dict[int, int]

    def _zero3_bytes(self, phys: int, c: InstructionCosts) -> float:
        """Gathered-parameter bytes a rank holds during a ZeRO-3 pass.

        The whole stage's parameters cross the network, but ZeRO-3 gathers them module by module
        and frees each after use, prefetching the next (Rajbhandari et al. 2020, §5.3; DeepSpeed's
        prefetch bucket): at most about two layers' gathered weights are resident at once, never
        more than the stage's. The shard a rank owns is already in its static memory.
        """
        dp = self.plan.dp_of_stage(phys)
        weight_bytes = optimizer_bytes_per_param(self.plan.dtype)[0]
        stage_bytes = c.params * weight_bytes
        layer_bytes = self._largest_layer_params(phys) * weight_bytes
        return min(stage_bytes, 2 * layer_bytes) * (dp - 1) / dp

    def _largest_layer_params(self, phys: int) -> float:
        """Parameters per GPU of the largest layer on physical stage `phys`."""
        cache = self.__dict__.setdefault("_largest_layer_cache", {})
        if phys not in cache:
            graph = self.graph(self.micro_batches[0])
            tp = self.plan.tp_of_stage(phys)
            cache[phys] = max(
                (sum(op.params for op in graph.layers[i].sharded_ops(tp, self.plan.sp,
                                                                      self.plan.ep))
                 for k in self.stage_layers_idx(phys) for i in self.stage_layers[k]),
                default=0)
        return cache[phys]

    def _zero3_gather(self, a: Action, phys: int, c: InstructionCosts, meta: Meta
                      ) -> dict[int, list[int]] | None:
        """ZeRO-3 (Rajbhandari et al. 2020, §5.3): every forward, and every backward that needs
        the weights (B, I; not W), first all-gathers the stage's parameters over the
        data-parallel group, held until the pass ends. The gather is prefetched: it may start
        once the rank's compute two instructions earlier has ended (so it overlaps the previous
        instruction, and at most two gathered copies are alive)."""
        plan = self.plan
        if plan.zero < 3 or a.kind == "W" or plan.dp_of_stage(phys) < 2 \
                or not self.opt.communication:
            return None
        size = c.params * optimizer_bytes_per_param(plan.dtype)[0]
        prefetch = {u: self.history.get((phys, u), [])[-2:-1]
                    for u in range(len(self.units(phys)))}
        b = self.b
        return self._cross_unit(phys, self.dp_groups(phys), [("all_gather", size)],
                                name=b.name_template(f"s{a.stage}.{a.stage}{a.kind}%d.gather"),
                                arg=a.micro_batch, kind=b.kind("all_gather"),
                                stream=b.stream("dp"), last=prefetch, meta=meta,
                                alloc_bytes=self._zero3_bytes(phys, c), key=("dp", phys))

    def _buckets(self, c: InstructionCosts) -> int:
        """Gradient buckets of a stage (bucket size from the options, 1..16)."""
        grad_bytes = c.params * optimizer_bytes_per_param(self.plan.dtype)[1]
        return max(1, min(16, round(grad_bytes / self.opt.dp_bucket_bytes)))

    def _dp_sync(self, k: int, phys: int, c: InstructionCosts,
                 per_bucket: list[dict[int, int]]) -> None:
        """Data-parallel gradient reduction of each bucket as soon as its backward part ends
        (PyTorch DDP / Megatron overlap_grad_reduce); reduce-scatter under ZeRO >= 1."""
        per_param = optimizer_bytes_per_param(self.plan.dtype)[1]
        kind = "all_reduce" if self.plan.zero == 0 else "reduce_scatter"
        n = len(per_bucket)
        b = self.b
        kind_code, stream = b.kind(kind), b.stream("dp")
        meta = (-1, k, -1, -1)
        for bucket in range(n):
            name = b.name_template(f"s{k}.dp" + ("" if n == 1 else f".b{bucket}"))
            for copies, params in self._grad_groups(phys, c):
                grad_bytes = params * per_param
                groups = [((phys,), copies)] if self.fold else [(g, [g]) for g in copies]
                for prog, cps in groups:
                    ids = self.comm.tasks([(kind, grad_bytes / n)], name=name, arg=-1,
                                          kind=kind_code, stream=stream, prog_ranks=prog,
                                          copies=cps,
                                          deps=[per_bucket[bucket][r] for r in prog], meta=meta)
                    for r in prog:
                        self.dp_tail[r].extend(ids[-1:])

    def _grad_groups(self, phys: int, c: InstructionCosts
                     ) -> list[tuple[list[tuple[int, ...]], float]]:
        """(data-parallel groups, parameters per GPU whose gradients they reduce): the stage's
        dp groups for all its parameters, or, where ops have their own tp degrees
        (`params_by_tp`), for each degree t its t groups `ranks[k::t]` (each op's replicas)."""
        by_tp = c.params_by_tp
        if not by_tp:
            return [(self.dp_groups(phys), c.params)]
        ranks = self.stage_gpu_ranks[phys]
        return [([tuple(ranks[i::t]) for i in range(t)], params) for t, params in by_tp
                if params > 0 and len(ranks) // t > 1]


    def _optimizer(self) -> None:
        """The Adam step on each rank after its last compute and gradient reduction; under
        ZeRO-1/2 each rank updates its 1/dp shard and the shards are all-gathered (ZeRO-3
        keeps the parameters sharded and gathers them before each pass instead)."""
        plan, b = self.plan, self.b
        step: dict[int, int] = {}
        name, kind = b.name_template("optimizer"), b.kind("optimizer")
        for p in range(self.num_ranks):
            phys_stage = self._phys_stage_of_prog(p)
            params = self._local_params(phys_stage)
            updated = params / plan.dp_of_stage(phys_stage) if plan.zero >= 1 else params
            gpu = self.cluster.gpu(self.represents[p][0])
            est = self.cost_model.estimate("elementwise", ADAM_STEP_FLOPS_PER_PARAM * updated,
                                           ADAM_STEP_BYTES_PER_PARAM * updated, gpu, None, "fp32",
                                           None)
            deps = sorted(set(self.dp_tail.get(p, [])))
            if p in self.last_compute:
                deps.append(self.last_compute[p])
            step[p] = b.add(name, -1, kind, self.compute_stream, (p,), est.time_s, 0.0, (), deps,
                            0.0, 0.0, est.power_w, gpu.sm_clock_max_mhz, *NO_META)
        if plan.zero not in (1, 2) or not self.opt.communication:
            return
        w_bytes = optimizer_bytes_per_param(plan.dtype)[0]
        name, kind, stream = (b.name_template("params.all_gather"), b.kind("all_gather"),
                              b.stream("dp"))
        for s in range(plan.pp):
            if plan.dp_of_stage(s) < 2:
                continue
            size = self._local_params(s) * w_bytes
            groups = self.dp_groups(s)
            calls = [((s,), groups)] if self.fold else [(g, [g]) for g in groups]
            for prog, copies in calls:
                self.comm.tasks([("all_gather", size)], name=name, arg=-1, kind=kind,
                                stream=stream, prog_ranks=prog, copies=copies,
                                deps=[step[r] for r in prog], meta=NO_META)
