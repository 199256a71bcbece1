"""Gradient and parameter synchronisation in the lowering: data-parallel gradient buckets,
ZeRO-3 parameter gathers, and the optimizer step (with ZeRO-1/2's parameter all-gather).

`GradientSync` is given what it needs by the lowering (lower.py): the layout (plan, groups,
costs), the task builder and the collective lowering it appends to. It records the dp tails
the optimizer step waits for. Kept apart from the per-instruction emission because it runs once
per stage, not once per micro-batch, and holds the ZeRO memory model.
"""

from __future__ import annotations

from typing import Any

from trainsim.simulator.actions import Action
from trainsim.simulator.task_table import TaskTableBuilder
from trainsim.workloads.lowering.comm import NO_META, CommLowering, Meta, cross_unit
from trainsim.workloads.lowering.layout import LoweringLayout
from trainsim.workloads.op_work import InstructionCosts, shared_params
from trainsim.workloads.stage_costs import (
    ADAM_STEP_BYTES_PER_PARAM,
    ADAM_STEP_FLOPS_PER_PARAM,
    grad_reduce_bytes,
    optimizer_bytes_per_param,
)

PARAM_BUCKET_PARAMS = 40_000_000
PARAM_BUCKET_PARAMS_PER_RANK = 1_000_000
"""Megatron-Core's bucket where a run sets none: max(40M, 1M x dp) parameters
(megatron/core/distributed/distributed_data_parallel_config.py, `bucket_size`: "If
unspecified, MCore uses a default value of max(40000000, 1000000 * dp_size) parameters"); the
first is what an overlapped parameter all-gather exposes (`overlap_param_gather`)."""
GRAD_COPY_STREAMS = ("grad_copy_in", "grad_copy_out")
"""Streams of the gradient copies around a data-parallel reduction (`GradientSync.dp_sync`):
computation of the rank's own, off the compute stream's queue."""


