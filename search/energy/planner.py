"""The energy planner: GPU frequency plans on the iteration time–energy frontier (Perseus).

The entry of search/energy/. Inputs are a Perseus profile CSV (`stage,instruction,frequency,
time,energy`) or a model + cluster + plan costed by trainsim's DVFS model (resolved objects:
names and files are resolved above, by `trainsim.api`). The steps:

* `load_dag`: the 1F1B instruction DAG with per-frequency options (profile.py, dag.py);
* `run_frontier`: the frontier (frontier.py), the baselines (baselines.py) and Perseus's
  intrinsic saving, the fastest frontier plan vs all-max over the same time (straggler.py);
* `straggler_pick`: the plan for a straggler's iteration time, and the savings vs all-max for
  slowdowns 1.0–1.5 (straggler.py);
* `lowered_plans`: in model mode, the all-max and no-slowdown plans as `lower()` runs them
  (transfers and optimizer step included, lowered.py), predicted and simulated;
* `summary`, `pick_summary` and the `*_json` helpers: the JSON a runtime or a report reads;
  `write_outputs`: plans.json, frontier.html (plot.py) and, in model mode, the lowered plans
  as ParallelPlan JSON files (`plan_all_max.json`, `plan_no_slowdown.json`) that `sim simulate
  --plan` runs.

Progress is reported through an optional `on_step(steps_done, steps_total)` callback; drawing
it (and the command line) is the command module's business (search/energy_commands.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.errors import SpecError
from trainsim.hwmodels.cluster import Cluster
from trainsim.hwmodels.gpus import get_gpu
from trainsim.search.energy.baselines import Baseline, all_baselines
from trainsim.search.energy.dag import InstructionDag, build_dag
from trainsim.search.energy.frontier import (
    Frontier,
    FrontierStep,
    compute_frontier,
    frontier_steps,
)
from trainsim.search.energy.lowered import (
    LoweredExtras,
    all_max_freq,
    frequency_plan,
    no_slowdown,
    replay_lowered,
)
from trainsim.search.energy.outputs import OUTPUT_FILES, PLAN_FILES
from trainsim.search.energy.plot import frontier_figure, write_html
from trainsim.search.energy.point import DEFAULT_UNIT_S, FrontierPoint
from trainsim.search.energy.profile import (
    EnergyProfile,
    blocking_power_of,
    load_perseus_csv,
    profile_from_model,
)
from trainsim.search.energy.straggler import (
    IntrinsicSaving,
    StragglerPick,
    intrinsic_saving,
    pick,
    savings_table,
)
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan

#: Fastest frontier plans tried (as is and tightened) for the lowered no-slowdown plan.
LOWERED_CANDIDATES: int = 8



# ---------------------------------------------------------------------------------- inputs
def check_inputs(*, profile: Path | None, microbatches: int | None, model_given: bool,
                 cluster_given: bool) -> int:
    """The micro-batch count, once the input mode is unambiguous: exactly one of a profile CSV
    and a model, a micro-batch count, and a cluster with a model. Checked before any model or
    cluster is resolved, so a mix of modes is reported as such.

    Raises:
        SpecError: one line naming the flags to give.
    """
    if (profile is None) == (not model_given):
        raise SpecError("give either --profile CSV (with --microbatches) or --model with "
                        "--cluster and plan flags")
    if microbatches is None:
        raise SpecError("--microbatches is required")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise SpecError(f"--microbatches {microbatches!r} must be an integer >= 1")
    if profile is None and not cluster_given:
        raise SpecError("--model needs --cluster")
    return microbatches


def load_dag(microbatches: int | None, *, profile: Path | None = None, gpu: str | None = None,
             blocking_power_w: float | None = None, model: ModelSpec | None = None,
             cluster: Cluster | None = None, pp: int = 1, tp: int = 1, dp: int = 1,
             micro_batch_size: int = 1, options: LoweringOptions | None = None
             ) -> InstructionDag:
    """The instruction DAG of `microbatches` micro-batches from either input mode.

    Profile mode: `profile` (a Perseus CSV) with exactly one of `gpu` (whose idle power is the
    blocking power) and `blocking_power_w`. Model mode: `model` on `cluster` under a 1F1B plan
    of the given degrees, costed by trainsim's DVFS model (`options`: its lowering options,
    e.g. a calibrated cost model); `blocking_power_w` overrides the GPU's idle power.

    Raises:
        SpecError: the inputs mix or miss a mode (`check_inputs`), or the plan does not suit
            the energy planner (`profile_from_model`).
        DataFileError: the profile CSV is malformed.
    """
    m = check_inputs(profile=profile, microbatches=microbatches, model_given=model is not None,
                     cluster_given=cluster is not None)
    prof: EnergyProfile
    if profile is not None:
        if blocking_power_w is not None and gpu is None:
            power = float(blocking_power_w)
        elif gpu is not None and blocking_power_w is None:
            power = blocking_power_of(gpu)
        else:
            raise SpecError("give exactly one of --gpu TYPE and --blocking-power-w W with "
                            "--profile")
        prof = load_perseus_csv(profile, blocking_power_w=float(power))
        if gpu is not None:
            check_profile_gpu(prof, profile, gpu)
    elif model is not None and cluster is not None:
        plan = {"pp": pp, "tp": tp, "dp": dp, "micro_batch_size": micro_batch_size,
                "num_micro_batches": m, "schedule": "1f1b"}
        prof = profile_from_model(model, cluster, plan, options=options)
        if blocking_power_w is not None:
            prof = replace(prof, blocking_power_w=float(blocking_power_w))
    else:  # pragma: no cover - check_inputs refused it
        raise SpecError("--model needs --cluster")
    return build_dag(prof, m)


def check_profile_gpu(prof: EnergyProfile, path: Path, gpu_name: str) -> None:
    """Refuse a profile that cannot have been measured on `gpu_name`: clocks outside its
    range, or a Perseus file name that names another GPU (``{model}+{a100_sxm|a40}_...``).
    A profile of another GPU gives a frontier of the wrong device with no word."""
    gpu = get_gpu(gpu_name)
    clocks = [f for o in prof.options.values() for f in o.freq_mhz.tolist()]
    lo, hi = min(clocks), max(clocks)
    if hi > gpu.sm_clock_max_mhz + 1e-6 or lo < gpu.sm_clock_min_mhz - 1e-6:
        raise SpecError(f"--profile {path.name} has clocks {lo:g}-{hi:g} MHz, outside "
                        f"--gpu {gpu.name}'s {gpu.sm_clock_min_mhz:g}-"
                        f"{gpu.sm_clock_max_mhz:g} MHz: was it measured on another GPU?")
    stem = path.name.lower()
    named = {"a100": "A100", "a40": "A40", "a10_": "A10", "v100": "V100", "h100": "H100"}
    for key, family in named.items():
        if f"+{key}" in stem and not gpu.name.upper().startswith(family):
            raise SpecError(f"--profile {path.name} names GPU {family} in its file name, but "
                            f"--gpu is {gpu.name}: give the GPU it was measured on")


# -------------------------------------------------------------------------------- frontier
@dataclass(frozen=True, kw_only=True, slots=True)
class FrontierRun:
    """The frontier of one DAG, the baselines it is compared with, and its intrinsic saving."""

    unit_s: float
    """Time quantum of the crashing steps (s)."""
    frontier: Frontier
    """Pareto-optimal plans, slowest first, and the raw steps."""
    baselines: list[Baseline]
    """all-max, ZeusGlobal, ZeusPerStage, EnvPipe (`all_baselines`)."""
    intrinsic: IntrinsicSaving
    """The fastest frontier plan vs all-max over the same time."""

    @property
    def all_max(self) -> FrontierPoint:
        """Every instruction at its highest clock (the first baseline)."""
        return self.baselines[0].point

    @property
    def fastest(self) -> FrontierPoint:
        """The frontier's fastest plan (least energy among the fastest)."""
        return min(self.frontier.points, key=lambda p: (p.time_s, p.energy_j))


