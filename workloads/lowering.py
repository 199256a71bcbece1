"""Lowering: ParallelPlan + model + cluster → Program (DESIGN.md §2).

One training iteration becomes tasks on per-rank streams:

* ``compute`` — each pipeline instruction (forward, backward or its input/weight halves,
  recompute) of each micro-batch as one task, timed by summing the op cost model over the
  stage's ops (stage_costs.py), and the optimizer step at the end;
* ``tp`` — the tensor-parallel collectives of that instruction, right after it (Megatron runs
  them synchronously between GEMMs, so their sum after the compute gives the same total time);
* ``pp:<src>><dst>`` — point-to-point activation/gradient transfers between consecutive stages,
  one FIFO channel per stage boundary and direction, shared by both ends;
* ``ep`` — expert-parallel all-to-alls (MoE dispatch/combine) over each stage's ep groups;
* ``dp`` — data-parallel gradient synchronisation, bucketed (PyTorch DDP's 25 MiB default) and
  overlapped with the last micro-batch's backward, plus ZeRO traffic (ZeRO-1/2 parameter
  all-gather after the step; ZeRO-3 parameter gathers before every pass).

Communication tasks are built by `lowering_comm.CommLowering`.

**Folding.** Members of one tensor-parallel group and data-parallel replicas behave identically,
so by default each pipeline stage is one program rank standing for its dp×tp GPUs. A folded
collective keeps its real links; where N folded copies would cross one link at once (the tp
groups' data-parallel all-reduces through one NIC), it crosses that link as ``<id>/N`` with
1/N of its bandwidth, so alone it takes exactly as long as the N concurrent copies would. `LoweringOptions(fold=False)` lowers every GPU as its own rank (stages whose GPUs are
of mixed types are never folded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainsim.errors import PlanError
from trainsim.simulator.actions import Action
from trainsim.simulator.program import Program, trusted_task
from trainsim.workloads.lowering_comm import CommLowering, Need, kind_of
from trainsim.workloads.lowering_layout import (  # re-exported: the public lowering API
    LoweringLayout,
    LoweringOptions,
    StageLayout,
    stage_layout,
)
from trainsim.workloads.ops import CommNeed
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.stage_costs import (
    ADAM_STEP_BYTES_PER_PARAM,
    ADAM_STEP_FLOPS_PER_PARAM,
    InstructionCosts,
    Work,
    optimizer_bytes_per_param,
)

KIND_OF_ACTION = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}


@dataclass(slots=True)
class _Pending:
    """A task under construction (deps may be filled in after its id is known)."""

    name: str
    kind: str
    ranks: tuple[int, ...]
    stream: str
    duration_s: float
    comm_bytes: float = 0.0
    links: tuple[str, ...] = ()
    deps: list[int] = field(default_factory=list)
    mem_alloc_bytes: float = 0.0
    mem_free_bytes: float = 0.0
    power_w: float = 0.0
    freq_mhz: float | None = None
    micro_batch: int = -1
    stage: int = -1
    first_layer: int = -1
    last_layer: int = -1


def lower(model: Any, cluster: Any, plan: ParallelPlan,
          options: LoweringOptions | None = None) -> Program:
    """Lower one training iteration of `model` on `cluster` under `plan` to a Program."""
    plan.check(model, cluster)
    if plan.op_tp:
        # Refuse rather than silently simulate the stage-wide degree: per-op degrees need
        # resharding collectives between ops, which the lowering does not model yet.
        raise PlanError(f"plan.op_tp={dict(plan.op_tp)}: per-op tensor-parallel degrees are "
                        f"not simulated yet; use stage_tp for per-stage degrees")
    return _Lowering(model, cluster, plan, options or LoweringOptions()).build()


class _Lowering(LoweringLayout):
    """The state of one lowering; `build()` returns the Program."""

    def __init__(self, model: Any, cluster: Any, plan: ParallelPlan,
                 options: LoweringOptions) -> None:
        super().__init__(model, cluster, plan, options)
        self.tasks: list[_Pending] = []
        self.comm = CommLowering(cluster, options.collective_algorithm, self._add_fields)

    def _cross_unit(self, s: int, groups: list[tuple[int, ...]], needs: list[Need], *,
                    name: str, kind: str, stream: str, last: dict[int, list[int]],
                    meta: dict[str, Any], **task: Any) -> dict[int, list[int]]:
        """Collectives over groups that may span several units (expert-parallel all-to-alls,
        ZeRO-3 parameter gathers): each group waits for `last` of every unit it touches, and
        every unit then waits for the groups holding its ranks. Returns the new `last`."""
        if not needs or not self.opt.communication or len(groups[0]) < 2:
            return last
        if self.fold:
            ids = self.comm.tasks(needs, name=name, kind=kind, stream=stream, prog_ranks=(s,),
                                  copies=groups, deps=last[0], meta={**meta, **task})
            return {0: ids[-1:] or last[0]}
        unit_of = {r: u for u, (prog, _) in enumerate(self.units(s)) for r in prog}
        out: dict[int, list[int]] = {u: [] for u in last}
        for group in groups:
            touched = sorted({unit_of[r] for r in group})
            deps = sorted({d for u in touched for d in last[u]})
            ids = self.comm.tasks(needs, name=name, kind=kind, stream=stream, prog_ranks=group,
                                  copies=[group], deps=deps, meta={**meta, **task})
            for u in touched:
                out[u] += ids[-1:] or last[u]
        return {u: sorted(set(v)) for u, v in out.items()}

    def tp_tasks(self, needs: tuple[CommNeed, ...], s: int, prog: tuple[int, ...],
                 group: tuple[int, ...], deps: list[int], name: str,
                 meta: dict[str, Any]) -> list[int]:
        """The tensor-parallel collectives of one instruction, right after its compute
        (Megatron runs them synchronously between GEMMs, so their sum after the compute takes
        the same total time); returns what the next step waits for."""
        if not needs or len(group) < 2 or not self.opt.communication \
                or not self.opt.tp_communication:
            return deps
        pairs = [(n.collective, n.size_bytes) for n in needs]
        copies = self.tp_groups(s) if self.fold else [group]
        ids = self.comm.tasks(pairs, name=f"tp.{name}", kind=kind_of(pairs), stream="tp",
                              prog_ranks=prog, copies=copies, deps=deps, meta=meta)
        return ids[-1:] or deps

    # ------------------------------------------------------------------ build
    def _add(self, task: _Pending) -> int:
        self.tasks.append(task)
        return len(self.tasks) - 1

    def _add_fields(self, fields: dict[str, Any]) -> int:
        return self._add(_Pending(**fields))

    def build(self) -> Program:
        """Create every task: pipeline instructions rank by rank in schedule order, then the
        optimizer step. Transfers are created by their sender, so a receiver's dependency on one
        may not exist yet when the receiver's task is made; such deps are patched at the end."""
        plan = self.plan
        self.done: dict[tuple[int, str, int, int], list[int]] = {}
        self.held: dict[tuple[int, int, int], float] = {}
        self.recv: dict[tuple[int, str, int, int], list[int]] = {}
        self.patch: list[tuple[int, tuple[int, str, int, int]]] = []
        self.dp_tail: dict[int, list[int]] = {r: [] for r in range(self.num_ranks)}
        self.history: dict[tuple[int, int], list[int]] = {}  # (stage, unit) -> compute ids
        final_kind: dict[int, str] = {}  # vstage -> "W" when its backward is split, else "B"
        last_bwd: dict[int, tuple[str, int]] = {}
        for acts in self.order.values():
            for a in acts:
                if a.kind in ("B", "W"):
                    last_bwd[a.stage] = (a.kind, a.micro_batch)
                    final_kind[a.stage] = a.kind
        for phys in sorted(self.order):
            for a in self.order[phys]:
                mb = self.micro_batches[a.micro_batch]
                self.graph(mb)
                c = self.costs(a.stage, (mb.batch_size, mb.seq_len), self.freq(a.stage, a))
                sync = (last_bwd.get(a.stage) == (a.kind, a.micro_batch)
                        and plan.dp_of_stage(phys) > 1 and self.opt.communication)
                per_bucket: list[dict[int, int]] = [{} for _ in
                                                     range(self._buckets(c) if sync else 1)]
                self._instruction(a, phys, c, final_kind.get(a.stage, "B"), per_bucket)
                if sync:
                    self._dp_sync(a.stage, phys, c, per_bucket)
        for tid, key in self.patch:
            self.tasks[tid].deps.extend(self.recv.get(key, ()))
        if self.opt.optimizer_step:
            self._optimizer()
        return self._program()

    def _instruction(self, a: Action, phys: int, c: InstructionCosts, final_kind: str,
                     per_bucket: list[dict[int, int]]) -> None:
        """Tasks of one pipeline instruction on every replica unit of its stage: ZeRO-3
        parameter gather, recompute (with its collectives), the compute (split into gradient
        buckets when the data-parallel sync overlaps it), its tensor- and expert-parallel
        collectives, and the send to the neighbouring stage."""
        k, j = a.stage, a.micro_batch
        units = self.units(phys)
        meta = {"micro_batch": j, "stage": k, "first_layer": self.stage_layers[k][0],
                "last_layer": self.stage_layers[k][-1]}
        waits: list[tuple[int, str, int, int]] = []
        if a.kind == "F" and k > 0:
            waits.append((k, "F", j))
        if a.kind in ("B", "I") and k < self.plan.num_stages - 1:
            waits.append((k, "B", j))
        last: dict[int, list[int]] = {u: [] for u in range(len(units))}
        for u in last:
            if a.kind in ("B", "I", "W"):
                last[u] += self.done[(k, "F", j, u)]
            if a.kind == "W":
                last[u] += self.done[(k, "I", j, u)]
        gathered = self._zero3_gather(a, phys, c, meta)
        if gathered is not None:
            last = {u: sorted(set(last[u]) | set(gathered[u])) for u in last}
        if a.kind in ("B", "I") and c.recompute.time_s > 0:
            for u, (prog, group) in enumerate(units):
                rids = self._compute(prog, "recompute", f"s{k}.R{j}", c.recompute, last[u], a,
                                     c.recompute_activation_bytes, 0.0, meta)
                self.patch.extend((rid, (*key, u)) for rid in rids for key in waits)
                last[u] = self.tp_tasks(c.recompute_comm, phys, prog, group, rids,
                                        f"s{k}.R{j}", meta)
            waits = []
            last = self._ep_tasks(c.recompute_ep_comm, phys, f"s{k}.R{j}", last, meta)
        work = {"F": c.forward, "B": c.backward, "I": c.backward_input,
                "W": c.backward_weight}[a.kind]
        alloc = c.kept_activation_bytes if a.kind == "F" else 0.0
        n = len(per_bucket)
        name = f"s{k}.{a.kind}{j}"
        part = Work(time_s=work.time_s / n, energy_j=work.energy_j / n)
        for u, (prog, group) in enumerate(units):
            if a.kind == "F":
                self.held[(k, j, u)] = alloc
            free = self.held.get((k, j, u), 0.0) + c.recompute_activation_bytes \
                if a.kind == final_kind else 0.0
            if gathered is not None:
                free += self._zero3_bytes(phys, c)
            ids: list[int] = last[u]
            for b in range(n):
                ids = self._compute(prog, KIND_OF_ACTION[a.kind],
                                    name if n == 1 else f"{name}.b{b}", part, ids, a,
                                    alloc if b == 0 else 0.0, free if b == n - 1 else 0.0, meta)
                if b == 0:
                    self.patch.extend((tid, (*key, u)) for tid in ids for key in waits)
                for p, tid in zip(prog, ids):
                    per_bucket[b][p] = tid
            self.history.setdefault((phys, u), []).append(ids[0])
            needs = {"F": c.fwd_comm, "B": c.bwd_comm, "I": c.bwd_comm, "W": ()}[a.kind]
            last[u] = self.tp_tasks(needs, phys, prog, group, ids, name, meta)
        ep_needs = {"F": c.fwd_ep_comm, "B": c.bwd_ep_comm, "I": c.bwd_ep_comm, "W": ()}[a.kind]
        last = self._ep_tasks(ep_needs, phys, name, last, meta)
        for u in last:
            self.done[(k, a.kind, j, u)] = last[u]
            self._send(a, u, last[u], meta)

    def _ep_tasks(self, needs: tuple[CommNeed, ...], phys: int, name: str,
                  last: dict[int, list[int]], meta: dict[str, Any]) -> dict[int, list[int]]:
        """Expert-parallel all-to-alls (MoE dispatch/combine) over the stage's ep groups."""
        if not needs or self.plan.ep < 2:
            return last
        pairs = [(n.collective, n.size_bytes) for n in needs]
        return self._cross_unit(phys, self.ep_groups(phys), pairs, name=f"ep.{name}",
                                kind=kind_of(pairs), stream="ep", last=last, meta=meta)

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

    def _zero3_gather(self, a: Action, phys: int, c: InstructionCosts, meta: dict[str, Any]
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
        return self._cross_unit(phys, self.dp_groups(phys), [("all_gather", size)],
                                name=f"s{a.stage}.{a}.gather", kind="all_gather", stream="dp",
                                last=prefetch, meta={"mem_alloc_bytes":
                                                     self._zero3_bytes(phys, c)} | meta)

    def _buckets(self, c: InstructionCosts) -> int:
        """Gradient buckets of a stage (bucket size from the options, 1..16)."""
        grad_bytes = c.params * optimizer_bytes_per_param(self.plan.dtype)[1]
        return max(1, min(16, round(grad_bytes / self.opt.dp_bucket_bytes)))

    def _dp_sync(self, k: int, phys: int, c: InstructionCosts,
                 per_bucket: list[dict[int, int]]) -> None:
        """Data-parallel gradient reduction of each bucket as soon as its backward part ends
        (PyTorch DDP / Megatron overlap_grad_reduce); reduce-scatter under ZeRO >= 1."""
        grad_bytes = c.params * optimizer_bytes_per_param(self.plan.dtype)[1]
        kind = "all_reduce" if self.plan.zero == 0 else "reduce_scatter"
        copies = self.dp_groups(phys)
        n = len(per_bucket)
        for b in range(n):
            label = f"s{k}.dp" + ("" if n == 1 else f".b{b}")
            groups = [((phys,), copies)] if self.fold else [(g, [g]) for g in copies]
            for prog, cps in groups:
                ids = self.comm.tasks([(kind, grad_bytes / n)], name=label, kind=kind,
                                      stream="dp", prog_ranks=prog, copies=cps,
                                      deps=[per_bucket[b][r] for r in prog],
                                      meta={"stage": k})
                for r in prog:
                    self.dp_tail[r].extend(ids[-1:])

    def _compute(self, prog: tuple[int, ...], kind: str, name: str, work: Work, deps: list[int],
                 action: Action, alloc: float, free: float, meta: dict[str, Any]) -> list[int]:
        """One compute task per program rank of the unit, at the instruction's SM clock
        (the GPU's maximum when the plan sets none); returns their ids."""
        freq = self.freq(action.stage, action)
        ids = []
        for p in prog:
            f = freq or self.cluster.gpu(self.represents[p][0]).sm_clock_max_mhz
            ids.append(self._add(_Pending(name=name, kind=kind, ranks=(p,), stream="compute",
                                          duration_s=work.time_s, power_w=work.power_w,
                                          freq_mhz=f, deps=list(deps), mem_alloc_bytes=alloc,
                                          mem_free_bytes=free, **meta)))
        return ids

    def boundary_bytes(self, k: int, j: int) -> float:
        key = (k, self._mb_key(j))
        cache = self.__dict__.setdefault("_boundary_cache", {})
        if key not in cache:
            cache[key] = self._boundary_bytes(k, j)
        return cache[key]

    def _boundary_bytes(self, k: int, j: int) -> float:
        """Bytes crossing the boundary after virtual stage `k` for micro-batch `j` (per GPU):
        the last layer's output, plus the encoder output when layers after the boundary
        still read it (T5 cross attention; Megatron-LM sends both through its pipeline)."""
        key = self._mb_key(j)
        size = self.costs(k, key, None).output_bytes
        layers = self.graphs[key].layers
        cut = self.stage_layers[k][-1] + 1
        side = max((la.side_input_bytes for la in layers[cut:]), default=0.0)
        if side > 0:
            first_reader = next(i for i, la in enumerate(layers) if la.side_input_bytes > 0)
            if cut >= first_reader - 1:  # the encoder has finished before the boundary
                div = self.plan.tp_of_stage(self.phys_stage(k)) if self.plan.sp else 1
                size += side / div
        return size

    def _send(self, a: Action, u: int, after: list[int], meta: dict[str, Any]) -> None:
        """Point-to-point transfer of activations (after F) or gradients (after B/I) to the
        neighbouring stage; records what each receiving unit waits for."""
        k, j = a.stage, a.micro_batch
        if a.kind == "F" and k < self.plan.num_stages - 1:
            dst, direction, size = k + 1, "F", self.boundary_bytes(k, j)
        elif a.kind in ("B", "I") and k > 0:
            dst, direction, size = k - 1, "B", self.boundary_bytes(k - 1, j)
        else:
            return
        src_s, dst_s = self.phys_stage(k), self.phys_stage(dst)
        if src_s == dst_s or not self.opt.communication or size <= 0:
            self.recv.setdefault((dst, direction, j, u), []).extend(after)
            return
        pairs, size = self._p2p_pairs(src_s, dst_s, size, j)
        stream = f"pp{src_s}>{dst_s}"
        label = f"s{k}>{dst}.{direction}{j}"
        if self.fold:
            ids = self.comm.tasks([("p2p", size)], name=label, kind="p2p", stream=stream,
                                  prog_ranks=(src_s, dst_s), copies=pairs, deps=after, meta=meta)
            self.recv.setdefault((dst, direction, j, 0), []).extend(ids[-1:] or after)
            return
        unit = set(self.units(src_s)[u][0])
        dst_unit = {r: v for v, (prog, _) in enumerate(self.units(dst_s)) for r in prog}
        for src_r, dst_r in pairs:
            if src_r in unit:
                ids = self.comm.tasks([("p2p", size)], name=label, kind="p2p", stream=stream,
                                      prog_ranks=(src_r, dst_r), copies=[(src_r, dst_r)],
                                      deps=after, meta=meta)
                self.recv.setdefault((dst, direction, j, dst_unit[dst_r]), []).extend(
                    ids[-1:] or after)

    def _p2p_pairs(self, src_s: int, dst_s: int, size: float, j: int
                   ) -> tuple[list[tuple[int, int]], float]:
        """(src, dst) GPU pairs of a stage-boundary transfer and the bytes of each.

        Equal stages pair GPU i with GPU i (Megatron). Stages of different sizes (`stage_gpus`)
        pair the n = max(|src|, |dst|) slots round-robin; each pair carries the smaller of
        what a source GPU holds and what a destination GPU needs, per slot: `size` (one source
        GPU's boundary tensor) × |src| / n, and the same tensor at the destination's replica
        batch × |dst| / n. This reshards data-parallel splits exactly (1 GPU → 4 GPUs sends four
        quarters) and counts a tensor-parallel group's replicated activations once per GPU.
        """
        src, dst = self.stage_gpu_ranks[src_s], self.stage_gpu_ranks[dst_s]
        if len(src) == len(dst) and self.plan.stage_gpus is None:
            return list(zip(src, dst)), size
        n = max(len(src), len(dst))
        pairs = [(src[i * len(src) // n], dst[i * len(dst) // n]) for i in range(n)]
        b = self.micro_batches[j].batch_size
        src_b = self.plan.replica_batch(src_s, b)
        dst_b = self.plan.replica_batch(dst_s, b)
        per_pair = min(size * len(src) / n, size * dst_b / src_b * len(dst) / n)
        return pairs, per_pair

    def _optimizer(self) -> None:
        """The Adam step on each rank after its last compute and gradient reduction; under
        ZeRO-1/2 each rank updates its 1/dp shard and the shards are all-gathered (ZeRO-3
        keeps the parameters sharded and gathers them before each pass instead)."""
        plan = self.plan
        last_compute: dict[int, int] = {}
        for tid, t in enumerate(self.tasks):
            if t.stream == "compute":
                last_compute[t.ranks[0]] = tid
        step: dict[int, int] = {}
        for p in range(self.num_ranks):
            phys_stage = self._phys_stage_of_prog(p)
            params = self._local_params(phys_stage)
            updated = params / plan.dp_of_stage(phys_stage) if plan.zero >= 1 else params
            gpu = self.cluster.gpu(self.represents[p][0])
            est = self.cost_model.estimate("elementwise", ADAM_STEP_FLOPS_PER_PARAM * updated,
                                           ADAM_STEP_BYTES_PER_PARAM * updated, gpu, None, "fp32",
                                           None)
            deps = sorted(set(self.dp_tail.get(p, [])))
            if p in last_compute:
                deps.append(last_compute[p])
            step[p] = self._add(_Pending(name="optimizer", kind="optimizer", ranks=(p,),
                                         stream="compute", duration_s=est.time_s,
                                         power_w=est.power_w, freq_mhz=gpu.sm_clock_max_mhz,
                                         deps=deps))
        if plan.zero not in (1, 2) or not self.opt.communication:
            return
        w_bytes = optimizer_bytes_per_param(plan.dtype)[0]
        for s in range(plan.pp):
            if plan.dp_of_stage(s) < 2:
                continue
            size = self._local_params(s) * w_bytes
            groups = self.dp_groups(s)
            calls = [((s,), groups)] if self.fold else [(g, [g]) for g in groups]
            for prog, copies in calls:
                self.comm.tasks([("all_gather", size)], name="params.all_gather",
                                kind="all_gather", stream="dp", prog_ranks=prog, copies=copies,
                                deps=[step[r] for r in prog], meta={})

    # ------------------------------------------------------------------ program
    def _program(self) -> Program:
        plan, cluster = self.plan, self.cluster
        w, g, o = optimizer_bytes_per_param(plan.dtype)
        static, capacity, idle, gpu_names, peaks = [], [], [], [], []
        for p in range(self.num_ranks):
            s = self._phys_stage_of_prog(p)
            params = self._local_params(s)
            dp = plan.dp_of_stage(s)
            per_param = (w / (dp if plan.zero >= 3 else 1) + g / (dp if plan.zero >= 2 else 1)
                         + o / (dp if plan.zero >= 1 else 1))
            gpu = cluster.gpu(self.represents[p][0])
            static.append(params * per_param)
            capacity.append(float(gpu.memory_bytes))
            idle.append(float(cluster.idle_power_w(self.represents[p][0])))
            gpu_names.append(gpu.name)
            peaks.append(float(gpu.peak_flops(plan.dtype)))
        # The lowering computes every number itself, so tasks skip the per-field checks.
        tasks = [trusted_task((t.name, t.kind, t.ranks, t.stream, float(t.duration_s),
                               float(t.comm_bytes), t.links, tuple(t.deps),
                               float(t.mem_alloc_bytes), float(t.mem_free_bytes),
                               float(t.power_w), t.freq_mhz, t.micro_batch, t.stage,
                               t.first_layer, t.last_layer)) for t in self.tasks]
        model_flops = sum(self.graph(mb).training_flops("none", matmul_only=True)
                          for mb in self.micro_batches) * plan.dp
        tokens = sum(mb.batch_size * mb.seq_len for mb in self.micro_batches) * plan.dp
        if self.model.family == "wresnet":
            tokens = plan.global_batch
        metadata = {
            "model": self.model.name, "plan": plan.to_dict(), "global_batch": plan.global_batch,
            "seq_len": self.micro_batches[0].seq_len, "tokens_per_iteration": tokens,
            "model_flops_per_iteration": model_flops, "peak_flops_per_rank": peaks,
            "gpu_names": gpu_names, "folded": self.fold,
            "price_per_hour_usd": float(cluster.price_per_hour_usd),
        }
        return Program(num_ranks=self.num_ranks, tasks=tasks,
                       link_bandwidth_bytes_per_s=dict(sorted(self.comm.links.items())),
                       static_memory_bytes=static, memory_capacity_bytes=capacity,
                       idle_power_w=idle, represents=self.represents, metadata=metadata)


__all__ = ["LoweringOptions", "StageLayout", "lower", "stage_layout"]
