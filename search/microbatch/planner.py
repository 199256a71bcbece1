"""Micro-batching methods compared iteration by iteration on the engine (`sim microbatch`).

For each global batch of variable-length samples, a method forms micro-batches per
data-parallel replica (batching.py); the planner then picks the recompute policy (none, then
selective, then full: the first under which the method's micro-batches fit -- for the
baselines every stage's model states and the heaviest run of pp - k consecutive micro-batches
1F1B keeps on stage k; for DynaPipe's split, each micro-batch in every in-flight slot of the
neediest stage, its own bound) and replays the
iteration on the engine under each schedule the method may use, keeping the fastest that does
not run out of memory. Methods:

* `packing`, `token-budget`, `fixed` -- the baselines; each fixes its setting (rows or samples
  per micro-batch, token budget) once, on the first batch, to the one the cost model rates
  fastest that fits, as a user would tune it; 1F1B. Packing runs `packing_attention` (default
  eager). DynaPipe's baseline (its artifact, chenyu-jiang/Megatron-LM branch dynapipe:
  run_experiment.py passes --pack-dataset, no --use-flash-attn and no --reset-attention-mask)
  packs samples into max-length rows under the plain causal mask, so attention spans the row,
  with Megatron's eager attention -- which DynaPipe itself also ran: compare methods on one
  kernel (give the model `attention="eager"`, as bench/microbatch.py does), or packing's
  eager rows meet FlashAttention micro-batches.
* `dynapipe` -- faithful: ordering, DP over thinned t_max candidates, Karmarkar–Karp; 1F1B or
  DynaPipe's wait-free cyclic order (simulator/cyclic_schedule.py; uncapped, then capped to
  the activation budget), whichever the engine finds fastest within memory. These are the
  two DynaPipe offers for a linear layer placement (dynapipe/pipe/utils.py,
  `validate_device_assignment`), the placement its artifact runs (chenyu-jiang/Megatron-LM
  run_experiment.py, `get_layer_to_device`); its interleaved 1F1B needs an interleaved
  placement, which it refuses for decoder-only models.
* `ours` -- the exact t_max search and, jointly, per iteration: that split or the thinned one,
  on 1F1B, interleaved, ZB-H1 or cyclic, whichever replays fastest within memory; `ours-1f1b`
  the exact split on 1F1B only (what the joint choice adds).

Reported per method: real tokens/s (padding excluded), padding efficiency, peak memory,
recompute used, schedule chosen and planning time (forming the micro-batches, without the
replay).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.errors import PlanError, SpecError
from trainsim.hwmodels.cluster import Cluster
from trainsim.search.microbatch.batching import Batching, dynapipe, fixed, packing, token_budget
from trainsim.search.microbatch.costs import MicroBatchCosts
from trainsim.search.oracle import Oracle, Summary
from trainsim.simulator.cyclic_schedule import cyclic_cap, max_window
from trainsim.workloads.lengths import LengthDataset, Sample
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan

MAX_SAMPLES = 1024
"""Samples per batch the dynamic programs accept (their segment tables are n x n)."""
METHODS = ("packing", "token-budget", "fixed", "dynapipe", "ours-1f1b", "ours")
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = {"packing": ("1f1b",), "token-budget": ("1f1b",), "fixed": ("1f1b",),
             "dynapipe": ("1f1b", "cyclic"), "ours-1f1b": ("1f1b",),
             "ours": ("1f1b", "interleaved", "zb-h1", "cyclic")}
"""Schedules each method replays per iteration; "cyclic" stands for DynaPipe's wait-free
cyclic order uncapped and, when the first stage's activations need it, capped
(`cyclic_schedules`)."""


@dataclass(frozen=True, slots=True)
class IterationResult:
    """One iteration of one method."""

    time_s: float
    real_tokens: int
    padded_tokens: int
    peak_bytes: float
    recompute: str
    schedule: str
    planning_s: float
    micro_batches: int
    fits: bool
    batching: Batching | None = None
    plan: ParallelPlan | None = None


@dataclass(slots=True)
class MethodResult:
    """A method over every iteration."""

    method: str
    iterations: list[IterationResult] = field(default_factory=list)
    error: str | None = None

    @property
    def tokens_per_s(self) -> float:
        """Real tokens per second over the iterations (padding excluded)."""
        t = sum(i.time_s for i in self.iterations)
        return sum(i.real_tokens for i in self.iterations) / t if t > 0 else 0.0

    @property
    def padding_efficiency(self) -> float:
        padded = sum(i.padded_tokens for i in self.iterations)
        return sum(i.real_tokens for i in self.iterations) / padded if padded else 0.0

    @property
    def peak_bytes(self) -> float:
        return max((i.peak_bytes for i in self.iterations), default=0.0)

    @property
    def planning_ms(self) -> float:
        """Median planning time per iteration, milliseconds."""
        return statistics.median(i.planning_s for i in self.iterations) * 1e3 \
            if self.iterations else 0.0

    def counts(self, attr: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.iterations:
            out[getattr(i, attr)] = out.get(getattr(i, attr), 0) + 1
        return out


class MicroBatchPlanner:
    """Runs the methods on one model, cluster and (dp, tp, pp)."""

    def __init__(self, model: ModelSpec, cluster: Cluster, *, dp: int, tp: int = 1, pp: int = 1,
                 max_len: int, max_target_len: int = 0, packing_attention: str = "eager",
                 memory_limit_bytes: float | None = None, zero: int | None = None,
                 framework: str | None = None) -> None:
        """`framework`: plan for that stack (give the model as it trains it,
        `apply_framework`): every plan gets its plan defaults where the planner leaves a field
        unset -- `zero` when None (its distributed optimizer), sequence parallelism, overlap --
        as an Oracle given it fills a search's candidates. `zero` None without one: 0."""
        if dp * tp * pp != cluster.num_gpus:
            raise SpecError(f"dp×tp×pp = {dp}×{tp}×{pp} = {dp * tp * pp} but the cluster has "
                            f"{cluster.num_gpus} GPUs")
        self.model, self.cluster = model, cluster
        self.dp, self.tp, self.pp = dp, tp, pp
        self.max_len, self.max_target = max_len, max_target_len
        self.packed_model = dataclasses.replace(model, attention=packing_attention)
        self._oracles = {"model": Oracle(model, cluster, framework=framework),
                         "packed": Oracle(self.packed_model, cluster, framework=framework)}
        self.plan_fields = self._oracles["model"].plan_fields(
            {"dp": dp, "tp": tp, "pp": pp, "zero": zero})
        """The fields every plan shares: the degrees, ZeRO and the stack's defaults."""
        self.zero = self.plan_fields["zero"] = self.plan_fields["zero"] or 0
        if self.zero not in (0, 1, 2):
            raise SpecError(f"zero={self.zero!r}: micro-batching runs replicas on different "
                            f"micro-batches, so ZeRO 0, 1 or 2 (stage 3 gathers in lockstep)")
        self.sp = bool(self.plan_fields.get("sp"))
        gpu = cluster.gpu(0)
        self.gpu = gpu
        self.capacity = float(gpu.memory_bytes) if memory_limit_bytes is None \
            else min(float(gpu.memory_bytes), memory_limit_bytes)
        self._costs: dict[tuple[str, str], MicroBatchCosts] = {}
        self._settings: dict[str, Any] = {}
        self.dataset: LengthDataset | None = None
        """The lengths the batches were drawn from, as the model reads them (set by the
        caller: clipped to max_len, pairs joined for a decoder-only model)."""

    def costs(self, recompute: str, packed: bool = False) -> MicroBatchCosts:
        key = (recompute, "packed" if packed else "model")
        if key not in self._costs:
            self._costs[key] = MicroBatchCosts(
                self.packed_model if packed else self.model, self.gpu, tp=self.tp, pp=self.pp,
                recompute=recompute, max_len=self.max_len, max_target_len=self.max_target,
                max_batch=256, zero=self.zero, dp=self.dp, sp=self.sp)
        return self._costs[key]

    def oracle(self, method: str) -> Oracle:
        """The Oracle `method`'s iterations are replayed on (packing: its attention kernel)."""
        return self._oracles["packed" if method == "packing" else "model"]

    def _build_s(self) -> float:
        return sum(c.build_s for c in self._costs.values())

    def activation_budget(self, recompute: str, packed: bool = False) -> float:
        """Bytes left for activations on the fullest stage after its model states."""
        return self.capacity - self.costs(recompute, packed).static_bytes

    # ------------------------------------------------------------------ batching
    def _fits(self, b: Batching, recompute: str, packed: bool) -> bool:
        """Whether every stage k of every replica fits its model states, the activations of
        the pp - k consecutive micro-batches 1F1B keeps in flight there (the heaviest such
        run of the replica's micro-batches, in order) and the largest backward transient.
        Per stage, since micro-batches of different shapes peak on different stages (a T5's
        long input on the encoder's, a long target on the decoder's)."""
        c = self.costs(recompute, packed)
        need = np.array(c.stage_static, dtype=float)
        for ms in b.replicas:
            if not ms:
                continue
            shapes = np.array([(m.batch_size, m.seq_len, m.target_len) for m in ms], float)
            kept, extra = c.stage_figures(shapes[:, 0], shapes[:, 1],
                                          shapes[:, 2] if c.encoder_decoder else None)
            for k in range(self.pp):
                held = max_window(kept[k], self.pp - k) + float(extra[k].max())
                need[k] = max(need[k], c.stage_static[k] + held)
        return bool(need.max() <= self.capacity)

    def _estimate(self, b: Batching, recompute: str, packed: bool) -> float:
        c = self.costs(recompute, packed)
        worst = 0.0
        for ms in b.replicas:
            if not ms:
                continue
            shapes = np.array([(m.batch_size, m.seq_len, m.target_len) for m in ms], float)
            t = c.time(shapes[:, 0], shapes[:, 1],
                       shapes[:, 2] if c.encoder_decoder else None)
            worst = max(worst, float(t.sum() + (self.pp - 1) * t.max()))
        return worst

    def _form(self, method: str, inputs: np.ndarray, targets: np.ndarray, recompute: str
              ) -> list[Batching]:
        """The method's micro-batchings under `recompute` (empty: a sample does not fit);
        `ours` gives its exact split and the thinned one."""
        dp = self.dp
        if method in ("dynapipe", "ours", "ours-1f1b"):
            modes = {"dynapipe": ("thinned",), "ours-1f1b": ("exact",),
                     "ours": ("exact", "thinned")}[method]
            found = dynapipe(self.costs(recompute), inputs, targets, dp=dp,
                             memory_bytes=self.activation_budget(recompute), modes=modes)
            kept = [b for b in found if b is not None]
            unique = [b for i, b in enumerate(kept)
                      if all(b.replicas != o.replicas for o in kept[:i])]
            return unique if len(kept) == len(found) else []
        setting = self._settings.get(method)

        def make(key: int) -> Batching:
            if method == "packing":
                return packing(inputs, targets, max_len=self.max_len, max_target=self.max_target,
                               micro_batch_size=key, dp=dp)
            if method == "token-budget":
                return token_budget(inputs, targets, budget=key, dp=dp)
            return fixed(inputs, targets, micro_batch_size=key, dp=dp)

        keys = [setting] if setting else (
            [self.max_len * 2**k for k in range(7)] if method == "token-budget"
            else [2**k for k in range(8)])
        packed = method == "packing"
        best: tuple[float, Batching, Any] | None = None
        for key in keys:
            b = make(key)
            if not self._fits(b, recompute, packed):
                continue
            est = self._estimate(b, recompute, packed)
            if best is None or est < best[0]:
                best = (est, b, key)
        if best is None:
            return []
        self._settings.setdefault(method, best[2])
        return [best[1]]

    # ------------------------------------------------------------------ one iteration
    def iteration(self, method: str, batch: Sequence[Sample]) -> IterationResult:
        """Form, check and replay one global batch with `method`."""
        inputs = np.array([s.input_len for s in batch], dtype=float)
        targets = np.array([s.target_len for s in batch], dtype=float)
        if len(batch) < self.dp:
            raise SpecError(f"a batch holds {len(batch)} samples but dp={self.dp} replicas each "
                            f"need one; raise --tokens-per-batch or lower --dp")
        if len(batch) > MAX_SAMPLES and method in ("dynapipe", "ours", "ours-1f1b"):
            raise SpecError(f"a batch holds {len(batch)} samples; the dynamic programs take at "
                            f"most {MAX_SAMPLES} per batch (their tables grow with the square); "
                            f"lower --tokens-per-batch")
        if self.activation_budget("full") <= 0:
            raise SpecError(f"the model states alone take "
                            f"{self.costs('full').static_bytes / 2**30:.1f} GiB of the "
                            f"{self.capacity / 2**30:.1f} GiB per GPU (dp={self.dp} tp={self.tp} "
                            f"pp={self.pp}); use more tensor or pipeline stages")
        options, rc, planning = self.form(method, inputs, targets)
        if not options:
            raise SpecError(f"{method}: a single sample of this batch does not fit in "
                            f"{self.capacity / 2**30:.1f} GiB per GPU even with full recompute "
                            f"(dp={self.dp} tp={self.tp} pp={self.pp}); use more stages or a "
                            f"shorter --max-len")
        oracle = self.oracle(method)
        best: tuple[Summary, str, ParallelPlan, Batching] | None = None
        for option in options:
            for sched in self.cyclic_schedules(SCHEDULES[method], option, rc):
                plan = self._plan(option, rc, sched)
                if plan is None:
                    continue
                s = oracle.evaluate(plan)
                if best is None or self._rank(s) < self._rank(best[0]):
                    best = (s, sched, plan, option)
        assert best is not None  # 1F1B always builds
        s, sched, plan, formed = best
        return IterationResult(
            time_s=s.iteration_time_s, real_tokens=formed.real_tokens,
            padded_tokens=formed.padded_tokens, peak_bytes=s.peak_memory_bytes, recompute=rc,
            schedule=sched, planning_s=planning,
            micro_batches=sum(len(r) for r in formed.replicas),
            fits=not s.oom and s.peak_memory_bytes <= self.capacity, batching=formed, plan=plan)

    def form(self, method: str, inputs: np.ndarray, targets: np.ndarray
             ) -> tuple[list[Batching], str, float]:
        """(the micro-batchings to replay, the recompute policy, planning seconds): the first
        policy under which the method places every sample; `ours` adds the thinned split next
        to its exact one (both timed). The one-off cost-grid build is not counted."""
        t0, built = time.perf_counter(), self._build_s()
        options: list[Batching] = []
        rc = "none"
        for rc in RECOMPUTE:
            options = self._form(method, inputs, targets, rc)
            if options:
                break
        return options, rc, time.perf_counter() - t0 - (self._build_s() - built)

    def cyclic_schedules(self, names: Sequence[str], b: Batching, recompute: str
                         ) -> list[str]:
        """`names` with "cyclic" expanded as DynaPipe tries it: first without a memory limit,
        then -- when some stage's activations could pass its budget -- capped at the most
        micro-batches in flight that fit every stage (`cyclic_cap` per stage k, where up to
        2(pp - k) - 1 are in flight uncapped: any run of consecutive micro-batches of that
        length fits, and the cyclic order keeps them in order). Per stage, since a T5's
        decoder stages can need more than the first."""
        out = [n for n in names if n != "cyclic"]
        if "cyclic" not in names or self.pp < 2:
            return out
        c = self.costs(recompute, packed=False)
        kept: list[list[np.ndarray]] = [[] for _ in range(self.pp)]
        extra = np.zeros(self.pp)
        for ms in b.replicas:
            shapes = np.array([(m.batch_size, m.seq_len, m.target_len) for m in ms], float)
            t = shapes[:, 2] if c.encoder_decoder else None
            stage_kept, stage_extra = c.stage_figures(shapes[:, 0], shapes[:, 1], t)
            for k in range(self.pp):
                kept[k].append(stage_kept[k])
            extra = np.maximum(extra, stage_extra.max(axis=1))
        # each stage's own model states and backward transient bound its window
        caps = [cyclic_cap(kept[k], self.capacity - float(c.stage_static[k]) - extra[k],
                           self.pp - k) for k in range(self.pp)]
        found = [k for k in caps if k is not None]
        cap = min(found) if found else None
        return [*out, "cyclic", *([f"cyclic-{cap}"] if cap is not None else [])]

    def _rank(self, s: Summary) -> tuple[bool, float]:
        """Order replays: the ones that fit memory first, then the fastest."""
        return (s.oom or s.peak_memory_bytes > self.capacity, s.iteration_time_s)

    def _plan(self, b: Batching, recompute: str, schedule: str) -> ParallelPlan | None:
        fields: dict[str, Any] = {
            **self.plan_fields, "recompute": recompute,
            "replica_micro_batches": [list(ms) for ms in b.replicas], "schedule": schedule}
        if schedule == "interleaved":
            if self.pp < 2 or any(len(ms) % self.pp for ms in b.replicas):
                return None
            fields["virtual_stages"] = 2
        if schedule == "zb-h1" and self.pp < 2:
            return None
        try:  # both model variants have the same shapes: either checks the plan
            return ParallelPlan.build(self.model, self.cluster, **fields)
        except PlanError:
            return None

    def run(self, method: str, batches: Sequence[Sequence[Sample]],
            on_iteration: Callable[[str, int], None] | None = None) -> MethodResult:
        """Every batch with `method`; a method that cannot place a sample records the error."""
        if method not in METHODS:
            raise SpecError(f"unknown micro-batching method {method!r}; one of "
                            f"{', '.join(METHODS)}")
        out = MethodResult(method=method)
        for k, batch in enumerate(batches):
            try:
                out.iterations.append(self.iteration(method, batch))
            except SpecError as exc:
                out.error = str(exc)
                break
            if on_iteration is not None:
                on_iteration(method, k)
        return out


__all__ = ["METHODS", "IterationResult", "MethodResult", "MicroBatchPlanner"]