def run_frontier(dag: InstructionDag, unit_s: float = DEFAULT_UNIT_S, *,
                 on_step: Callable[[int, int], None] | None = None) -> FrontierRun:
    """The frontier, the baselines and the intrinsic saving of `dag`.

    `on_step(steps_done, steps_total)` is called once per crashing step (steps_done = 0 for the
    start); steps_total, known at the start, is about how many steps the crashing takes (it
    grows as micro-batches × 1/unit_s), for progress bars and hints.

    Raises:
        SpecError: `unit_s` is not a finite number > 0.
    """
    if not (unit_s > 0 and unit_s < float("inf")):
        raise SpecError(f"--unit-s {unit_s!r} must be a finite number of seconds > 0")
    tick = None if on_step is None else _step_counter(on_step)
    fr = compute_frontier(dag, unit_s=unit_s, on_step=tick)
    baselines = all_baselines(dag, unit_s=unit_s)
    top = baselines[0].point
    intrinsic = intrinsic_saving(fr.points, top, blocking_power_w=dag.profile.blocking_power_w,
                                 num_stages=dag.num_stages)
    return FrontierRun(unit_s=unit_s, frontier=fr, baselines=baselines, intrinsic=intrinsic)


ESTIMATE_UNIT_S = 1e-6
"""The time quantum `estimate_steps` counts at: fine enough to scale from (its count is within
0.01 % of 1e-9 s's on GPT-3 1.3B, 4 stages), coarse enough to set up in milliseconds (1e-9 s
takes 7 s before its first step, 1e-11 s minutes)."""


