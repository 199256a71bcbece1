"""Lowering: ParallelPlan + model + cluster → Program (DESIGN.md §2).

One training iteration becomes tasks on per-rank streams:

* ``compute`` — each pipeline instruction (forward, backward or its input/weight halves,
  recompute) of each micro-batch as one task, timed by summing the op cost model over the
  stage's ops (stage_costs.py), and the optimizer step at the end;
* ``tp`` — the tensor-parallel collectives of that instruction, right after it (Megatron runs
  them synchronously between GEMMs, so their sum after the compute gives the same total time);
* ``pp:<src>><dst>`` — point-to-point activation/gradient transfers between consecutive stages,
  one FIFO channel per stage boundary and direction, shared by both ends;
* ``dp`` — data-parallel gradient synchronisation, bucketed (PyTorch DDP's 25 MiB default) and
  overlapped with the last micro-batch's backward, plus ZeRO traffic.

**Folding.** Members of one tensor-parallel group and data-parallel replicas behave identically,
so by default each pipeline stage is one program rank standing for its dp×tp GPUs. A folded
collective keeps its real links; where N folded copies would cross one link at once (the tp
groups' data-parallel all-reduces through one NIC), it crosses that link as ``<id>/N`` with
1/N of its bandwidth, so alone it takes exactly as long as the N concurrent copies would. `LoweringOptions(fold=False)` lowers every GPU as its own rank (stages whose GPUs are
of mixed types are never folded).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trainsim.errors import PlanError
from trainsim.simulator.actions import Action, infer_stage_to_rank
from trainsim.simulator.collectives import CommPhase, collective_time_s, plan_collective
from trainsim.simulator.program import Program, Task
from trainsim.simulator.schedules import explicit, get_schedule
from trainsim.workloads.model import ModelGraph, build_graph
from trainsim.workloads.ops import CommNeed
from trainsim.workloads.plan import MicroBatch, ParallelPlan
from trainsim.workloads.stage_costs import (
    ADAM_STEP_BYTES_PER_PARAM,
    ADAM_STEP_FLOPS_PER_PARAM,
    InstructionCosts,
    instruction_costs,
    optimizer_bytes_per_param,
)

KIND_OF_ACTION = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}


@dataclass(frozen=True, kw_only=True, slots=True)
class LoweringOptions:
    """Switches for what-if analyses and tests; the defaults model a real run."""

    fold: bool = True
    """Fold identical ranks (tp members, dp replicas) into one program rank per stage."""
    communication: bool = True
    """Model communication (False: every collective and transfer is free)."""
    embedding_and_head: bool = True
    """Place the embedding and LM-head layers on the first/last stage (False drops them, which
    makes stages exactly uniform — used to check textbook bubble formulas)."""
    optimizer_step: bool = True
    """End the iteration with the optimizer step."""
    dp_bucket_bytes: float = 25 * 2**20
    """Gradient bucket size for the overlapped data-parallel reduction (PyTorch DDP default)."""
    collective_algorithm: str = "auto"
    """Collective algorithm (auto picks the fastest alone per collective)."""
    cost_model: Any = None
    """Op cost model; the roofline (hwmodels/opcost.py) when None."""


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
    return _Lowering(model, cluster, plan, options or LoweringOptions()).build()


class _Lowering:
    """The state of one lowering; `build()` returns the Program."""

    def __init__(self, model: Any, cluster: Any, plan: ParallelPlan,
                 options: LoweringOptions) -> None:
        self.model, self.cluster, self.plan, self.opt = model, cluster, plan, options
        if options.cost_model is None:
            from trainsim.hwmodels.opcost import RooflineCostModel
            self.cost_model: Any = RooflineCostModel()
        else:
            self.cost_model = options.cost_model
        self.tasks: list[_Pending] = []
        self.links: dict[str, float] = {}
        self.micro_batches = plan.micro_batch_list(model.seq_len or 1)
        self.stage_gpu_ranks = self._place_stages()
        self.order = self._schedule()
        self.stage_to_rank = infer_stage_to_rank(self.order) if plan.num_stages > 1 \
            else {0: 0}
        self._check_stage_map()
        self.graphs: dict[tuple[int, int], ModelGraph] = {}
        self.stage_layers = self._partition()
        self.fold = options.fold and all(self._uniform_gpu(s) for s in range(plan.pp))
        # program ranks: folded → one per physical stage; unfolded → one per GPU
        if self.fold:
            self.num_ranks = plan.pp
            self.represents = [tuple(self.stage_gpu_ranks[s]) for s in range(plan.pp)]
        else:
            self.num_ranks = cluster.num_gpus
            self.represents = [(r,) for r in range(cluster.num_gpus)]

    # ------------------------------------------------------------------ placement & schedule
    def _place_stages(self) -> list[list[int]]:
        """Physical ranks of each pipeline stage, laid out [dp replica][tp index] (Megatron:
        tp innermost, then dp, then pp), filling node groups in order or as `placement` says."""
        plan, cluster = self.plan, self.cluster
        per_stage = plan.dp * plan.tp
        if plan.placement is None:
            return [list(range(s * per_stage, (s + 1) * per_stage)) for s in range(plan.pp)]
        starts, offset = [], 0
        for group in cluster.node_groups:
            starts.append(offset)
            offset += group.num_gpus
        used = [0] * len(starts)
        out = []
        for g in plan.placement:
            first = starts[g] + used[g]
            out.append(list(range(first, first + per_stage)))
            used[g] += per_stage
        return out

    def _schedule(self) -> dict[int, list[Action]]:
        plan = self.plan
        m = len(self.micro_batches)
        if plan.schedule == "explicit":
            order = explicit({r: list(a) for r, a in enumerate(plan.order or ())},
                             num_micro_batches=m)
        else:
            order = get_schedule(plan.schedule)(plan.pp, m, plan.virtual_stages)
        return {r: [a for a in acts if a is not None] for r, acts in order.items()}

    def _check_stage_map(self) -> None:
        plan = self.plan
        stages = sorted(self.stage_to_rank)
        if stages != list(range(plan.num_stages)):
            raise PlanError(f"plan schedule {plan.schedule!r} runs stages {stages} but the plan "
                            f"has pp×virtual_stages={plan.num_stages} stages")

    def _uniform_gpu(self, stage: int) -> bool:
        ranks = self.stage_gpu_ranks[stage]
        return len({self.cluster.gpu(r).name for r in ranks}) == 1

    def _partition(self) -> list[list[int]]:
        """Layer indices of each virtual stage: blocks split per the plan, layers before the
        first block join stage 0, other non-block layers join the stage of the block before."""
        graph = self.graph(self.micro_batches[0])
        counts = self.plan.layers_per_stage(len(graph.transformer_layers()))
        out: list[list[int]] = [[] for _ in counts]
        stage, seen = 0, 0
        for i, layer in enumerate(graph.layers):
            if layer.recomputable:
                while seen >= counts[stage]:
                    stage, seen = stage + 1, 0
                out[stage].append(i)
                seen += 1
            elif self.opt.embedding_and_head:
                out[stage].append(i)
        return out

    def graph(self, mb: MicroBatch) -> ModelGraph:
        key = (mb.batch_size, mb.seq_len)
        if key not in self.graphs:
            seq = None if self.model.family == "wresnet" else mb.seq_len
            self.graphs[key] = build_graph(self.model, mb.batch_size, seq)
        return self.graphs[key]

    # ------------------------------------------------------------------ costs
    def phys_stage(self, vstage: int) -> int:
        return self.stage_to_rank[vstage]

    def freq(self, vstage: int, action: Action | None) -> float | None:
        return self.plan.frequency_of(self.phys_stage(vstage), str(action) if action else None)

    @functools.cache  # noqa: B019 - one lowering object per call
    def costs(self, vstage: int, mb_key: tuple[int, int], freq: float | None) -> InstructionCosts:
        s = self.phys_stage(vstage)
        graph = self.graphs[mb_key]
        layers = [graph.layers[i] for i in self.stage_layers[vstage]]
        gpu = self.cluster.gpu(self.stage_gpu_ranks[s][0])
        return instruction_costs(layers, tp=self.plan.tp_of_stage(s), sp=self.plan.sp,
                                 ep=self.plan.ep, recompute=self.plan.recompute,
                                 cost_model=self.cost_model, gpu=gpu, freq_mhz=freq,
                                 dtype=self.plan.dtype)

    # ------------------------------------------------------------------ groups
    def tp_groups(self, s: int) -> list[tuple[int, ...]]:
        """Physical tensor-parallel groups of stage `s`."""
        t = self.plan.tp_of_stage(s)
        ranks = self.stage_gpu_ranks[s]
        return [tuple(ranks[i:i + t]) for i in range(0, len(ranks), t)]

    def dp_groups(self, s: int) -> list[tuple[int, ...]]:
        """Physical data-parallel groups of stage `s` (one per tp index)."""
        t = self.plan.tp_of_stage(s)
        ranks = self.stage_gpu_ranks[s]
        return [tuple(ranks[i::t]) for i in range(t)]

    def units(self, s: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """(program ranks, physical tp group) per replica unit of stage `s`."""
        if self.fold:
            return [((s,), self.tp_groups(s)[0])]
        return [(g, g) for g in self.tp_groups(s)]

    # ------------------------------------------------------------------ communication
    def comm_tasks(self, kind: str, name: str, stream: str, prog_ranks: tuple[int, ...],
                   copies: list[tuple[int, ...]], size_bytes: float, deps: list[int],
                   **meta: Any) -> list[int]:
        """Tasks of a collective over physical `copies[0]` (other copies run concurrently when
        folded); returns their ids in order (each depends on the previous)."""
        if not self.opt.communication or size_bytes <= 0 or len(copies[0]) < 2:
            return []
        phases = self._phases(kind, copies[0], size_bytes)
        load = self._link_load(kind, copies, size_bytes) if self.fold else {}
        ids: list[int] = []
        prev = list(deps)
        for merged in _merge_phases(phases):
            links: list[str] = []
            for link in merged.links if merged.bytes_per_link > 0 else ():
                n = load.get(link, 1)
                lid = link if n <= 1 else f"{link}/{n}"
                self.links.setdefault(lid, self.cluster.link(link).bandwidth_bytes_per_s / n)
                links.append(lid)
            task = _Pending(name=name, kind=kind, ranks=prog_ranks, stream=stream,
                            duration_s=merged.latency_s,
                            comm_bytes=merged.bytes_per_link if links else 0.0,
                            links=tuple(links), deps=prev, **meta)
            prev = [self._add(task)]
            ids.append(prev[0])
        return ids

    @functools.cache  # noqa: B019
    def _phases(self, kind: str, group: tuple[int, ...], size: float) -> tuple[CommPhase, ...]:
        return tuple(plan_collective(kind, group, size, self.cluster,
                                     self.opt.collective_algorithm if kind == "all_reduce"
                                     else "auto"))

    def _link_load(self, kind: str, copies: list[tuple[int, ...]], size: float
                   ) -> dict[str, int]:
        """How many folded copies of this collective load each link of the first copy.

        A folded task crosses link ``l`` as ``l/N`` with bandwidth bw/N when N copies share it
        (e.g. eight tp groups' data-parallel all-reduces through one NIC): alone, its time is
        then exactly that of the N concurrent copies, whichever link is the bottleneck.
        """
        key = (kind, tuple(copies), size)
        cache = self.__dict__.setdefault("_load_cache", {})
        if key not in cache:
            load: Counter[str] = Counter()
            for group in copies:
                for phase in self._phases(kind, group, size):
                    load.update(set(phase.links))
            cache[key] = dict(load)
        return cache[key]

    def tp_comm_time_s(self, needs: tuple[CommNeed, ...], group: tuple[int, ...]) -> float:
        """Time of an instruction's tensor-parallel collectives run alone (folded ranks)."""
        total = 0.0
        for need in needs:
            phases = self._phases(need.collective, group, need.size_bytes)
            bw = {link: self.cluster.link(link).bandwidth_bytes_per_s
                  for ph in phases for link in ph.links}
            total += collective_time_s(phases, bw)
        return total

    def tp_tasks(self, needs: tuple[CommNeed, ...], prog: tuple[int, ...],
                 group: tuple[int, ...], deps: list[int], **meta: Any) -> list[int]:
        """The tensor-parallel collectives of one instruction; returns the last task id(s)."""
        if not needs or len(group) < 2 or not self.opt.communication:
            return deps
        if self.fold:
            t = self.tp_comm_time_s(needs, group)
            kind = needs[0].collective if len({n.collective for n in needs}) == 1 else "tp_comm"
            return [self._add(_Pending(name=f"tp.{meta.get('name', '')}", kind=kind, ranks=prog,
                                       stream="tp", duration_s=t, deps=list(deps),
                                       **_strip(meta)))]
        last = list(deps)
        for need in needs:
            ids = self.comm_tasks(need.collective, f"tp.{meta.get('name', '')}", "tp", prog,
                                  [group], need.size_bytes, last, **_strip(meta))
            if ids:
                last = [ids[-1]]
        return last

    # ------------------------------------------------------------------ build
    def _add(self, task: _Pending) -> int:
        self.tasks.append(task)
        return len(self.tasks) - 1

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
        final_kind = {}  # vstage -> "W" when its backward is split (zero bubble), else "B"
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
                buckets = self._buckets(c) if sync else 1
                per_bucket: list[dict[int, int]] = [{} for _ in range(buckets)]
                for u, (prog, group) in enumerate(self.units(phys)):
                    self._instruction(a, u, prog, group, c, final_kind.get(a.stage, "B"),
                                      per_bucket)
                if sync:
                    self._dp_sync(a.stage, phys, c, per_bucket)
        for tid, key in self.patch:
            self.tasks[tid].deps.extend(self.recv.get(key, ()))
        if self.opt.optimizer_step:
            self._optimizer(self.dp_tail)
        return self._program()

    def _instruction(self, a: Action, u: int, prog: tuple[int, ...], group: tuple[int, ...],
                     c: InstructionCosts, final_kind: str, per_bucket: list[dict[int, int]]
                     ) -> None:
        """Tasks of one pipeline instruction on one replica unit (a tp group, or a folded
        stage): optional recompute, the compute (split into gradient buckets when the
        data-parallel sync overlaps it), its tensor-parallel collectives, and the send."""
        k, j = a.stage, a.micro_batch
        meta = {"micro_batch": j, "stage": k, "first_layer": self.stage_layers[k][0],
                    "last_layer": self.stage_layers[k][-1]}
        deps: list[int] = []
        waits: list[tuple[int, str, int, int]] = []
        if a.kind == "F" and k > 0:
            waits.append((k, "F", j, u))
        if a.kind in ("B", "I") and k < self.plan.num_stages - 1:
            waits.append((k, "B", j, u))
        if a.kind in ("B", "I", "W"):
            deps += self.done[(k, "F", j, u)]
        if a.kind == "W":
            deps += self.done[(k, "I", j, u)]
        if a.kind in ("B", "I") and c.recompute.time_s > 0:
            rids = self._compute(prog, "recompute", f"s{k}.R{j}", c.recompute, deps, a,
                                 c.recompute_activation_bytes, 0.0, meta)
            self.patch.extend((rid, key) for rid in rids for key in waits)
            waits = []
            deps = self.tp_tasks(c.recompute_comm, prog, group, rids, name=f"s{k}.R{j}", **meta)
        work = {"F": c.forward, "B": c.backward, "I": c.backward_input,
                "W": c.backward_weight}[a.kind]
        alloc = c.kept_activation_bytes if a.kind == "F" else 0.0
        if a.kind == "F":
            self.held[(k, j, u)] = alloc
        free = self.held.get((k, j, u), 0.0) + c.recompute_activation_bytes \
            if a.kind == final_kind else 0.0
        n = len(per_bucket)
        name = f"s{k}.{a.kind}{j}"
        part = type(work)(time_s=work.time_s / n, energy_j=work.energy_j / n)
        ids: list[int] = []
        for b in range(n):
            ids = self._compute(prog, KIND_OF_ACTION[a.kind], name if n == 1 else f"{name}.b{b}",
                                part, deps if b == 0 else ids, a, alloc,
                                free if b == n - 1 else 0.0, meta)
            if b == 0:
                self.patch.extend((tid, key) for tid in ids for key in waits)
            for p, tid in zip(prog, ids):
                per_bucket[b][p] = tid
        needs = {"F": c.fwd_comm, "B": c.bwd_comm, "I": c.bwd_comm, "W": ()}[a.kind]
        self.done[(k, a.kind, j, u)] = self.tp_tasks(needs, prog, group, ids, name=name, **meta)
        self._send(a, k, j, u, self.done[(k, a.kind, j, u)], meta)

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
            if self.fold:
                prog = (phys,)
                ids = self.comm_tasks(kind, label, "dp", prog, copies, grad_bytes / n,
                                      [per_bucket[b][phys]], stage=k)
                self.dp_tail[phys].extend(ids[-1:])
                continue
            for group in copies:
                deps = [per_bucket[b][r] for r in group]
                ids = self.comm_tasks(kind, label, "dp", group, [group], grad_bytes / n, deps,
                                      stage=k)
                for r in group:
                    self.dp_tail[r].extend(ids[-1:])

    def _compute(self, prog: tuple[int, ...], kind: str, name: str, work: Any, deps: list[int],
                 action: Action, alloc: float, free: float, meta: dict[str, Any]) -> list[int]:
        """One compute task per program rank of the unit; returns their ids."""
        freq = self.freq(action.stage, action)
        ids = []
        for p in prog:
            f = freq or self.cluster.gpu(self.represents[p][0]).sm_clock_max_mhz
            ids.append(self._add(_Pending(name=name, kind=kind, ranks=(p,), stream="compute",
                                          duration_s=work.time_s, power_w=work.power_w,
                                          freq_mhz=f, deps=list(deps), mem_alloc_bytes=alloc,
                                          mem_free_bytes=free, **meta)))
        return ids

    def _send(self, a: Action, k: int, j: int, u: int, after: list[int],
              meta: dict[str, Any]) -> None:
        """Point-to-point transfer of activations (after F) or gradients (after B/I) to the
        matching unit of the neighbouring stage; records what the receiver waits for."""
        if a.kind == "F" and k < self.plan.num_stages - 1:
            dst, direction = k + 1, "F"
            size = self.costs(k, self._mb_key(j), self.freq(k, None)).output_bytes
        elif a.kind in ("B", "I") and k > 0:
            dst, direction = k - 1, "B"
            size = self.costs(k - 1, self._mb_key(j), self.freq(k - 1, None)).output_bytes
        else:
            return
        key = (dst, direction, j, u)
        src_s, dst_s = self.phys_stage(k), self.phys_stage(dst)
        if src_s == dst_s or not self.opt.communication or size <= 0:
            self.recv[key] = list(after)
            return
        src_ranks, dst_ranks = self.stage_gpu_ranks[src_s], self.stage_gpu_ranks[dst_s]
        pairs = list(zip(src_ranks, dst_ranks))
        stream = f"pp{src_s}>{dst_s}"
        label = f"s{k}>{dst}.{direction}{j}"
        if self.fold:
            self.recv[key] = self.comm_tasks("p2p", label, stream, (src_s, dst_s), pairs, size,
                                             after, **meta)[-1:] or list(after)
            return
        unit = set(self.units(src_s)[u][0])
        ids: list[int] = []
        for src_r, dst_r in pairs:
            if src_r in unit:
                ids += self.comm_tasks("p2p", label, stream, (src_r, dst_r), [(src_r, dst_r)],
                                       size, after, **meta)[-1:]
        self.recv[key] = ids or list(after)

    def _mb_key(self, j: int) -> tuple[int, int]:
        mb = self.micro_batches[j]
        return (mb.batch_size, mb.seq_len)

    def _optimizer(self, dp_tail: dict[int, list[int]]) -> None:
        plan = self.plan
        for p in range(self.num_ranks):
            phys_stage = self._phys_stage_of_prog(p)
            params = self._local_params(phys_stage)
            dp = plan.dp_of_stage(phys_stage)
            updated = params / dp if plan.zero >= 1 else params
            gpu = self.cluster.gpu(self.represents[p][0])
            est = self.cost_model.estimate("elementwise", ADAM_STEP_FLOPS_PER_PARAM * updated,
                                           ADAM_STEP_BYTES_PER_PARAM * updated, gpu, None, "fp32",
                                           None)
            deps = sorted(set(dp_tail.get(p, [])))
            deps += [i for i in range(len(self.tasks)) if p in self.tasks[i].ranks
                     and self.tasks[i].stream == "compute"][-1:]
            tid = self._add(_Pending(name="optimizer", kind="optimizer", ranks=(p,),
                                     stream="compute", duration_s=est.time_s,
                                     power_w=est.power_w, deps=deps))
            if plan.zero >= 1 and dp > 1 and self.opt.communication:
                w_bytes = optimizer_bytes_per_param(plan.dtype)[0]
                groups = self.dp_groups(phys_stage)
                mine = groups if self.fold else [g for g in groups if p in g]
                self.comm_tasks("all_gather", "params.all_gather", "dp", (p,) if self.fold
                                else mine[0], mine, params * w_bytes, [tid])

    def _phys_stage_of_prog(self, p: int) -> int:
        if self.fold:
            return p
        for s, ranks in enumerate(self.stage_gpu_ranks):
            if p in ranks:
                return s
        raise AssertionError(p)

    def _local_params(self, phys_stage: int) -> float:
        mb = self.micro_batches[0]
        key = (mb.batch_size, mb.seq_len)
        return float(sum(self.costs(k, key, None).params for k in self.stage_layers_idx(phys_stage)))

    def stage_layers_idx(self, phys_stage: int) -> list[int]:
        return [k for k, r in self.stage_to_rank.items() if r == phys_stage]

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
        tasks = [Task(name=t.name, kind=t.kind, ranks=t.ranks, stream=t.stream,
                      duration_s=t.duration_s, comm_bytes=t.comm_bytes, links=t.links,
                      deps=tuple(t.deps), mem_alloc_bytes=t.mem_alloc_bytes,
                      mem_free_bytes=t.mem_free_bytes, power_w=t.power_w, freq_mhz=t.freq_mhz,
                      micro_batch=t.micro_batch, stage=t.stage, first_layer=t.first_layer,
                      last_layer=t.last_layer) for t in self.tasks]
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
                       link_bandwidth_bytes_per_s=dict(sorted(self.links.items())),
                       static_memory_bytes=static, memory_capacity_bytes=capacity,
                       idle_power_w=idle, represents=self.represents, metadata=metadata)


def _merge_phases(phases: tuple[CommPhase, ...]) -> list[CommPhase]:
    """Merge consecutive phases over the same links into one task (same time alone, fewer
    tasks): latencies and bytes add."""
    out: list[CommPhase] = []
    for ph in phases:
        if out and out[-1].links == ph.links:
            prev = out[-1]
            out[-1] = CommPhase(name=prev.name, ranks=prev.ranks,
                                latency_s=prev.latency_s + ph.latency_s,
                                bytes_per_link=prev.bytes_per_link + ph.bytes_per_link,
                                links=prev.links)
        else:
            out.append(ph)
    return out


def _strip(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k != "name"}
