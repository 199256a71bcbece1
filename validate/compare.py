"""Predicted vs measured: simulate a trace's plan with the profiled cost model and diff.

`compare(trace, db)` builds the local "cpu" cluster from the profile (validate/cpu_hardware.py),
lowers the trace's model and plan (1F1B, fp32) with `ProfiledCostModel`, runs the engine, and
sets the prediction beside the measurement:

* iteration time — measured: median over iterations of the slowest rank's wall time;
* per-stage busy time — measured: a stage's first rank's median time inside forward/backward
  passes (tensor-parallel all-reduces included, waits for pipeline receives excluded) plus the
  optimizer step; predicted: the stage's compute- and tp-stream task time;
* per-op-kind time — measured: each stage's first rank's seconds per kind, the median of the
  trace's clocked iterations (validate/op_clock.py; traces before 2026-11-27 afternoon: the
  profiled iteration's op spans); predicted: the cost model over the stage's sharded ops ×
  micro-batches (forward + backward), with the optimizer step; ``comm`` — measured: the rank's
  time in torch.distributed calls outside any op (gloo/c10d, waits for the peer included) and
  the tensor-parallel autograd nodes (``tp_comm``, folded in); predicted: the same thing on the
  simulated timeline — the time the stage's first rank does not compute between the iteration's
  start and its last task (`idle_s`: the communication tasks on its critical path and its waits
  for other ranks: pipeline bubbles, a peer's late gradient). ``optimizer`` — measured: the
  step's median over the timed iterations (``optimizer_s``); the profiled iteration's span
  carries the profiler's cost of every one of the ~10 eager ops per parameter tensor (e.g. 9.3
  ms against 5.7 ms in the DP2 trace, 5.2 against 2.2 ms in T5). A kind the simulator does not
  model (``other``: framework time outside any op) has no prediction: predicted and error are
  None ("n/a"), never a fake −100 %;
* peak memory — measured: see trace_record.py; predicted: the engine's peak per rank.

Op times are scaled by the machine's speed at the trace relative to the profile: the trace's
reference-GEMM time (its metadata) over the profile's (`profile_reference_s`: its own row of
that GEMM, else its metadata's; validate/profiler.py; 1 when either lacks it). On a CPU trace
the Adam step is not read from the profile (timed there back to back, its state in cache) but
priced by the cold-cache CPU Adam model of validate/cpu_microbench.py (bench/cpu_ops.py: a time
per parameter tensor plus one per parameter), scaled by the trace's reference GEMM over the
benchmark's.

The op times are also brought to the model run whole. With a profile that timed the ops
inside the whole model (``fwd_in_model`` / ``bwd_in_model`` rows), each kind's forwards and
backwards are scaled by their time there over their back-to-back time, and then every op by
what the whole micro-batch leaves (the glue between ops: `in_model_scales`); the per-kind
predictions leave that last factor out, as no kind's clock in a trace holds the glue. Older
profiles give one factor for every op (`in_model_factor`): the whole micro-batch over the sum
of its ops timed one by one; the per-kind predictions carry it.

With a profile that has solo timings (``solo_s``) and more than one process, the prediction
is the shared-CPU blend of validate/contention.py: each compute task between its solo and
all-at-once time by how much of it overlaps other processes' compute; the per-kind predictions
of a stage are blended with that stage's mean overlap.

Errors are signed and relative: (predicted − measured) / measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from trainsim.errors import PlanError, TraceError, UnknownNameError
from trainsim.simulator.engines import run_program
from trainsim.validate.contention import COMPUTE_STREAMS, blend
from trainsim.validate.cpu_hardware import cpu_cluster
from trainsim.validate.cpu_microbench import adam_cpu_cost, copy_s, param_tensors
from trainsim.validate.profile_db import ProfileDB
from trainsim.validate.profiled_cost import ProfiledCostModel
from trainsim.validate.small_models import get_validation_model
from trainsim.validate.torch_parallel import GRAD_COPY_TRAFFIC
from trainsim.validate.trace_import import KIND_ALIASES
from trainsim.validate.trace_record import MeasuredTrace
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.model import build_graph
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.stage_costs import ADAM_STEP_BYTES_PER_PARAM, ADAM_STEP_FLOPS_PER_PARAM

#: Measured kinds folded into another before comparing: the tensor-parallel autograd nodes
#: run all-reduces, which the simulator predicts with the other communication.
MEASURED_KIND_ALIASES: dict[str, str] = {"tp_comm": "comm"}


def rel_error(predicted: float | None, measured: float) -> float | None:
    """(predicted − measured) / measured, or None when nothing was measured or predicted."""
    if predicted is None:
        return None
    return (predicted - measured) / measured if measured > 0 else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    """The result of `compare` (flat records; `to_dict` is what ``--json`` prints)."""

    model: str
    plan: dict[str, int] = field(hash=False)
    iteration_time_measured_s: float
    iteration_time_predicted_s: float
    iteration_time_spread_s: float
    """Interquartile range of the measured iteration times (the run's noise)."""
    stages: tuple[dict[str, Any], ...]
    """Per stage: stage, busy_measured_s, busy_predicted_s, busy_error."""
    kinds: tuple[dict[str, Any], ...]
    """Per op kind: kind, measured_s, predicted_s, error (predicted_s and error None for a
    kind the simulator does not predict)."""
    peak_memory_measured_bytes: float
    peak_memory_predicted_bytes: float
    cost_sources: dict[str, int] = field(hash=False)
    """How the cost model answered (exact / interpolated / roofline)."""
    speed_factor: float = 1.0
    """Trace's reference-GEMM time / profile's: the factor applied to the profiled op times."""
    in_model: tuple[float, float] = (1.0, 1.0)
    """The factor on every op time (all processes at once, solo), with `speed_factor`: with
    in-model rows, `in_model_scales`' glue factor (on top of `fwd_scale` / `bwd_scale`); without,
    `in_model_factor` (the model's ops run whole over one by one)."""
    fwd_scale: dict[str, float] = field(default_factory=dict, hash=False)
    """`in_model_scales`: per op kind, the factor on its profiled forwards (empty: none)."""
    bwd_scale: dict[str, float] = field(default_factory=dict, hash=False)
    """`in_model_scales`: per op kind, the factor on its profiled backwards (empty: none)."""
    overlap: tuple[float, ...] | None = None
    """Per stage, the shared-CPU blend's mean overlap (None: profile without solo timings)."""
    warnings: tuple[str, ...] = ()
    """What makes the comparison less trustworthy (`binding_warning`); printed last."""
    result: Any = field(default=None, repr=False, compare=False)
    """The SimResult (for the overlay plot)."""

    @property
    def iteration_time_error(self) -> float:
        """Signed relative iteration-time error."""
        return (self.iteration_time_predicted_s - self.iteration_time_measured_s) \
            / self.iteration_time_measured_s

    @property
    def peak_memory_error(self) -> float | None:
        """Signed relative peak-memory error (None without a measured peak)."""
        return rel_error(self.peak_memory_predicted_bytes, self.peak_memory_measured_bytes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary."""
        return {"model": self.model, "plan": self.plan,
                "iteration_time_measured_s": self.iteration_time_measured_s,
                "iteration_time_predicted_s": self.iteration_time_predicted_s,
                "iteration_time_error": self.iteration_time_error,
                "iteration_time_spread_s": self.iteration_time_spread_s,
                "peak_memory_measured_bytes": self.peak_memory_measured_bytes,
                "peak_memory_predicted_bytes": self.peak_memory_predicted_bytes,
                "peak_memory_error": self.peak_memory_error,
                "stages": list(self.stages), "op_kinds": list(self.kinds),
                "cost_sources": dict(self.cost_sources), "speed_factor": self.speed_factor,
                "in_model_factor": list(self.in_model), "fwd_scale": dict(self.fwd_scale),
                "bwd_scale": dict(self.bwd_scale),
                "overlap": None if self.overlap is None else list(self.overlap),
                **({"warnings": list(self.warnings)} if self.warnings else {})}


def _stage_layers(graph: Any, pp: int, counts: list[int]) -> list[list[Any]]:
    """Layers of each stage as the lowering partitions them (non-blocks join a neighbour)."""
    out: list[list[Any]] = [[] for _ in range(pp)]
    stage, seen = 0, 0
    for layer in graph.layers:
        if layer.recomputable:
            while seen >= counts[stage]:
                stage, seen = stage + 1, 0
            seen += 1
        out[stage].append(layer)
    return out


def predicted_kind_s(cost: Any, layers: list[Any], tp: int, m: int, params: float, *,
                     fold: bool = True) -> dict[str, float]:
    """Cost-model seconds per op kind of one stage's iteration (module docstring; `fold`:
    the attention core's two kinds as one, as traces report them)."""

    out: dict[str, float] = {}
    for layer in layers:
        for op in layer.sharded_ops(tp):
            t = cost.time_s(op.kind, op.fwd_flops, op.fwd_bytes, op.shape)
            if op.kind == "matmul":
                t += 2 * cost.time_s(op.kind, op.bwd_flops / 2, op.bwd_bytes / 2, op.shape)
            else:
                t += cost.time_s(op.kind, op.bwd_flops, op.bwd_bytes, op.shape)
            kind = KIND_ALIASES.get(op.kind, op.kind) if fold else op.kind
            out[kind] = out.get(kind, 0.0) + m * t
    out["optimizer"] = cost.time_s("elementwise", ADAM_STEP_FLOPS_PER_PARAM * params,
                                   ADAM_STEP_BYTES_PER_PARAM * params, None)
    return out


def adam_step(trace: MeasuredTrace, layers: list[list[Any]], tp: int
              ) -> Callable[[float], float] | None:
    """Parameters → seconds of the CPU Adam step (validate/cpu_microbench.py), at the trace's
    machine speed (its reference GEMM over the benchmark's), with the parameter tensors of the
    stage whose parameter count is nearest; None unless the trace says it ran on the CPU (a
    CUDA run, an imported Kineto trace of unknown origin: the profile's rows answer)."""
    if trace.machine.get("device") != "cpu":
        return None
    model = adam_cpu_cost()
    speed = _bench_speed(trace, model.reference_gemm_s)
    stages = [(sum(op.params for layer in ls for op in layer.sharded_ops(tp)),
               param_tensors(ls, tp)) for ls in layers]

    def step_s(params: float) -> float:
        tensors = min(stages, key=lambda st: abs(st[0] - params))[1] if stages else 1
        return model.step_s(params, tensors, speed)

    return step_s


def _bench_speed(trace: MeasuredTrace, bench_reference_s: float) -> float:
    """The trace's machine speed over the microbenchmarks' (validate/data/cpu_ops.json): its
    reference GEMM's seconds over theirs; 1 where either is missing."""
    ref = trace.machine.get("reference_gemm_s")
    if isinstance(ref, bool) or not isinstance(ref, (int, float)) or ref <= 0 \
            or bench_reference_s <= 0:
        return 1.0
    return float(ref) / bench_reference_s


def grad_copy(trace: MeasuredTrace) -> tuple[float, Callable[[float], float] | None]:
    """(`ModelSpec.grad_copy_traffic`, bytes → seconds) of the gradient copies around the
    trace's data-parallel all-reduce: the harness's (validate/torch_parallel.py
    `GRAD_COPY_TRAFFIC`) for a trace `sim trace` recorded, priced on the CPU by the measured
    copy bandwidth at the trace's machine speed (a GPU's by the profile's fallback, None);
    (0, None) for a trace recorded elsewhere (an imported Kineto trace: its stack's copies are
    unknown)."""
    if not str(trace.machine.get("command", "")).startswith("sim trace"):
        return 0.0, None
    if trace.machine.get("device") != "cpu":
        return GRAD_COPY_TRAFFIC, None
    speed = _bench_speed(trace, adam_cpu_cost().reference_gemm_s)
    return GRAD_COPY_TRAFFIC, lambda moved: copy_s(moved, speed)


def binding_warning(trace: MeasuredTrace, db: ProfileDB) -> str | None:
    """A line when the trace's CPU workers ran bound to CPUs and the profile's did not, or the
    other way round (validate/devices.py `worker_cores`): the profile then describes other
    conditions than the trace ran under. Files without ``cpu_binding`` predate it and ran
    unbound, as does a file that says "none ..." (`devices.cpu_binding(None)`); which CPUs a
    bound run used does not matter (one core per worker either way). None when both ran alike
    or the trace is not a CPU run."""
    if trace.machine.get("device") != "cpu":
        return None
    ours, theirs = trace.machine.get("cpu_binding"), db.meta.get("cpu_binding")
    if _bound(ours) == _bound(theirs):
        return None
    unbound = "not recorded (unbound)"
    return (f"CPU binding differs: trace {ours or unbound}, profile {theirs or unbound}; "
            f"runs differ with it (TP2: 136-140 ms unbound, 110-122 bound; validate/devices.py)")


def _bound(recorded: object) -> bool:
    """Whether a ``cpu_binding`` field says the workers were bound (absent or "none ...":
    unbound)."""
    return bool(recorded) and not str(recorded).startswith("none")


def idle_s(tasks: Any, rank: int) -> float:
    """Seconds of [0, end] in which `rank` runs no compute-stream task, end being the end of
    its last task of any stream: what the rank spends communicating or waiting (module
    docstring, ``comm``)."""
    mine = tasks[tasks["rank"] == rank]
    if mine.empty:
        return 0.0
    end = float(mine["end_s"].max())
    busy = mine[mine["stream"].isin(COMPUTE_STREAMS)]
    covered, reach = 0.0, 0.0
    for a, b in sorted(zip(busy["start_s"].tolist(), busy["end_s"].tolist())):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return max(end - covered, 0.0)


def profile_reference_s(db: ProfileDB) -> float | None:
    """The profile's seconds of its reference GEMM: its own forward row of that shape, timed
    like and among the op rows it stands for; else the ``reference_gemm_s`` timed at the
    profile's ends.

    The ends can see another machine speed than the rows between them: older profiles timed
    the ends' reference cold (validate/profiler.py, reference GEMM), and a warmed-up profile of
    2026-11-27 read 2.23 ms at its ends against 1.52 ms in its row, in a recording whose traces
    it then predicted 31-42 % low (x 0.62-0.74) where the row gives their speed."""
    shape = db.meta.get("reference_gemm")
    if isinstance(shape, (list, tuple)):
        rows = [r.time_s for r in db.ops("matmul", "fwd")
                if tuple(r.shape) == tuple(shape) and r.time_s > 0]
        if rows:
            return float(statistics.median(rows))
    profiled = db.meta.get("reference_gemm_s")
    if isinstance(profiled, bool) or not isinstance(profiled, (int, float)) or profiled <= 0:
        return None
    return float(profiled)


def in_model_scales(db: ProfileDB, spec: Any, micro_batch: int
                    ) -> tuple[dict[str, float], dict[str, float], tuple[float, float]] | None:
    """(per op kind the factor on its forwards, per kind the factor on its backwards, the
    factor on every op all processes at once and solo) that bring the model's ops, timed back
    to back, to the model run whole; None where the profile lacks `spec`'s in-model rows at
    this micro-batch size (then `in_model_factor`).

    A kind's factors are its forwards and backwards timed inside the whole model (clocks,
    validate/profiler.py, ops inside the model) over the same ops timed back to back: small
    memory-bound ops lose far more to caches inside a model than GEMMs do, which one factor on
    every op cannot say. What the whole micro-batch (its ``model:`` row, timed all at once and
    alone; a row without a solo time gives the all-at-once figure for both) takes beyond the
    kinds so scaled (glue: views, copies, the autograd walk) is spread over every op by the
    last factor. All are measured on the whole unsplit model and applied to every stage of
    every plan, so the traces check them out of sample."""
    row = db.whole_model(spec.name)
    fwd_in = db.in_model(spec.name, "fwd_in_model", micro_batch)
    bwd_in = db.in_model(spec.name, "bwd_in_model", micro_batch)
    if row is None or row.shape != (micro_batch,) or not fwd_in or not bwd_in:
        return None
    layers = list(build_graph(spec, micro_batch).layers)

    def sums(cost: ProfiledCostModel, fold: bool) -> dict[str, float]:
        out = predicted_kind_s(cost, layers, 1, 1, 0.0, fold=fold)
        out.pop("optimizer", None)
        return out

    # the back-to-back forwards and backwards, each from its own rows (the cost model's
    # `forward_s`: never a backward mistaken for a forward)
    plain = ProfiledCostModel(db)
    fwd_hot: dict[str, float] = {}
    fwd_folded: dict[str, float] = {}
    for layer in layers:
        for op in layer.sharded_ops(1):
            t = plain.forward_s(op.kind, op.fwd_flops, op.fwd_bytes, op.shape)
            fwd_hot[op.kind] = fwd_hot.get(op.kind, 0.0) + t
            folded = KIND_ALIASES.get(op.kind, op.kind)
            fwd_folded[folded] = fwd_folded.get(folded, 0.0) + t
    bwd_hot = {k: v - fwd_folded.get(k, 0.0) for k, v in sums(plain, True).items()}
    fwd_scale = {k: fwd_in[k] / v for k, v in fwd_hot.items() if v > 0 and fwd_in.get(k, 0) > 0}
    bwd_scale = {k: bwd_in[k] / v for k, v in bwd_hot.items() if v > 0 and bwd_in.get(k, 0) > 0}
    glue = []
    for solo in (False, row.solo_s > 0):
        scaled = sum(sums(ProfiledCostModel(db, solo=solo, fwd_scale=fwd_scale,
                                            bwd_scale=bwd_scale), False).values())
        if scaled <= 0:
            return None
        glue.append((row.solo_s if solo else row.time_s) / scaled)
    return fwd_scale, bwd_scale, (glue[0], glue[1])


def in_model_factor(db: ProfileDB, spec: Any, micro_batch: int, *, solo: bool) -> float:
    """The profile's whole-model micro-batch of `spec` (its ``model:`` row, timed all processes
    at once or, `solo`, alone) over the sum of the model's ops as the profile times them one by
    one; 1 where the profile has no such row at this micro-batch size.

    Why: run whole, a model takes longer than its ops timed one by one — the glue between them
    (head split/merge views and copies, the autograd engine's walk) and caches its other layers
    evicted (validate/profiler.py, whole models: ×1.35–1.43 for tiny-t5, ×1.07–1.13 for
    tiny-gpt on the CI machine kind). The factor is measured on the whole unsplit model and
    applied to every stage of every plan, so the traces' pipeline and tensor-parallel stages
    check it out of sample."""
    row = db.whole_model(spec.name)
    if row is None or row.shape != (micro_batch,):
        return 1.0
    solo = solo and row.solo_s > 0  # no solo timing: the all-at-once ratio, both sides
    measured = row.solo_s if solo else row.time_s
    layers = list(build_graph(spec, micro_batch).layers)
    ops = predicted_kind_s(ProfiledCostModel(db, solo=solo), layers, 1, 1, 0.0)
    ops.pop("optimizer", None)
    total = sum(ops.values())
    return measured / total if total > 0 and measured > 0 else 1.0


def speed_factor(trace: MeasuredTrace, db: ProfileDB) -> float:
    """Trace's reference-GEMM seconds over the profile's (`profile_reference_s`; 1 when either
    lacks the figure or they timed different GEMMs).

    Raises:
        TraceError: the trace's ``machine.reference_gemm_s`` is not a positive number.
    """
    import math

    measured = trace.machine.get("reference_gemm_s")
    if measured is None or db.meta.get("reference_gemm_s") is None:
        return 1.0
    if isinstance(measured, bool) or not isinstance(measured, (int, float)) \
            or not math.isfinite(measured) or measured <= 0:
        raise TraceError(f"trace: machine.reference_gemm_s={measured!r} must be a number > 0")
    if tuple(trace.machine.get("reference_gemm") or ()) \
            != tuple(db.meta.get("reference_gemm") or ()):
        return 1.0
    profiled = profile_reference_s(db)
    return 1.0 if profiled is None else float(measured) / profiled


def compare(trace: MeasuredTrace, db: ProfileDB, *, engine: str = "numba") -> Comparison:
    """Simulate `trace`'s plan on the profile's cpu cluster and compare (module docstring).

    Raises:
        TraceError: the trace's model is unknown or its plan does not fit the model.
    """

    try:
        spec = get_validation_model(trace.model)
    except UnknownNameError as exc:
        raise TraceError(f"trace model: {exc}") from None
    traffic, copy = grad_copy(trace)
    spec = replace(spec, grad_copy_traffic=traffic)
    p = trace.plan
    world = p["dp"] * p["tp"] * p["pp"]
    cluster = cpu_cluster(db, world)
    try:
        plan = ParallelPlan.build(spec, cluster, dp=p["dp"], tp=p["tp"], pp=p["pp"],
                                  micro_batch_size=p["micro_batch_size"],
                                  num_micro_batches=p["num_micro_batches"], schedule="1f1b",
                                  dtype="fp32")
    except PlanError as exc:
        raise TraceError(f"trace plan: {exc}") from None
    factor = speed_factor(trace, db)
    graph = build_graph(spec, p["micro_batch_size"])
    counts = list(plan.layers_per_stage(len(graph.transformer_layers())))
    layers = _stage_layers(graph, p["pp"], counts)
    adam = adam_step(trace, layers, p["tp"])
    mb = p["micro_batch_size"]
    inside = in_model_scales(db, spec, mb)
    fwd_scale: dict[str, float] = {}
    bwd_scale: dict[str, float] = {}
    if inside is None:
        in_model = (in_model_factor(db, spec, mb, solo=False),
                    in_model_factor(db, spec, mb, solo=True))
        glue = (1.0, 1.0)  # one factor on every op: the kinds carry it
    else:  # the last factor is the glue between ops, which no kind's clock in a trace holds
        fwd_scale, bwd_scale, in_model = inside
        glue = in_model
    cost = ProfiledCostModel(db, scale=factor, op_scale=in_model[0], fwd_scale=fwd_scale,
                             bwd_scale=bwd_scale, optimizer=adam, copy=copy)
    program = lower(spec, cluster, plan, LoweringOptions(cost_model=cost))
    solo_cost = None
    overlap: tuple[float, ...] | None = None
    if db.has_solo() and world > 1:
        solo_cost = ProfiledCostModel(db, solo=True, scale=factor, op_scale=in_model[1],
                                      fwd_scale=fwd_scale, bwd_scale=bwd_scale,
                                      optimizer=adam, copy=copy)
        solo_program = lower(spec, cluster, plan, LoweringOptions(cost_model=solo_cost))
        mixed = blend(program, solo_program, engine=engine)
        result, overlap = mixed.result, mixed.overlap
    else:
        result = run_program(program, engine=engine)
    tasks = result.tasks
    stages: list[Any] = []
    kinds_pred: dict[str, float] = {}
    kinds_meas: dict[str, float] = {}
    for s in range(p["pp"]):
        first = [r for r in trace.ranks if r.get("stage") == s]
        first.sort(key=lambda r: (r.get("replica", 0), r.get("tp_index", 0)))
        rows = tasks[(tasks["rank"] == s) & tasks["stream"].isin(["compute", "tp"])]
        busy_pred = float(rows["duration_s"].sum())
        busy_meas = float(first[0].get("compute_s", 0.0)) if first else 0.0
        stages.append({"stage": s, "busy_measured_s": busy_meas, "busy_predicted_s": busy_pred,
                       "busy_error": rel_error(busy_pred, busy_meas)})
        params = float(program.static_memory_bytes[s]) / 16.0  # fp32 Adam: 4+4+8 B/param
        pair = predicted_kind_s(cost, layers[s], p["tp"], p["num_micro_batches"], params)
        alone = pair if solo_cost is None or overlap is None else predicted_kind_s(
            solo_cost, layers[s], p["tp"], p["num_micro_batches"], params)
        phi = 1.0 if overlap is None else overlap[s]
        for k, v in pair.items():  # the kinds without the glue (the iteration with it)
            a = alone[k] / (1.0 if k == "optimizer" else glue[1])
            v = v / (1.0 if k == "optimizer" else glue[0])
            kinds_pred[k] = kinds_pred.get(k, 0.0) + a + phi * (v - a)
        kinds_pred["comm"] = kinds_pred.get("comm", 0.0) + idle_s(tasks, s)
        measured: dict[str, float] = {str(k): float(v) for k, v in
                                      (first[0].get("kind_s", {}) if first else {}).items()}
        if first and float(first[0].get("optimizer_s", 0.0)) > 0:
            measured["optimizer"] = float(first[0]["optimizer_s"])
        for name, v in measured.items():
            kind = MEASURED_KIND_ALIASES.get(name, name)
            kinds_meas[kind] = kinds_meas.get(kind, 0.0) + v
    kinds = [{"kind": k, "measured_s": kinds_meas.get(k, 0.0),
              "predicted_s": kinds_pred.get(k),
              "error": rel_error(kinds_pred.get(k), kinds_meas.get(k, 0.0))}
             for k in sorted(set(kinds_pred) | set(kinds_meas))]
    times = sorted(trace.iteration_times_s)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return Comparison(
        model=spec.name, plan=dict(p), iteration_time_measured_s=trace.iteration_time_s,
        iteration_time_predicted_s=float(result.iteration_time_s),
        iteration_time_spread_s=q[2] - q[0], stages=tuple(stages), kinds=tuple(kinds),
        peak_memory_measured_bytes=trace.peak_memory_bytes,
        peak_memory_predicted_bytes=float(result.peak_memory_bytes),
        cost_sources=dict(cost.sources), speed_factor=factor,
        in_model=in_model, fwd_scale=fwd_scale, bwd_scale=bwd_scale,
        overlap=overlap, result=result,
        warnings=tuple(w for w in (binding_warning(trace, db),) if w))


def format_report(c: Comparison) -> str:
    """The table `sim validate` prints."""
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:+.1f}%"

    p = c.plan
    head = (f"{c.model}  dp={p['dp']} tp={p['tp']} pp={p['pp']}  micro-batch "
            f"{p['micro_batch_size']} x {p['num_micro_batches']}")
    iteration = (f"{'iteration time (ms)':24}{1e3 * c.iteration_time_measured_s:12.2f}"
                 f"{1e3 * c.iteration_time_predicted_s:12.2f}{pct(c.iteration_time_error):>9}"
                 f"   (measured IQR {1e3 * c.iteration_time_spread_s:.2f} ms)")
    lines = [head, f"{'':24}{'measured':>12}{'predicted':>12}{'error':>9}", iteration]
    for s in c.stages:
        lines.append(f"{'stage ' + str(s['stage']) + ' busy (ms)':24}"
                     f"{1e3 * s['busy_measured_s']:12.2f}{1e3 * s['busy_predicted_s']:12.2f}"
                     f"{pct(s['busy_error']):>9}")
    lines.append(f"{'peak memory (MiB)':24}{c.peak_memory_measured_bytes / 2**20:12.2f}"
                 f"{c.peak_memory_predicted_bytes / 2**20:12.2f}{pct(c.peak_memory_error):>9}")
    lines.append("per op kind (ms, first rank of each stage, summed over stages):")
    for k in c.kinds:
        pred = "n/a" if k["predicted_s"] is None else f"{1e3 * k['predicted_s']:.2f}"
        lines.append(f"  {k['kind']:22}{1e3 * k['measured_s']:12.2f}{pred:>12}"
                     f"{pct(k['error']):>9}")
    src = ", ".join(f"{k} {v}" for k, v in sorted(c.cost_sources.items()))
    lines.append(f"cost model estimates: {src}")
    if c.speed_factor != 1.0:
        lines.append(f"machine speed: profiled op times x {c.speed_factor:.3f} (reference GEMM, "
                     f"trace vs profile)")
    if c.fwd_scale:
        for name, scales in (("forwards", c.fwd_scale), ("backwards", c.bwd_scale)):
            lines.append(f"inside the model (profile), {name} x " + ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(scales.items())))
    if c.in_model != (1.0, 1.0) and c.fwd_scale:
        lines.append(f"glue between ops: profiled op times x {c.in_model[0]:.3f} (solo x "
                     f"{c.in_model[1]:.3f}): the whole model's micro-batch over its ops so "
                     f"scaled (profile; iteration only, not the kinds)")
    elif c.in_model != (1.0, 1.0):
        lines.append(f"in-model factor: profiled op times x {c.in_model[0]:.3f} (solo x "
                     f"{c.in_model[1]:.3f}): the whole model's micro-batch over its ops one by "
                     f"one (profile)")
    if c.overlap is not None:
        lines.append("shared-CPU blend: compute alongside another process "
                     + ", ".join(f"stage {s} {100 * f:.0f}%" for s, f in enumerate(c.overlap)))
    lines.extend(f"warning: {w}" for w in c.warnings)
    return "\n".join(lines)