def estimate_steps(dag: InstructionDag, unit_s: float) -> int:
    """About how many crashing steps `run_frontier(dag, unit_s)` takes (the start's makespan
    above the all-fastest one, in units), counted at `ESTIMATE_UNIT_S` and scaled where
    `unit_s` is finer, so a caller can refuse an hour of work before setting it up."""
    if not (unit_s > 0 and unit_s < float("inf")):
        raise SpecError(f"--unit-s {unit_s!r} must be a finite number of seconds > 0")
    at = max(unit_s, ESTIMATE_UNIT_S)
    first = next(frontier_steps(dag, unit_s=at, min_saving_w=dag.profile.blocking_power_w))
    return max(round((first.makespan_units - first.final_makespan_units) * at / unit_s), 1)


def _step_counter(on_step: Callable[[int, int], None]) -> Callable[[FrontierStep], None]:
    """A `compute_frontier` step callback that reports (steps done, steps in all): the total
    is the start's makespan above the all-fastest one, in time units."""
    total = 1

    def tick(step: FrontierStep) -> None:
        nonlocal total
        if step.iteration == 0:
            total = max(step.makespan_units - step.final_makespan_units, 1)
        on_step(step.iteration, total)

    return tick


# ------------------------------------------------------------------------------- straggler
@dataclass(frozen=True, kw_only=True, slots=True)
class StragglerReport:
    """A straggler pick and/or the savings table of one frontier."""

    choice: StragglerPick | None
    """The lowest-energy plan finishing by T′ (None when no target was given)."""
    table: list[StragglerPick] | None
    """The pick at T′ = 1.0, 1.1, ..., 1.5 × T_allmax (None when not asked for)."""


def straggler_pick(dag: InstructionDag, run: FrontierRun, *, slowdown: float | None = None,
                   deadline_s: float | None = None, table: bool = False) -> StragglerReport:
    """The plan for a straggler's iteration time T′ (= slowdown × T_allmax, or `deadline_s`;
    neither: no pick) and, with `table`, the savings vs all-max for slowdowns 1.0–1.5.

    Raises:
        SpecError: both targets, or one that is not a finite number (slowdown >= 1, deadline
            at least the all-max time).
    """
    power, stages = dag.profile.blocking_power_w, dag.num_stages
    choice = None
    if slowdown is not None or deadline_s is not None:
        choice = pick(run.frontier.points, run.all_max, slowdown=slowdown,
                      deadline_s=deadline_s, blocking_power_w=power, num_stages=stages)
    rows = (savings_table(run.frontier.points, run.all_max, blocking_power_w=power,
                          num_stages=stages) if table else None)
    return StragglerReport(choice=choice, table=rows)


# --------------------------------------------------------------------------------- lowered
@dataclass(frozen=True, kw_only=True, slots=True)
class LoweredPlan:
    """One frequency plan as `lower()` runs it: predicted with its transfers and optimizer
    step, and simulated."""

    predicted_time_s: float
    predicted_energy_j: float
    simulated_time_s: float
    simulated_energy_j: float
    plan: ParallelPlan
    """The ParallelPlan with the clocks as `instruction_freq_mhz`."""

    def to_json(self) -> dict[str, float]:
        """The figures, without the plan."""
        return {"predicted_time_s": self.predicted_time_s,
                "predicted_energy_j": self.predicted_energy_j,
                "simulated_time_s": self.simulated_time_s,
                "simulated_energy_j": self.simulated_energy_j}