class GradientSync:
    """Data-parallel and ZeRO traffic plus the optimizer step of one lowering.

    Args:
        layout: the lowering's layout (plan, options, groups, costs).
        comm: the collective lowering tasks are planned with.
        builder: the task builder everything is appended to.
        compute_stream: the builder's code of the "compute" stream (the optimizer step's).
    """

    def __init__(self, layout: LoweringLayout, comm: CommLowering, builder: TaskTableBuilder,
                 compute_stream: int) -> None:
        self.layout = layout
        self.plan = layout.plan
        self.opt = layout.opt
        self.comm = comm
        self.b = builder
        self.compute_stream = compute_stream
        self._gathered: set[int] = set()
        """(Virtual) stages whose parameters this step has gathered (`keeps_gathered`)."""
        self.dp_tail: dict[int, list[int]] = {r: [] for r in range(layout.num_ranks)}
        """Program rank -> its gradient-reduction tasks (the optimizer step waits for them)."""
        self.reduce_bytes = grad_reduce_bytes(layout.model.grad_reduce_dtype, self.plan.dtype)
        """Bytes per gradient the reductions carry (the stack's `grad_reduce_dtype`)."""

    def keeps_gathered(self) -> bool:
        """ZeRO-3 without resharding after the forward (`ParallelPlan.reshard_after_forward`):
        the stage's parameters are gathered once per step and stay, counted in static memory
        (lower.py), with the unsharded gradients they accumulate."""
        return self.plan.zero >= 3 and not self.plan.reshard_after_forward

    def holds_unsharded_grads(self) -> bool:
        """Whether each stage's unsharded gradients live from its first backward to the end of
        the step: parameters kept gathered (`keeps_gathered`) over several micro-batches, whose
        gradients accumulate unsharded, in the reduction's dtype, until the last backward
        reduce-scatters them (FSDP2 under pipelining: torch's pipelining stage turns gradient
        sync off until the last micro-batch, and FSDPParam.to_accumulated_grad_if_needed keeps
        the accumulated gradient in reduce_dtype, fp32 under torchtitan)."""
        return self.keeps_gathered() and (self.plan.num_micro_batches or 1) > 1

    def zero3_bytes(self, phys: int, c: InstructionCosts) -> float:
        """Gathered-parameter bytes a rank holds during a ZeRO-3 pass.

        The whole stage's parameters cross the network, but ZeRO-3 gathers them module by module
        and frees each after use, prefetching the next (Rajbhandari et al. 2020, §5.3; DeepSpeed's
        prefetch bucket): at most about two layers' gathered weights are resident at once, never
        more than the stage's. The shard a rank owns is already in its static memory; so are
        parameters kept gathered for the whole step (`keeps_gathered`), hence 0 then.

        The pass's first compute task allocates them and its last frees them (lower.py), not
        the gather: the next pass's first gather is prefetched while this pass computes, and
        allocating at the gather would hold two passes' buffers (about four layers) through
        every pass, where FSDP holds the layer computing and the one prefetched.
        """
        if self.keeps_gathered() or c.params <= 0:
            return 0.0
        weight_bytes = optimizer_bytes_per_param(self.plan.dtype)[0]
        stage_bytes = c.params * weight_bytes
        layer_bytes = self.layout.largest_layer_params(phys) * weight_bytes
        # the share gathered from other ranks: (n-1)/n of each group's parameters (dense over
        # dp, experts over the expert-data-parallel group: `param_groups`)
        share = sum(p * (len(g[0]) - 1) / len(g[0]) for g, p in self.param_groups(phys, c))
        return min(stage_bytes, 2 * layer_bytes) * share / c.params

    def zero3_gather(self, a: Action, phys: int, c: InstructionCosts, meta: Meta,
                     history: dict[tuple[int, int], list[int]]
                     ) -> tuple[dict[int, list[int]], dict[int, list[int]]] | None:
        """ZeRO-3 / FSDP (Rajbhandari et al. 2020, §5.3): every forward, and every backward that
        needs the weights (B, I; not W), all-gathers the stage's parameters over the
        data-parallel group, layer by layer, each layer's gather prefetched while the layer
        before it computes (FSDP's forward/backward prefetch, DeepSpeed's prefetch bucket).

        Emitted as two collectives on the dp stream: the first layer's gather, which the pass's
        compute waits for, and the rest, which runs behind that compute. The first gather may
        start once the rank's compute two instructions earlier has ended (it overlaps the
        previous instruction). Returns (what the compute waits for, what the pass's successors
        also wait for) per unit, or None without a gather. The dp stream runs its tasks in
        order, so a gather slower than the compute delays the next pass's first gather, and
        with it that pass: the exposed part of the gathers is what the frameworks expose.
        `history` holds each (stage, unit)'s compute tasks so far."""
        plan, layout = self.plan, self.layout
        if plan.zero < 3 or a.kind == "W" or not self.opt.communication:
            return None
        sharded = self._sharded_groups(phys, c)
        if not sharded:
            return None
        if self.keeps_gathered():
            if a.kind != "F" or a.stage in self._gathered:
                return None  # gathered once per step, by each (virtual) stage's first forward
            self._gathered.add(a.stage)
        weight_bytes = optimizer_bytes_per_param(plan.dtype)[0]
        (groups, params), *others = sharded
        size = params * weight_bytes
        head = min(size, layout.largest_layer_params(phys) * weight_bytes)
        prefetch = {u: history.get((phys, u), [])[-2:-1]
                    for u in range(len(layout.units(phys)))}
        b = self.b
        common: dict[str, Any] = {"kind": b.kind("all_gather"), "stream": b.stream("dp"),
                                  "meta": meta}
        key = "dp" if groups is layout.dp_groups(phys) else "edp"
        first = cross_unit(self.comm, layout, phys, groups, [("all_gather", head)],
                           name=b.name_template(f"s{a.stage}.{a.stage}{a.kind}%d.gather"),
                           arg=a.micro_batch, last=prefetch, key=(key, phys), **common)
        rest = first
        if size - head > 0:
            rest = cross_unit(self.comm, layout, phys, groups, [("all_gather", size - head)],
                              name=b.name_template(f"s{a.stage}.{a.stage}{a.kind}%d.gather.rest"),
                              arg=a.micro_batch, last=first, key=(key, phys), **common)
        for groups, params in others:  # the experts, over their expert-data-parallel groups
            rest = cross_unit(self.comm, layout, phys, groups,
                              [("all_gather", params * weight_bytes)],
                              name=b.name_template(
                                  f"s{a.stage}.{a.stage}{a.kind}%d.gather.experts"),
                              arg=a.micro_batch, last=rest, key=("edp", phys), **common)
        if rest is first:
            return first, {u: [] for u in first}
        return first, rest

    def _sharded_groups(self, phys: int, c: InstructionCosts
                        ) -> list[tuple[list[tuple[int, ...]], float]]:
        """(groups, parameters per GPU) ZeRO shards and gathers stage `phys`'s parameters
        over: `grad_groups`, or, with per-op tp degrees, the stage's dp groups for all of
        them; empty where no group has two ranks."""
        if not c.params_by_tp:
            return self.grad_groups(phys, c)
        layout = self.layout
        return [(layout.dp_groups(phys), c.params)] if self.plan.dp_of_stage(phys) > 1 else []

    def _dense_params(self, phys: int) -> float:
        """Parameters per GPU of stage `phys` that are sharded over the dp group: all but the
        experts under ep > 1 (`param_groups`)."""
        layout = self.layout
        expert = layout.local_expert_params(phys) if self.plan.ep > 1 else 0.0
        return layout.local_params(phys) - expert

    def param_bucket_bytes(self, phys: int) -> float:
        """Bytes of the first parameter bucket an overlapped ZeRO-1/2 all-gather exposes after
        the optimizer step (`PARAM_BUCKET_PARAMS`), never more than the stage's dense
        parameters (the experts' gathers, over their own groups, all run behind the
        forward: `overlapped_param_gather`)."""
        size = self._dense_params(phys) * optimizer_bytes_per_param(self.plan.dtype)[0]
        bucket = max(PARAM_BUCKET_PARAMS, PARAM_BUCKET_PARAMS_PER_RANK * self.plan.dp_of_stage(phys))
        return min(size, bucket * optimizer_bytes_per_param(self.plan.dtype)[0])

    def gathers_params_at(self, a: Action) -> bool:
        """Whether pass `a` carries an overlapped ZeRO-1/2 parameter gather (the first forward
        of its stage: `overlapped_param_gather`), so it is emitted plainly, not from a tape."""
        plan = self.plan
        return plan.zero in (1, 2) and plan.overlap_param_gather and a.kind == "F" \
            and a.stage not in self._gathered and self.opt.communication

    def overlapped_param_gather(self, a: Action, phys: int, c: InstructionCosts, meta: Meta
                                ) -> dict[int, list[int]] | None:
        """ZeRO-1/2 with `overlap_param_gather` (Megatron-Core's distributed optimizer): after
        the step only the first bucket's all-gather is waited for (`optimizer_step`); the
        others are launched bucket by bucket as the next step's forward reaches them, so the
        first forward of every (virtual) stage cannot end before its parameters have arrived.
        In the steady state this step's first forward carries the previous step's gather: it is
        emitted here on the dp stream from the iteration's start, and the pass's successors (its
        send, the next pass) also wait for it. A forward shorter than the gather exposes the
        difference, as on the real system (it saw only the first bucket before). Returns what
        the successors wait for per unit, or None (not this pass, or nothing to gather)."""
        plan, layout = self.plan, self.layout
        if not self.gathers_params_at(a):
            return None
        self._gathered.add(a.stage)  # once per (virtual) stage, whatever it gathers
        sharded = self._sharded_groups(phys, c)
        if not sharded:
            return None
        w_bytes = optimizer_bytes_per_param(plan.dtype)[0]
        first = min(v for v in range(plan.num_stages) if layout.phys_stage(v) == phys)
        b = self.b
        last: dict[int, list[int]] = {u: [] for u in range(len(layout.units(phys)))}
        out = None
        for groups, params in sharded:
            size = params * w_bytes
            dense = groups is layout.dp_groups(phys)
            if dense and a.stage == first:  # its first bucket was gathered right after the step
                size -= self.param_bucket_bytes(phys)
            if size <= 0:
                continue
            out = last = cross_unit(
                self.comm, layout, phys, groups, [("all_gather", size)],
                name=b.name_template(f"s{a.stage}.params.all_gather.rest" if dense
                                     else f"s{a.stage}.params.all_gather.experts"),
                arg=-1, kind=b.kind("all_gather"), stream=b.stream("dp"), last=last, meta=meta,
                key=("dp" if dense else "edp", phys))
        return out

    def buckets(self, c: InstructionCosts) -> int:
        """Gradient buckets of a stage (bucket size from the options, 1..16); one, reduced
        after the whole backward, when the plan does not overlap the reduction."""
        if not self.plan.overlap_grad_reduce:
            return 1
        grad_bytes = c.params * self.reduce_bytes
        return max(1, min(16, round(grad_bytes / self.opt.dp_bucket_bytes)))

    def dp_sync(self, k: int, phys: int, c: InstructionCosts,
                per_bucket: list[dict[int, int]]) -> None:
        """Data-parallel gradient reduction of each bucket as soon as its backward part ends
        (PyTorch DDP / Megatron overlap_grad_reduce); reduce-scatter under ZeRO >= 1. A
        reduction spans every replica, so it starts when the slowest is ready; folded, one task
        over the stage's program ranks (one per replica class) stands for the dp groups.

        With `ModelSpec.grad_copy_traffic` each bucket's gradients are first copied into its
        reduction buffer (``copy_in``, the first 2 bytes per gradient byte; it holds the buffer
        from then on) and the result scaled and copied back after the reduction (``copy_out``,
        the rest, over the rank's 1/dp shard under a reduce-scatter; it frees the buffer). The
        copies run on streams of their own, so a bucket's copy waits for its part of the
        backward only and later passes do not queue behind a reduction: every copy-in is
        emitted before any copy-out, as DDP copies each bucket in as it fills and back at the
        end of the backward."""
        per_param = self.reduce_bytes
        kind = "all_reduce" if self.plan.zero == 0 else "reduce_scatter"
        n = len(per_bucket)
        b = self.b
        kind_code, stream = b.kind(kind), b.stream("dp")
        meta = (-1, k, -1, -1)
        fold = self.layout.fold
        traffic = self.layout.model.grad_copy_traffic
        # (bucket suffix, program ranks, dp copies, gradient bytes, copy-out share, ready task
        # per rank)
        calls: list[tuple[str, tuple[int, ...], list[tuple[int, ...]], float, float,
                          list[int]]] = []
        for bucket in range(n):
            suffix = "" if n == 1 else f".b{bucket}"
            for copies, params in self.grad_groups(phys, c):
                grad_bytes = params * per_param / n
                # the copy-out covers the rank's 1/n shard of a reduce-scatter over n ranks
                back = (traffic - 2.0) / (len(copies[0]) if self.plan.zero >= 1 else 1)
                groups = ([(self.layout.stage_prog_ranks(phys), copies)] if fold
                          else [(g, [g]) for g in copies])
                for prog, cps in groups:
                    ready = [per_bucket[bucket][r] for r in prog]
                    if traffic > 0:  # the gradients copied into the reduction buffer first
                        ready = self._copies(
                            prog, f"s{k}.dp{suffix}.copy_in", GRAD_COPY_STREAMS[0], ready,
                            min(traffic, 2.0) * grad_bytes, meta,
                            alloc=grad_bytes if traffic > 2.0 else 0.0)
                    calls.append((suffix, tuple(prog), cps, grad_bytes, back, ready))
        reduced = [self.comm.tasks([(kind, grad_bytes)],
                                   name=b.name_template(f"s{k}.dp{suffix}"), arg=-1,
                                   kind=kind_code, stream=stream, prog_ranks=prog, copies=cps,
                                   deps=ready, meta=meta)
                   for suffix, prog, cps, grad_bytes, _, ready in calls]
        for (suffix, prog, _, grad_bytes, back, ready), ids in zip(calls, reduced):
            # what the optimizer step waits for: the reduction (or, where it emitted nothing,
            # the copy-in), then the copy-out
            tails = [ids[-1:] or ([dep] if traffic > 0 else []) for dep in ready]
            if traffic > 2.0:  # ... and the reduced result scaled and copied back
                tails = [[t] for t in self._copies(
                    prog, f"s{k}.dp{suffix}.copy_out", GRAD_COPY_STREAMS[1],
                    [t[-1] for t in tails], back * grad_bytes, meta, free=grad_bytes)]
            for r, tail in zip(prog, tails):
                self.dp_tail[r].extend(tail)

    def _copies(self, prog: tuple[int, ...], name: str, stream: str, after: list[int],
                moved: float, meta: Meta, *, alloc: float = 0.0, free: float = 0.0
                ) -> list[int]:
        """One memory-bound copy of `moved` bytes (read and written) on each of `prog`'s
        `stream`, each after its task in `after`, allocating or freeing the reduction buffer
        (`dp_sync`); their ids."""
        b, layout = self.b, self.layout
        name_code, kind, code = b.name_template(name), b.kind("grad_copy"), b.stream(stream)
        out = []
        for r, dep in zip(prog, after):
            gpu = layout.cluster.gpu(layout.represents[r][0])
            est = layout.cost_model.estimate("copy", 0.0, moved, gpu, None, self.plan.dtype,
                                             None)
            out.append(b.add(name_code, -1, kind, code, (r,), est.time_s, 0.0, (), (dep,),
                             alloc, free, est.power_w, gpu.sm_clock_max_mhz, *meta))
        return out

    def param_groups(self, phys: int, c: InstructionCosts
                     ) -> list[tuple[list[tuple[int, ...]], float]]:
        """(groups, parameters per GPU they replicate) of stage `phys`'s parameters: the dp
        groups for all of them, or, under expert parallelism (ep > 1), the dp groups for the
        dense parameters and the expert-data-parallel groups (`expert_dp_groups`: the ranks
        holding the same experts) for the expert parameters (`InstructionCosts.expert_params`),
        when there are some.
        What the gradient reduction, ZeRO's sharding and its parameter gathers run over, as in
        Megatron-Core, whose DistributedDataParallel puts `is_expert_parallel` parameters in
        buffers and buckets of their own, reduced (and, under its distributed optimizer,
        sharded and gathered) over the expert data-parallel group
        (megatron/core/distributed/distributed_data_parallel.py: parameters with
        `allreduce=False` go to `expert_parallel_params`, whose buffers are allocated with
        `parallel_state.get_expert_data_parallel_group()`), and DeepSpeed-MoE, whose ZeRO
        optimizer partitions MoE parameter groups over `groups._get_expert_data_parallel_group`
        (`real_dp_process_group` in stage_1_and_2.py's `_configure_moe_settings`)."""
        layout = self.layout
        expert = c.expert_params if self.plan.ep > 1 else 0
        out = [(layout.dp_groups(phys), float(c.params - expert))]
        if expert > 0:
            out.append((layout.expert_dp_groups(phys), float(expert)))
        return out

    def grad_groups(self, phys: int, c: InstructionCosts
                    ) -> list[tuple[list[tuple[int, ...]], float]]:
        """(groups of more than one rank, parameters per GPU whose gradients they reduce):
        `param_groups`, or, where ops have their own tp degrees (`params_by_tp`), for each
        degree t its t groups `ranks[k::t]` (each op's replicas)."""
        by_tp = c.params_by_tp
        if not by_tp:
            return [(groups, params) for groups, params in self.param_groups(phys, c)
                    if len(groups[0]) > 1]
        ranks = self.layout.stage_gpu_ranks[phys]
        return [([tuple(ranks[i::t]) for i in range(t)], params) for t, params in by_tp
                if params > 0 and len(ranks) // t > 1]

    def tied_sync(self, last_compute: dict[int, int]) -> None:
        """Megatron-LM's embedding group: where the LM head sits on another stage than the word
        embedding it is tied to, that stage keeps a copy of the weight (`shared_params`), and
        after the data-parallel reduction the two copies' gradients are all-reduced between the
        embedding's stage and the head's, GPU i of one with GPU i of the other (a pipeline's
        first and last rank), so both optimizer steps apply the same update
        (`_allreduce_word_embedding_grads` in Megatron-LM's finalize_model_grads). Both steps
        wait for it; it is exposed, after the last backward. Stages of different GPU counts
        (`stage_gpus`) pair their GPUs round-robin, as the stage-boundary transfers do, so
        every copy is reduced. A T5 stage running the decoder's embedding (which reads the
        encoder's table) keeps a copy too, and Megatron-LM's embedding group holds the first
        rank, the split rank (the decoder's first stage) and the last: one all-reduce over
        every stage holding a copy, not one per copy with the first stage. Approximations:
        the bytes are the largest copy's (the stages' tp may differ); they are the whole copy,
        as Megatron's distributed optimizer (ZeRO-1) reduces it, also under ZeRO-2/3, where a
        1/dp shard would do."""
        plan, layout = self.plan, self.layout
        if plan.pp < 2 or not self.opt.communication:
            return
        first = next((s for s in range(plan.pp) if layout.holds_embedding(s)), None)
        if first is None:
            return
        graph = layout.graph(layout.micro_batches[0])
        copies, size = [], 0.0
        for stage in range(plan.pp):
            if layout.holds_embedding(stage):  # no copy there (`holds_embedding`)
                continue
            layers = [graph.layers[i] for k in layout.stage_layers_idx(stage)
                      for i in layout.stage_layers[k]]
            copy = shared_params(layers, plan.tp_of_stage(stage)) * self.reduce_bytes
            if copy > 0:
                copies.append(stage)
                size = max(size, copy)
        if copies:
            self._tied_all_reduce((first, *copies), size, last_compute)

    def _tied_all_reduce(self, stages: tuple[int, ...], size: float,
                         last_compute: dict[int, int]) -> None:
        """`tied_sync`'s all-reduces of `size` bytes over one GPU of each of `stages` (GPU i
        of each when they are of one size): one task per group of program ranks, standing
        for the GPU groups they represent.

        Stages of different sizes (`stage_gpus`) are grouped round-robin, so every copy is
        reduced; a GPU in several groups runs them one round after another, and each GPU's
        rounds wait only for its own previous ones, so the GPUs' chains run side by side
        (the smaller stage's GPUs each with its own run of the larger stage's). Folded, a
        program rank's rounds stand for the slowest chain, each round timed on its links
        shared with the round's other groups (`CommLowering.copy_times`): a chain over NVLink
        and one across nodes do not wait for each other's rounds, and the optimizer steps
        wait for the last."""
        layout, b = self.layout, self.b
        prog_of = {g: p for p, gpus in enumerate(layout.represents) for g in gpus}
        ranks = [layout.stage_gpu_ranks[s] for s in stages]
        n = max(len(r) for r in ranks)
        seen: dict[int, int] = {}
        by_prog: dict[tuple[int, ...], dict[int, list[tuple[int, ...]]]] = {}
        for i in range(n):
            group = tuple(r[i * len(r) // n] for r in ranks)
            rnd = max(seen.get(g, 0) for g in group)
            for g in group:
                seen[g] = rnd + 1
            prog = tuple(prog_of[g] for g in group)
            by_prog.setdefault(prog, {}).setdefault(rnd, []).append(group)
        need = [("all_reduce", size)]
        calls: list[tuple[int, tuple[int, ...], list[tuple[int, ...]]]] = []
        for prog, rounds in by_prog.items():
            chain: dict[int, float] = {}  # each GPU's rounds, their time added up
            for copies in rounds.values():
                for group, t in zip(copies, self.comm.copy_times(need, copies), strict=True):
                    for g in group:
                        chain[g] = chain.get(g, 0.0) + t
            slowest = max(chain, key=chain.__getitem__)  # the first of equal chains
            for rnd, copies in rounds.items():
                mine = [g for g in copies if slowest in g]
                if mine:
                    calls.append((rnd, prog, mine + [g for g in copies if g != mine[0]]))
        stream = b.stream("dp")
        name, kind = b.name_template("embedding.all_reduce"), b.kind("all_reduce")
        for _, prog, copies in sorted(calls):
            deps = sorted({d for p in prog for d in self.dp_tail.get(p, [])}
                          | {last_compute[p] for p in prog if p in last_compute})
            ids = self.comm.tasks(need, name=name, arg=-1, kind=kind, stream=stream,
                                  prog_ranks=prog, copies=copies, deps=deps,
                                  meta=(-1, stages[-1], -1, -1))
            for p in prog:
                self.dp_tail.setdefault(p, []).extend(ids[-1:])

    def optimizer_step(self, last_compute: dict[int, int]) -> None:
        """The Adam step on each rank after its last compute (`last_compute`: program rank ->
        its last compute task) and gradient reduction; under ZeRO-1/2 each rank updates its
        1/dp shard and the shards are all-gathered (ZeRO-3 keeps the parameters sharded and
        gathers them before each pass instead). With `overlap_param_gather` only the first
        bucket's gather (`PARAM_BUCKET_PARAMS`) is waited for: the others run behind the next
        step's forward (`overlapped_param_gather`)."""
        plan, b, layout = self.plan, self.b, self.layout
        step: dict[int, int] = {}
        name, kind = b.name_template("optimizer"), b.kind("optimizer")
        for p in range(layout.num_ranks):
            phys_stage = layout.phys_stage_of_prog(p)
            params = layout.local_params(phys_stage)
            updated = params
            if plan.zero >= 1:  # its shard: dense over dp, experts over their edp group
                dense = self._dense_params(phys_stage)
                updated = dense / plan.dp_of_stage(phys_stage) \
                    + (params - dense) / layout.expert_dp(phys_stage)
            gpu = layout.cluster.gpu(layout.represents[p][0])
            # a clock locked for the GPU (plan-wide or per stage) holds for the step too;
            # per-instruction clocks (Perseus) leave it at the default, the maximum
            freq = plan.frequency_of(phys_stage, None)
            est = layout.cost_model.estimate("elementwise", ADAM_STEP_FLOPS_PER_PARAM * updated,
                                             ADAM_STEP_BYTES_PER_PARAM * updated, gpu, freq,
                                             "fp32", None)
            deps = sorted(set(self.dp_tail.get(p, [])))
            if p in last_compute:
                deps.append(last_compute[p])
            step[p] = b.add(name, -1, kind, self.compute_stream, (p,), est.time_s, 0.0, (), deps,
                            0.0, 0.0, est.power_w, freq or gpu.sm_clock_max_mhz, *NO_META)
        if plan.zero not in (1, 2) or not self.opt.communication:
            return
        w_bytes = optimizer_bytes_per_param(plan.dtype)[0]
        name, kind, stream = (b.name_template("params.all_gather"), b.kind("all_gather"),
                              b.stream("dp"))
        for s in range(plan.pp):
            dense = self._dense_params(s)
            # dense parameters over the dp groups, experts over their expert-data-parallel
            # groups (`param_groups`)
            parts = [(layout.dp_groups(s), dense * w_bytes),
                     (layout.expert_dp_groups(s), (layout.local_params(s) - dense) * w_bytes)]
            if plan.overlap_param_gather:  # the rest: behind the forward (overlapped_param_gather)
                parts = [(layout.dp_groups(s), self.param_bucket_bytes(s))]
            for groups, size in parts:
                if len(groups[0]) < 2 or size <= 0:
                    continue
                calls = ([(layout.stage_prog_ranks(s), groups)] if layout.fold
                         else [(g, [g]) for g in groups])
                for prog, copies in calls:
                    self.comm.tasks([("all_gather", size)], name=name, arg=-1, kind=kind,
                                    stream=stream, prog_ranks=prog, copies=copies,
                                    deps=[step[r] for r in prog], meta=NO_META)