@dataclass(frozen=True, kw_only=True, slots=True)
class LoweredPlans:
    """Model mode: the all-max and no-slowdown plans as lowered, or why there are none."""

    plans: dict[str, LoweredPlan]
    """Keyed as PLAN_FILES ("all_max", "no_slowdown"); empty with a note."""
    note: str | None = None
    """Why the plans could not be lowered (the lowering's SpecError)."""

    @property
    def saving(self) -> float:
        """1 − simulated no-slowdown energy / simulated all-max energy."""
        return 1.0 - (self.plans["no_slowdown"].simulated_energy_j
                      / self.plans["all_max"].simulated_energy_j)

    def to_json(self) -> dict[str, Any]:
        """`{"note": ...}`, or each plan's figures and the saving."""
        if self.note is not None:
            return {"note": self.note}
        return {**{key: p.to_json() for key, p in self.plans.items()}, "saving": self.saving}


def lowered_plans(dag: InstructionDag, run: FrontierRun) -> LoweredPlans | None:
    """Model mode: the all-max plan and the lowest-energy plan no slower than it, both as
    `lower()` runs them (predicted with its transfers and optimizer step, and simulated).
    The no-slowdown plan is picked under that prediction (`lowered.no_slowdown`): transfer
    delays can lengthen a plan whose instruction DAG ties the all-max time. None for a
    profile CSV."""
    meta = dag.profile.metadata
    if "plan" not in meta:
        return None
    spec: ModelSpec = meta["model_spec"]
    hw: Cluster = meta["cluster"]
    plan: ParallelPlan = meta["plan"]
    options: LoweringOptions | None = meta.get("options")
    top_freq = all_max_freq(dag)
    try:
        extras = LoweredExtras.from_program(
            dag, lower(spec, hw, frequency_plan(dag, top_freq, plan), options))
    except SpecError as exc:
        return LoweredPlans(plans={}, note=str(exc))
    fastest = [p.freq_mhz for p in run.frontier.points[::-1][:LOWERED_CANDIDATES]]
    chosen = {"all_max": top_freq, "no_slowdown": no_slowdown(dag, fastest, extras)}
    plans: dict[str, LoweredPlan] = {}
    for key, freq in chosen.items():
        check, _ = replay_lowered(dag, np.asarray(freq), spec, hw, plan, options=options,
                                  extras=extras, check=False)
        plans[key] = LoweredPlan(predicted_time_s=check.predicted_time_s,
                                 predicted_energy_j=check.predicted_energy_j,
                                 simulated_time_s=check.replayed_time_s,
                                 simulated_energy_j=check.replayed_energy_j,
                                 plan=frequency_plan(dag, freq, plan))
    return LoweredPlans(plans=plans)


# ------------------------------------------------------------------------------------ JSON
def plan_json(dag: InstructionDag, point: FrontierPoint) -> dict[str, Any]:
    """One frequency plan per rank: its instructions in order and their clocks."""
    ranks = []
    for s, nodes in enumerate(dag.stage_order):
        ranks.append({"rank": s, "instructions": [dag.label(i) for i in nodes],
                      "freq_mhz": [float(point.freq_mhz[i]) for i in nodes]})
    return {"time_s": point.time_s, "energy_j": point.energy_j, "ranks": ranks}


def intrinsic_json(intrinsic: IntrinsicSaving) -> dict[str, Any]:
    """The intrinsic saving's parts: the fastest plan, the all-max energy over its time, and
    the saving at the all-max time for comparison."""
    return {"fastest_time_s": intrinsic.time_s, "fastest_energy_j": intrinsic.point.energy_j,
            "all_max_energy_at_fastest_j": intrinsic.all_max_energy_at_fastest_j,
            "saving": intrinsic.saving,
            "saving_at_all_max_time": intrinsic.saving_at_all_max_time}


def pick_json(choice: StragglerPick) -> dict[str, Any]:
    """One straggler pick without its plan: T′, the plan's time, energies, saving."""
    return {"slowdown": choice.slowdown, "deadline_s": choice.deadline_s,
            "time_s": choice.point.time_s, "energy_j": choice.energy_j,
            "all_max_energy_j": choice.all_max_energy_j, "saving": choice.saving}


def summary(dag: InstructionDag, run: FrontierRun,
            lowered: LoweredPlans | None = None) -> dict[str, Any]:
    """The frontier's JSON summary: inputs, all-max, the frontier's (time, energy) points,
    the intrinsic saving, the baselines, the planner's wall time and, in model mode, the
    lowered plans' figures (`lowered`)."""
    top = run.all_max
    out = {
        "source": dag.profile.source, "num_stages": dag.num_stages,
        "num_micro_batches": dag.num_micro_batches,
        "blocking_power_w": dag.profile.blocking_power_w,
        "all_max": {"time_s": top.time_s, "energy_j": top.energy_j},
        "frontier": [{"time_s": p.time_s, "energy_j": p.energy_j}
                     for p in run.frontier.points],
        "intrinsic_saving": run.intrinsic.saving,
        "intrinsic": intrinsic_json(run.intrinsic),
        "baselines": {b.name: {"time_s": b.point.time_s, "energy_j": b.point.energy_j}
                      for b in run.baselines},
        "planner_s": run.frontier.planner_s,
    }
    if lowered is not None:
        out["lowered"] = lowered.to_json()
    return out


def pick_summary(dag: InstructionDag, run: FrontierRun, report: StragglerReport
                 ) -> dict[str, Any]:
    """`summary` with the savings table (`straggler_table`) and the pick with its plan
    (`pick`), where asked for."""
    out = summary(dag, run)
    if report.table is not None:
        out["straggler_table"] = [pick_json(c) for c in report.table]
    if report.choice is not None:
        out["pick"] = {**pick_json(report.choice), "plan": plan_json(dag, report.choice.point)}
    return out


def dumps(doc: Any, indent: int | None = None) -> str:
    """Strict JSON: a non-finite number (never expected: inputs are checked) becomes null
    rather than the invalid tokens NaN/Infinity."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(doc), indent=indent, allow_nan=False)


# --------------------------------------------------------------------------------- outputs
def check_outputs(out: Path | None, force: bool) -> None:
    """Refuse, before any work, an output folder that is a file or holds outputs (without
    `force`): nothing a user wrote is overwritten silently."""
    if out is None:
        return
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {str(out)!r} is an existing file; give a folder for "
                        f"plans.json and frontier.html")
    for name in OUTPUT_FILES:
        if (out / name).exists() and not force:
            raise SpecError(f"{out / name} exists; pass --force to overwrite it")


def write_outputs(out: Path, dag: InstructionDag, run: FrontierRun, chosen: FrontierPoint,
                  extra: Mapping[str, Any], lowered: LoweredPlans | None = None) -> None:
    """plans.json (every frontier plan, plus `extra` keys), frontier.html (the frontier with
    the baselines and `chosen`'s timeline) and, with lowered plans, the PLAN_FILES (existing
    files were refused up front by `check_outputs` unless forced)."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {"source": dag.profile.source, "num_stages": dag.num_stages,
           "num_micro_batches": dag.num_micro_batches,
           "blocking_power_w": dag.profile.blocking_power_w, **extra,
           "plans": [plan_json(dag, p) for p in run.frontier.points]}
    (out / "plans.json").write_text(dumps(doc, indent=1) + "\n")
    fig = frontier_figure(dag, run.frontier.points, run.baselines, chosen,
                          title=f"{Path(dag.profile.source).name}, "
                                f"{dag.num_micro_batches} micro-batches")
    write_html(fig, str(out / "frontier.html"))
    if lowered is None or lowered.note is not None:
        return
    for key, name in PLAN_FILES.items():
        lowered.plans[key].plan.save(out / name, force=True)


__all__ = ["LOWERED_CANDIDATES", "OUTPUT_FILES", "PLAN_FILES", "FrontierRun", "LoweredPlan",
           "LoweredPlans", "StragglerReport", "check_inputs", "check_outputs", "dumps",
           "intrinsic_json", "load_dag", "lowered_plans", "pick_json", "pick_summary",
           "plan_json", "run_frontier", "straggler_pick", "summary", "write_outputs"]
