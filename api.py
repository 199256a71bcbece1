"""The one way in: load a model, a cluster and a plan from any spec form; simulate; plan.

Every `sim` command, bench script and notebook goes through these functions, so a spec that
works in one place works in all (DESIGN.md §1):

* a model is a zoo name (`gpt3-1.3b`), a small validation model (`tiny-gpt`), a YAML file in
  the zoo's schema or a Hugging Face `config.json`;
* a cluster is a short spec (`4xV100-SXM2-32GB`, `1x8xA100-SXM4-40GB+7x4xA10`), a YAML file,
  or `cpu:N` — this machine as N worker processes, described by a profile database from
  `sim profile` (the packaged reference profile when none is given);
* a plan is a ParallelPlan, a dict of its fields, or a saved plan JSON file, with overrides.

Layers below (hwmodels, workloads, simulator, search, validate) take resolved objects only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsim.errors import (
    DataFileError,
    SpecError,
    TraceError,
    TrainsimError,
    UnknownNameError,
    unknown_name,
)
from trainsim.hwmodels.calibration import Calibration, load_calibration
from trainsim.hwmodels.catalog_views import catalog_gpus, describe_hardware
from trainsim.hwmodels.catalog_views import describe_cluster as _cluster_view
from trainsim.hwmodels.cluster import Cluster, parse_cluster
from trainsim.hwmodels.gpus import get_gpu
from trainsim.search.aceso.profile import aceso_lowering_options
from trainsim.search.energy.outputs import PLAN_FILES
from trainsim.search.exports import search_output_files
from trainsim.search.hetero.objectives import with_prices
from trainsim.search.methods import EVALUATION_BUDGET_METHODS, get_planner
from trainsim.search.microbatch.planner import METHODS as MICROBATCH_METHODS
from trainsim.search.microbatch.planner import MethodResult, MicroBatchPlanner
from trainsim.search.oracle import Oracle
from trainsim.search.planner import SearchRecord, SearchResult, SearchSpec, run_search
from trainsim.search.sweep import SweepRun, load_spec, run_sweep, write_report
from trainsim.simulator.engines import ENGINES, check_engine, run_program
from trainsim.simulator.own_files import make_parent
from trainsim.simulator.result import SimResult
from trainsim.validate.compare import Comparison, compare
from trainsim.validate.cpu_hardware import cpu_cluster
from trainsim.validate.devices import backend_for
from trainsim.validate.kernel_fit import is_kernels_csv, kernels_profile
from trainsim.validate.kineto_ops import kineto_profile
from trainsim.validate.profile_db import ProfileDB
from trainsim.validate.profiled_cost import ProfiledCostModel, load_cost_model
from trainsim.validate.profiler import run_profile
from trainsim.validate.published_runs import AccuracyReport, PublishedRun, group_stats, read_runs
from trainsim.validate.published_runs import default_csv_path as published_runs_csv
from trainsim.validate.published_runs import evaluate as _evaluate_runs
from trainsim.validate.roofline_fit import OpFit, fit_op_efficiency
from trainsim.validate.small_models import get_validation_model, list_validation_models
from trainsim.validate.trace_import import read_json
from trainsim.validate.trace_record import MeasuredTrace, import_kineto, parse_plan
from trainsim.validate.trace_record import record_trace as _record_trace
from trainsim.workloads.framework import apply_framework, get_framework
from trainsim.workloads.lengths import (
    LengthDataset,
    fit_max_len,
    iteration_batches,
    list_mixtures,
    read_lengths,
    tokenize_lengths,
)
from trainsim.workloads.lengths import synthetic as synthetic_lengths
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.model_summary import model_summary
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.plan_defaults import plan_fields
from trainsim.workloads.plan_file import PlanFile, plan_file_text, read_plan_file
from trainsim.workloads.zoo import get_model
from trainsim.workloads.zoo import list_models as zoo_names

if TYPE_CHECKING:  # the planners behind these load scipy.optimize: imported where used
    from trainsim.search.hetero.pareto import ParetoPoint
    from trainsim.search.intraop.pipeline import PipelineResult
    from trainsim.search.intraop.planner import IntraopResult

__all__ = [
    "ENGINES",
    "PlanFile",
    "catalog_gpus",
    "check_device",
    "cost_model_for",
    "describe_cluster",
    "describe_hardware",
    "describe_model",
    "energy_dag",
    "energy_frontier",
    "energy_pick",
    "estimate_tasks",
    "intraop",
    "list_models",
    "load_cluster",
    "load_cost_model",
    "load_model",
    "lowering_options",
    "make_plan",
    "profile_ops",
    "read_plan",
    "record_trace",
    "reference_cpu_profile",
    "run_program",
    "save_plan",
    "search",
    "search_files",
    "search_options",
    "simulate",
    "stack_model",
    "sweep",
    "sweep_report",
    "validate",
]

CPU_PREFIX = "cpu:"
"""Cluster specs `cpu:N`: this machine as N worker processes, from a profile database."""

_REFERENCE_PROFILE = "data/reference_cpu_profile.csv"


def load_model(spec: str | ModelSpec) -> ModelSpec:
    """A ModelSpec from a zoo name, a validation model name, a YAML/config.json path, or a
    ModelSpec (returned as is).

    Raises:
        UnknownNameError: neither a zoo nor a validation model; lists close names.
        SpecError / DataFileError: a model file that does not parse or misses fields.
    """
    if isinstance(spec, ModelSpec):
        return spec
    if not isinstance(spec, str):
        raise TrainsimError(f"model {spec!r} must be a zoo name, a model file or a ModelSpec")
    try:
        return get_model(spec)
    except UnknownNameError:
        if spec.strip().lower() in list_validation_models():
            return get_validation_model(spec)
        raise


def list_models() -> dict[str, ModelSpec]:
    """The zoo's models by name, in catalog order (validation models are not listed)."""
    return {name: get_model(name) for name in zoo_names()}


def describe_model(model: str | ModelSpec, micro_batch_size: int = 1,
                   seq_len: int | None = None) -> dict[str, Any]:
    """A model's shape, parameters, FLOPs and activation memory (`sim models show --json`)."""
    return model_summary(load_model(model), micro_batch_size, seq_len)


def reference_cpu_profile() -> Path:
    """The packaged profile database that describes `cpu:N` when no --profile is given: the
    one the committed CPU traces were validated with (validate/data/SOURCES.md)."""
    return Path(str(resources.files("trainsim.validate").joinpath(_REFERENCE_PROFILE)))


def cost_model_for(cluster: str | Cluster, profile: str | Path | ProfiledCostModel | None
                   ) -> ProfiledCostModel | None:
    """The measured cost model that prices ops on `cluster`: `profile`'s, else for `cpu:N` the
    packaged reference profile's (a CPU has no roofline of its own), else None (roofline)."""
    if profile is None and isinstance(cluster, str) and cluster.startswith(CPU_PREFIX):
        profile = reference_cpu_profile()
    if profile is None or isinstance(profile, ProfiledCostModel):
        return profile
    return load_cost_model(profile)


def _cpu_processes(spec: str) -> int:
    text = spec[len(CPU_PREFIX):]
    if not text.isdigit() or int(text) < 1:
        raise TrainsimError(f"cluster {spec!r}: expected cpu:N with N processes, e.g. cpu:2")
    return int(text)


def load_cluster(spec: str | Cluster, *,
                 profile: str | Path | ProfiledCostModel | None = None) -> Cluster:
    """A Cluster from a short spec, a YAML path, `cpu:N`, or a Cluster (returned as is).

    `profile` (a profile database path or a loaded cost model) describes `cpu:N`; without one
    the packaged reference profile does.
    """
    if isinstance(spec, Cluster):
        return spec
    if not isinstance(spec, str):
        raise TrainsimError(f"cluster {spec!r} must be a cluster spec, a YAML file or a Cluster")
    if spec.startswith(CPU_PREFIX):
        processes = _cpu_processes(spec)
        cost = cost_model_for(spec, profile) or load_cost_model(reference_cpu_profile())
        cores = cost.db.meta.get("logical_cores")
        if isinstance(cores, int) and processes > cores:
            raise SpecError(f"cluster {spec}: the profile was measured on a machine with {cores} "
                            f"logical cores and the CPU model runs one worker per core; give at "
                            f"most cpu:{cores}, or a profile of a bigger machine (sim profile "
                            f"--processes N there)")
        return cpu_cluster(cost.db, processes)
    return parse_cluster(spec)


def describe_cluster(spec: str, *, profile: str | Path | ProfiledCostModel | None = None
                     ) -> dict[str, Any]:
    """A cluster's size, peak, price, node groups and links (`sim hw cluster --json`)."""
    return _cluster_view(load_cluster(spec, profile=profile), spec)


def check_profile_matches(cost: ProfiledCostModel | None, cluster: Cluster) -> None:
    """Refuse a profile measured on a CPU for a GPU cluster (and the reverse): its op times
    would be silently wrong by orders of magnitude (MFU 0.000)."""
    if cost is None:
        return
    measured_cpu = str(cost.db.meta.get("device", "cpu")) == "cpu"
    cluster_cpu = {cluster.gpu(r).name for r in range(cluster.num_gpus)} == {"cpu"}
    if measured_cpu != cluster_cpu:
        where = "this CPU" if measured_cpu else f"GPU {cost.db.meta.get('gpu_name', '?')}"
        raise SpecError(f"--profile was measured on {where}, but the cluster runs on "
                        f"{'CPU processes' if cluster_cpu else cluster.gpu(0).name}: profile "
                        f"that device (`sim profile --device {'cpu' if cluster_cpu else 'cuda'}`)"
                        f" or drop --profile")


def lowering_options(*, profile: str | Path | ProfiledCostModel | None = None,
                     unfold: bool = False) -> LoweringOptions | None:
    """LoweringOptions for a profile database (measured op costs replace the roofline) and
    folding; None when both are the defaults, so plain runs lower exactly as before."""
    cost = None if profile is None else cost_model_for("", profile)
    if cost is None and not unfold:
        return None
    return LoweringOptions(fold=not unfold, cost_model=cost)


def save_plan(plan: ParallelPlan, path: str | Path, *, model: str, cluster: str,
              framework: str | None = None, prices: Mapping[str, float] | None = None) -> Path:
    """Write `plan` with its run (the model and cluster as the user named them, the framework
    profile if any, the GPU prices that overrode the catalog's if any, trainsim's version), so
    `sim simulate --plan FILE` alone reproduces it. Callers check the path first
    (commands/output.py)."""
    out = Path(path)
    make_parent(out).write_text(plan_file_text(plan, model=model, cluster=cluster,
                                               framework=framework, prices=prices),
                                encoding="utf-8")
    return out


def read_plan(path: str | Path) -> PlanFile:
    """A saved plan file's fields and run (model, cluster, version; None where absent)."""
    return read_plan_file(path)


def stack_model(model: str | ModelSpec, framework: str | None = None,
                attention: str | None = None) -> ModelSpec:
    """`model` (a name, file or spec) as `framework` trains it, `attention` overriding its
    kernel: the model `simulate`, `search` and `microbatch` plan, whose Oracle (or planner)
    given the same `framework` fills every plan with that stack's defaults.

    Raises:
        UnknownNameError: an unknown framework, one line listing the profiles.
    """
    return apply_framework(load_model(model), framework, attention)


def make_plan(model: ModelSpec, cluster: Cluster,
              plan: ParallelPlan | Mapping[str, Any] | str | Path | None = None, *,
              framework: str | None = None, attention: str | None = None,
              **overrides: Any) -> ParallelPlan:
    """A checked ParallelPlan: `plan` (a plan, a dict of its fields, or a saved plan JSON file)
    with the non-None `overrides` applied; with no plan, ParallelPlan's defaults for this model
    and cluster fill what `overrides` leave unset (workloads/plan_defaults.py).

    `recompute` may be given as "none" / "selective" / "full" or "op1,op2,...".
    `framework` / `attention`: the model as that stack trains it (workloads/framework.py),
    for the defaults that depend on its memory; None keeps the model's own kernel. A framework
    whose profile turns sequence parallelism on with tensor parallelism (torchtitan, nemo) sets
    `sp` when the plan has tp > 1 and neither `plan` nor `overrides` say; its profile's
    `overlap_grad_reduce` (off for Megatron-LM), its distributed optimizer (ZeRO-1: NeMo) and
    `overlap_param_gather` (on for NeMo, where ZeRO-1/2 applies) are the defaults the same
    way.
    """
    model = apply_framework(model, framework, attention)
    if framework is not None and plan is None:
        overrides.update(get_framework(framework).plan_defaults(overrides, model.family))
    if isinstance(plan, (str, Path)):
        base: dict[str, Any] | None = read_plan_file(plan).fields
    elif isinstance(plan, ParallelPlan):
        base = plan.to_dict()
    elif plan is not None:
        base = dict(plan)
    else:
        base = None
    return ParallelPlan.build(model, cluster, **plan_fields(model, cluster, base, overrides))


DEFAULT_MAX_TASKS = 10_000_000
"""Largest program `simulate` runs unless told otherwise: about 1.2 KB of memory per task
(bench/engine.py: 829,440 tasks in 1.02 GB peak RSS), so ~12 GB and about a minute here."""


def estimate_tasks(model: ModelSpec, cluster: Cluster, plan: ParallelPlan,
                   options: LoweringOptions | None = None) -> int:
    """Tasks the lowered program of `plan` will have, without lowering all of it: a program
    grows linearly with the micro-batch count, so lower copies with k and 2k micro-batches
    (k: two per pipeline stage, as 1F1B fills its pipeline) and extrapolate the line. A plan
    with explicit micro-batch lists (`micro_batches`, `replica_micro_batches`) or a
    `dp_batch_split` is lowered as it is: its lists cannot be rebuilt at another count."""
    m = plan.num_micro_batches or 0  # set by ParallelPlan.build
    k = 2 * plan.pp * plan.virtual_stages
    if (plan.micro_batches is not None or plan.replica_micro_batches is not None
            or plan.dp_batch_split is not None or m <= 2 * k):
        # explicit lists (and uneven splits) fix the batch: lower the plan itself
        return lower(model, cluster, plan, options).num_tasks

    def tasks(count: int) -> int:
        fields = {**plan.to_dict(), "num_micro_batches": count,
                  "global_batch": count * plan.micro_batch_size * plan.dp}
        return lower(model, cluster, ParallelPlan.build(model, cluster, **fields),
                     options).num_tasks

    first, second = tasks(k), tasks(2 * k)
    return first + (second - first) * (m - k) // k


def check_work_size(model: ModelSpec, cluster: Cluster, plan: ParallelPlan,
                    options: LoweringOptions | None, max_tasks: int | None) -> None:
    """Refuse, before the work starts, a run whose program would exceed `max_tasks`, with the
    estimate and the way out."""
    if max_tasks is None:
        return
    tasks = estimate_tasks(model, cluster, plan, options)
    if tasks > max_tasks:
        raise SpecError(f"this run would simulate about {tasks:,} tasks ({plan.num_micro_batches:,}"
                        f" micro-batches of {plan.micro_batch_size}), over --max-tasks "
                        f"{max_tasks:,}: give a smaller --global-batch or a larger --micro-batch, "
                        f"keep ranks folded (no --unfold), or raise --max-tasks")


def calibration_options(calibration: str | Path | Calibration, *, unfold: bool = False
                        ) -> LoweringOptions:
    """LoweringOptions whose roofline uses `calibration`'s coefficients (a file or loaded)."""
    cal = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    return LoweringOptions(fold=not unfold, cost_model=cal.cost_model())


def calibrate_dvfs(perseus_dir: str | Path, *,
                   on_gpu: Callable[[str], None] | None = None) -> Calibration:
    """Fit the DVFS time split and power coefficients to Perseus' measured stage profiles
    (`sim calibrate dvfs`); `search.energy.dvfs_fit.write_catalog` makes them the defaults."""
    # deferred: start-up time (scipy.optimize and the energy planner's modules)
    from trainsim.search.energy.dvfs_fit import calibrate
    folder = Path(perseus_dir)
    if not folder.is_dir():
        raise SpecError(f"--perseus {folder}: not a folder (the Perseus artifact's "
                        "stage_profile/ folder, e.g. ../shared/data/perseus/stage_profile)")
    return calibrate(folder, on_gpu)


def calibrate_ops(profile: str | Path | ProfileDB, gpu: str, dtype: str = "fp16"
                  ) -> tuple[OpFit, Calibration]:
    """Fit the roofline's per-class efficiency factors and launch overhead of catalog GPU
    `gpu` to measured op times (`sim calibrate ops`): a `sim profile` CSV, a PyTorch
    profiler (Kineto) trace ``.json`` recorded with shapes, or a kernels.csv of
    bench/gpu_record.py. The calibration file carries them
    as `op_efficiency`."""
    if isinstance(profile, ProfileDB):
        db = profile
    elif str(profile).endswith(".json"):
        db = kineto_profile(read_json(profile), str(profile))
    elif is_kernels_csv(profile):
        db = kernels_profile(profile)
    else:
        db = ProfileDB.load(profile)
    spec = get_gpu(gpu)
    if dtype not in spec.dtypes:
        raise SpecError(f"--dtype {dtype}: {spec.name} runs {', '.join(spec.dtypes)}")
    where = db.meta.get("command") or "a sim profile"
    device = db.meta.get("device")
    if device is not None and device != "cuda":
        raise SpecError(f"--gpu {spec.name}: the profile was measured on device {device!r} "
                        f"({where}); calibrate a GPU from op times measured on it (sim profile "
                        f"--device cuda, a Kineto trace of a GPU run, or bench/gpu_record.py)")
    try:
        fit = fit_op_efficiency(db, spec, dtype)
    except DataFileError as exc:
        name = where if isinstance(profile, ProfileDB) else str(profile)
        raise DataFileError(f"{name}, --gpu {spec.name}: {exc}") from None
    source = (f"sim calibrate ops: fit to {fit.rows} measured op times ({where}); op-time "
              f"MAPE {fit.mape_before:.1%} -> {fit.mape_after:.1%}, held-out "
              f"{fit.holdout_mape:.1%}")
    cal = Calibration(op_efficiency={spec.name: fit.efficiency},
                      sources={f"op_efficiency.{spec.name}": source})
    return fit, cal


def simulate(model: str | ModelSpec, cluster: str | Cluster,
             plan: ParallelPlan | Mapping[str, Any] | str | Path | None = None, *,
             engine: str = "numba", options: LoweringOptions | None = None,
             profile: str | Path | ProfiledCostModel | None = None, unfold: bool = False,
             on_progress: Callable[[int, int], None] | None = None,
             max_tasks: int | None = DEFAULT_MAX_TASKS, framework: str | None = None,
             attention: str | None = None, **overrides: Any) -> SimResult:
    """Simulate one training iteration of `model` on `cluster` under `plan`.

    Args:
        model: Zoo name, validation model, model file path, or ModelSpec.
        cluster: Cluster spec (e.g. "4xV100-SXM2-32GB"), YAML path, `cpu:N`, or Cluster.
        plan: A ParallelPlan, a dict of its fields, a plan JSON path, or None for defaults.
        engine: "numba" (fast, default) or "simpy" (the readable reference).
        options: Lowering options; built from `profile` and `unfold` when None.
        profile: Profile database (from `sim profile`) whose measured op costs replace the
            roofline; it also describes `cpu:N`.
        unfold: Simulate every GPU as its own rank.
        on_progress: Called as (tasks_done, total) now and then, for progress bars.
        max_tasks: Refuse (SpecError, before lowering) a program estimated larger than this;
            None runs anything.
        framework: A framework profile (megatron, deepspeed, torchtitan, hf-eager, default;
            workloads/data/frameworks.yaml) that sets the attention kernel; None keeps the
            model's own (flash unless its file says eager).
        attention: "flash" or "eager", overriding the framework's kernel.
        **overrides: Plan fields that override `plan`'s (dp=2, recompute="full", ...).

    Returns:
        The SimResult of the iteration (its `cost_usd` from the cluster's price).
    """
    check_engine(engine)
    cost = cost_model_for(cluster, profile)
    spec = stack_model(model, framework, attention)
    hw = load_cluster(cluster, profile=cost)
    check_profile_matches(cost, hw)
    checked = make_plan(spec, hw, plan, framework=framework, attention=attention, **overrides)
    if options is None:
        options = lowering_options(profile=cost, unfold=unfold)
    check_work_size(spec, hw, checked, options, max_tasks)
    return run_program(lower(spec, hw, checked, options), engine=engine, on_progress=on_progress)


def check_device(device: str) -> str:
    """The torch.distributed backend for `device` ("cpu": gloo, "cuda": NCCL), checked before
    any work starts (a clear error where the device is missing)."""
    return backend_for(device)


def profile_ops(model: str = "tiny-gpt", *, micro_batch_size: int = 2, processes: int = 2,
                warmup: int = 3, repeats: int = 10, device: str = "cpu") -> ProfileDB:
    """Time `model`'s op kinds (comma-separated names allowed) and the collectives on this
    machine with torch, into a profile database (`sim profile`)."""
    return run_profile(model, micro_batch_size=micro_batch_size, processes=processes,
                       warmup=warmup, repeats=repeats, device=device)


def record_trace(model: str, plan: str, *, micro_batch_size: int = 2,
                 num_micro_batches: int | None = None, iterations: int = 10, warmup: int = 3,
                 device: str = "cpu", import_path: str | Path | None = None,
                 command: str = "") -> MeasuredTrace:
    """Run `plan` ("dp2", "pp2", "tp2" or "dp=N,tp=N,pp=N") of `model` for real with torch and
    record a trace (`sim trace`); with `import_path`, convert that Kineto / torch.profiler
    Chrome trace instead of running."""
    fields = parse_plan(plan, micro_batch_size=micro_batch_size,
                        num_micro_batches=num_micro_batches)
    if import_path is not None:
        return import_kineto(import_path, model, fields)
    return _record_trace(model, fields, iterations=iterations, warmup=warmup, command=command,
                         device=device)


def validate(trace: str | Path | MeasuredTrace, profile: str | Path | ProfileDB | None = None,
             *, engine: str = "numba") -> tuple[MeasuredTrace, Comparison]:
    """Simulate a measured trace's plan with the profiled cost model and compare (`sim
    validate`). The profile defaults to `profile.csv` beside the trace file."""
    check_engine(engine)
    measured = trace if isinstance(trace, MeasuredTrace) else MeasuredTrace.load(trace)
    if not isinstance(profile, ProfileDB):
        if profile is None:
            if isinstance(trace, MeasuredTrace):
                raise TraceError("give the profile database the trace is validated against")
            profile = Path(trace).parent / "profile.csv"
        if not Path(profile).exists():
            raise TraceError(f"no profile database {profile}; give one with --profile")
        profile = ProfileDB.load(profile)
    return measured, compare(measured, profile, engine=engine)


# --- planners ---------------------------------------------------------------------------


def search_options(profile: str | Path | None, model: ModelSpec, cluster: str | Cluster
                   ) -> LoweringOptions | None:
    """How a search costs ops: an Aceso `profiled-time-*` folder → Aceso's measured V100 op
    times (their tensor-parallel collectives already inside); a profile database → measured
    op costs; none → the roofline (or, on `cpu:N`, the packaged reference profile)."""
    if profile is not None and Path(profile).is_dir():
        return aceso_lowering_options(profile, model)
    if profile is not None and not Path(profile).is_file():
        raise SpecError(f"--profile {str(profile)!r} is neither a folder nor a file")
    cost = cost_model_for(cluster, profile)
    return None if cost is None else LoweringOptions(cost_model=cost)


def intraop(model: str | ModelSpec, cluster: str | Cluster, *, method: str = "intraop",
            global_batch: int = 8, mesh: str | tuple[int, ...] | None = None,
            memory_limit_gb: float | None = None, time_limit_s: float = 60.0,
            recompute: bool = False) -> IntraopResult | PipelineResult:
    """Intra-operator sharding search (`sim search --method intraop|alpa|megatron`): CFP's
    ParallelBlocks with a DP over repeated segments, an Alpa-style ILP, or Megatron's hand
    tensor parallelism on a 1-D or 2-D mesh, each plan scored on the engine; "intraop-pp"
    adds pipeline stages and micro-batches (1F1B) around per-stage CFP (a `PipelineResult`).

    Raises:
        SpecError: bad method, mesh or model. IntraopMemoryError: no plan fits the limit (the
            message names the smallest limit any plan meets).
    """
    # deferred: start-up time (scipy.optimize, for `sim search --method intraop` alone)
    from trainsim.search.intraop.pipeline import METHOD as PIPELINE_METHOD
    from trainsim.search.intraop.pipeline import run_intraop_pp  # deferred: start-up time
    from trainsim.search.intraop.planner import run_intraop  # deferred: start-up time

    if method == PIPELINE_METHOD:  # pipeline stages × per-stage CFP (search/intraop/pipeline.py)
        return run_intraop_pp(load_model(model), load_cluster(cluster),
                              global_batch=global_batch, mesh=mesh,
                              memory_limit_gb=memory_limit_gb)
    return run_intraop(load_model(model), load_cluster(cluster), method=method,
                       global_batch=global_batch, mesh=mesh, memory_limit_gb=memory_limit_gb,
                       time_limit_s=time_limit_s, recompute=recompute)


def search(model: str | ModelSpec, cluster: str | Cluster, *, global_batch: int,
           method: str = "grid", memory_limit_gb: float | None = None,
           time_budget_s: float = 60.0, profile: str | Path | None = None,
           objective: str = "throughput", top: int = 5, engine: str = "numba",
           prices: Mapping[str, float] | None = None,
           on_record: Callable[[SearchRecord], None] | None = None,
           framework: str | None = None, max_evals: int | None = None) -> SearchResult:
    """Search parallel plans for `model` on `cluster` with a planner (`grid`: Megatron-LM's
    uniform grid; `aceso`: iterative bottleneck alleviation), every candidate scored by the
    Oracle (lowered program + engine). Ctrl-C returns the best so far.

    Args:
        global_batch: Samples per iteration (every candidate keeps it).
        memory_limit_gb: Per-GPU memory limit in GB (10^9 bytes); the device's when None.
        time_budget_s: Wall-clock seconds the search may spend.
        profile: An Aceso profile folder or a profile database (`search_options`).
        objective: throughput, cost ($ per iteration) or energy (J per iteration).
        top: How many ranked plans to keep.
        prices: USD per GPU-hour by GPU type, overriding the catalog's.
        on_record: Called with each evaluated plan's record (progress bars).
        framework: Plan for this stack (workloads/data/frameworks.yaml): the model as it
            trains it (memory, kernels, gradient reduction) and its plan defaults in every
            candidate (`FrameworkProfile.plan_defaults`); None: the model as it is.
        max_evals: Oracle evaluations at most (hetero, fasop, uniform: their planner's
            `max_evals`; None keeps its default); the search stops at whichever budget runs
            out first. Counted, not timed: the same search evaluates the same plans on any
            machine, however loaded.
    """
    if max_evals is None:
        planner = get_planner(method)
    elif method in EVALUATION_BUDGET_METHODS:
        planner = get_planner(method, max_evals=max_evals)
    else:
        raise SpecError(f"--max-evals applies to {', '.join(EVALUATION_BUDGET_METHODS)}; "
                        f"--method {method} is bounded by --time-budget-s only")
    spec = stack_model(model, framework)
    file_profile = profile if profile is not None and Path(profile).is_file() else None
    hw = with_prices(load_cluster(cluster, profile=file_profile), prices or {})
    request = SearchSpec(model=spec, cluster=hw, global_batch=global_batch,
                         memory_limit_bytes=None if memory_limit_gb is None
                         else memory_limit_gb * 1e9, time_budget_s=time_budget_s,
                         objective=objective, top_k=top)
    oracle = Oracle(spec, hw, engine=engine, options=search_options(profile, spec, cluster),
                    framework=framework)
    return run_search(planner, request, oracle=oracle, on_record=on_record)


def pareto(model: str | ModelSpec, gpus: Sequence[str], *, global_batch: int,
           prices: Mapping[str, float] | None = None, workers: int = 2,
           time_budget_s: float = 30.0,
           on_done: Callable[[ParetoPoint], None] | None = None) -> list[ParetoPoint]:
    """Plan every cluster composition of the `gpus` ranges ("A10:0..8x4": 0 to 8 nodes of 4
    A10s) with the heterogeneous planner, one `ParetoPoint` (best plan, tokens/s, $ per 1M
    tokens) each; `pareto_mask` marks the cost–throughput front."""
    # deferred: start-up time (the heterogeneous planner, for `sim pareto` alone)
    from trainsim.search.hetero.sweep import compositions, parse_range
    from trainsim.search.hetero.sweep import (  # deferred: start-up time
        sweep as sweep_compositions,
    )

    spec = load_model(model)
    specs = compositions([parse_range(g) for g in gpus])
    swept = {r.gpu for r in (parse_range(g) for g in gpus)}
    for name in prices or {}:
        if name not in swept:
            raise SpecError(str(unknown_name("GPU in prices", name, sorted(swept))))
    return sweep_compositions(spec, specs, global_batch, prices=prices, workers=workers,
                              time_budget_s=time_budget_s, on_done=on_done)


def sweep(spec: str | Path | Mapping[str, Any], out: str | Path, *, executor: str = "local",
          address: str | None = None, workers: int | None = None, force: bool = False,
          limit: int | None = None, drop_stale: bool = False,
          on_progress: Callable[[int, int], None] | None = None) -> SweepRun:
    """Run a what-if sweep (`sim sweep`): every scenario of `spec` — a YAML file, the
    built-in name "example", or the spec as a mapping (search/sweep/spec.py has the schema) —
    missing from the Parquet table at `out`, then write the table (one row per scenario,
    failed ones with `error` set). An existing table is resumed; `force` starts over.

    Args:
        executor: "local" (worker processes) or "ray" (`pip install 'trainsim[ray]'`).
        address: With "ray": "auto", "HOST:PORT" of a Ray head, or None for a local instance.
        workers: Worker processes (or a local Ray instance's CPUs); the CPU count when None.
        limit: Run at most this many missing scenarios, then stop.
        drop_stale: Drop the table's rows of scenarios `spec` no longer has (else such a
            table is refused, unless `force`).
        on_progress: Called as (rows in the table, scenarios) after each batch.
    """
    return run_sweep(load_spec(spec), out, executor=executor, address=address,
                     workers=workers, force=force, limit=limit, drop_stale=drop_stale,
                     on_progress=on_progress)


def sweep_report(table: str | Path, out: str | Path) -> Path:
    """Write the plotly dashboard of a sweep table (`sim sweep report`) to `out`: throughput,
    $ and energy per token against each knob, each model's Pareto points marked."""
    return write_report(table, out)


def length_dataset(*, lengths: str | Path | None = None, column: str | None = None,
                   target_column: str | None = None, synthetic: str | None = None,
                   text: str | Path | None = None, tokenizer: str | Path | None = None,
                   samples: int = 10_000, seed: int = 0) -> LengthDataset:
    """The sample lengths of a run: a lengths file (txt/CSV/Parquet), a named synthetic
    mixture, or a text file (txt/JSONL) through a local tokenizer -- exactly one of them."""
    given = [x for x in (lengths, synthetic, text) if x is not None]
    if len(given) != 1:
        raise SpecError("give exactly one of --lengths FILE, --synthetic NAME or --text FILE "
                        "(with --tokenizer)")
    if lengths is not None:
        return read_lengths(lengths, column=column, target_column=target_column)
    if synthetic is not None:
        return synthetic_lengths(synthetic, samples=samples, seed=seed)
    if tokenizer is None:
        raise SpecError("--text needs --tokenizer (a local tokenizer.json or its folder)")
    assert text is not None
    return tokenize_lengths(text, tokenizer)


def list_length_mixtures() -> list[str]:
    """Names of the synthetic length mixtures (workloads/data/length_mixtures.yaml)."""
    return list_mixtures()


def microbatch(model: str | ModelSpec, cluster: str | Cluster, dataset: LengthDataset, *,
               dp: int, tp: int = 1, pp: int = 1, tokens_per_batch: int, iterations: int = 10,
               max_len: int | None = None, max_target_len: int | None = None,
               on_long: str = "truncate", methods: Sequence[str] = MICROBATCH_METHODS,
               packing_attention: str | None = None, seed: int = 0,
               on_iteration: Callable[[str, int], None] | None = None,
               zero: int | None = None, attention: str | None = None,
               framework: str | None = None
               ) -> tuple[list[MethodResult], MicroBatchPlanner]:
    """Compare micro-batching methods (search/microbatch/planner.py) on `iterations` global
    batches of `tokens_per_batch` tokens drawn from `dataset`, each replayed on the engine.

    Samples longer than `max_len` (default: the model's sequence length; targets: its decoder
    length) are clipped (`on_long="truncate"`) or refused ("reject"). A decoder-only model
    reads an (input, target) pair as one sequence of both lengths, as instruction tuning does.

    `attention` ("eager" or "flash") is the kernel every method runs, so they are compared on
    one kernel (None: the model's, or the framework's); `packing_attention` overrides it for
    packing alone. `framework`: plan for that stack (workloads/data/frameworks.yaml): its
    model, and in every plan its plan defaults where unset -- `zero` None takes its
    distributed optimizer (ZeRO-1 with dp > 1: NeMo), else 0 -- as `search` does."""
    spec, hw = stack_model(model, framework, attention), load_cluster(cluster)
    if spec.family not in ("gpt", "llama", "moe", "t5", "bert"):
        raise SpecError(f"sim microbatch models sequences; {spec.name} is a {spec.family} "
                        f"model (images)")
    enc_dec = spec.family == "t5"
    limit = max_len or int(spec.max_position_embeddings or spec.seq_len)
    target_limit = (max_target_len or int(spec.decoder_seq_len)) if enc_dec else 0
    if on_long not in ("truncate", "reject"):
        raise SpecError(f"--on-long {on_long!r} must be truncate or reject")
    if dataset.encoder_decoder and not enc_dec:  # a decoder-only model reads both as one
        dataset = dataclasses.replace(dataset, samples=tuple(
            dataclasses.replace(s, input_len=s.input_len + s.target_len, target_len=0)
            for s in dataset.samples))
    fitted = fit_max_len(dataset, limit, policy=on_long,
                         max_target_len=target_limit if enc_dec else None)
    if enc_dec and not fitted.encoder_decoder:
        fitted = dataclasses.replace(fitted, samples=tuple(
            dataclasses.replace(s, target_len=max(1, target_limit)) for s in fitted.samples))
    batches = iteration_batches(fitted, tokens_per_batch, iterations=iterations, seed=seed)
    planner = MicroBatchPlanner(spec, hw, dp=dp, tp=tp, pp=pp, max_len=limit,
                                max_target_len=target_limit,
                                packing_attention=packing_attention or spec.attention,
                                zero=zero, framework=framework)
    planner.dataset = fitted
    results = [planner.run(m, batches, on_iteration) for m in methods]
    return results, planner


def search_files(result: SearchResult, *, model: str, cluster: str,
                 framework: str | None = None,
                 prices: Mapping[str, float] | None = None) -> dict[str, str]:
    """The files `sim search --out` writes, by name: the best plan as a plan file that names
    its run (`model`, `cluster` as the user gave them, the `framework` it was planned for, the
    `prices` it was priced with where they overrode the catalog's), Aceso's config and
    Megatron-LM flags, the ranked plans and the search log."""
    files = search_output_files(result, result.spec.model, result.spec.cluster)
    best = result.best
    if best is not None and best.plan is not None:
        files["best_plan.json"] = plan_file_text(best.plan, model=model, cluster=cluster,
                                                 framework=framework, prices=prices)
    return files


def energy_dag(*, microbatches: int | None, profile: str | Path | None = None,
               gpu: str | None = None, blocking_power_w: float | None = None,
               model: str | ModelSpec | None = None, cluster: str | Cluster | None = None,
               pp: int = 1, tp: int = 1, dp: int = 1, micro_batch_size: int = 1,
               calibration: str | Path | Calibration | None = None) -> Any:
    """The instruction DAG the energy planner crashes: from a Perseus profile CSV (`profile`,
    with `gpu` or `blocking_power_w`) or from a model on a cluster under a 1F1B plan, costed
    by trainsim's DVFS model (with `calibration`'s coefficients when given)."""
    # deferred: start-up time (the energy planner compiles numba kernels at import)
    from trainsim.search.energy import planner
    path = None if profile is None else Path(profile)
    planner.check_inputs(profile=path, microbatches=microbatches,
                         model_given=model is not None, cluster_given=cluster is not None)
    if isinstance(cluster, str) and cluster.startswith(CPU_PREFIX):
        raise SpecError(f"--cluster {cluster}: the energy planner needs GPU clocks and power "
                        f"curves (DVFS); a CPU cluster has none")
    if calibration is not None and profile is not None:
        raise SpecError("--calibration applies to model mode (--model, --cluster); a --profile "
                        "CSV is measured already")
    if gpu is not None and profile is None:
        raise SpecError(f"--gpu {gpu}: applies to --profile mode (whose CSV names no GPU); "
                        f"--model mode takes the GPUs of --cluster")
    spec = None if model is None else load_model(model)
    hw = None if cluster is None or model is None else load_cluster(cluster)
    options = None if calibration is None else calibration_options(calibration)
    return planner.load_dag(microbatches, profile=path, gpu=gpu,
                            blocking_power_w=blocking_power_w, model=spec, cluster=hw, pp=pp,
                            tp=tp, dp=dp, micro_batch_size=micro_batch_size, options=options)


def energy_unit_s(dag: Any, unit_s: float | None) -> float:
    """The crashing quantum: `unit_s`, or by default Lowtime's 1 ms shrunk to 5 % of the
    shortest instruction (search/energy/point.py, `default_unit_s`)."""
    from trainsim.search.energy.point import default_unit_s  # deferred: start-up time (numba)
    return default_unit_s(dag.shortest_s()) if unit_s is None else unit_s


def energy_frontier(dag: Any, *, unit_s: float | None = None, out: Path | None = None,
                    on_step: Callable[[int, int], None] | None = None,
                    model: str | None = None, cluster: str | None = None) -> dict[str, Any]:
    """Every frequency plan on the iteration time–energy frontier (Perseus / Lowtime's
    crashing), the Zeus and EnvPipe baselines, the intrinsic saving and, in model mode, the
    all-max and no-slowdown plans as `lower()` runs them. With `out`, writes plans.json,
    frontier.html and the plan files there (plan files that name their run: `model`,
    `cluster` as the user gave them). Returns {"run", "lowered", "summary"}."""
    from trainsim.search.energy import planner  # deferred: start-up time (numba kernels)
    run = planner.run_frontier(dag, energy_unit_s(dag, unit_s), on_step=on_step)
    lowered = planner.lowered_plans(dag, run)
    summary = planner.summary(dag, run, lowered)
    if out is not None:
        planner.write_outputs(out, dag, run, run.fastest, {"all_max": summary["all_max"]},
                              lowered)
        if lowered is not None and lowered.note is None and model and cluster:
            for key, name in PLAN_FILES.items():
                save_plan(lowered.plans[key].plan, out / name, model=model, cluster=cluster)
    return {"run": run, "lowered": lowered, "summary": summary}


def energy_pick(dag: Any, *, slowdown: float | None = None, deadline_s: float | None = None,
                table: bool = False, unit_s: float | None = None, out: Path | None = None,
                on_step: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The lowest-energy plan that finishes by a straggler's iteration time (`slowdown` × the
    all-max time, or `deadline_s`) and, with `table`, the savings for slowdowns 1.0–1.5. With
    `out`, writes plans.json and frontier.html. Returns {"run", "report", "summary"}."""
    from trainsim.search.energy import planner  # deferred: start-up time (numba kernels)
    if not table and slowdown is None and deadline_s is None:
        raise SpecError("give --straggler (slowdown factor), --deadline-s or "
                        "--straggler-table")
    run = planner.run_frontier(dag, energy_unit_s(dag, unit_s), on_step=on_step)
    report = planner.straggler_pick(dag, run, slowdown=slowdown, deadline_s=deadline_s,
                                    table=table)
    summary = planner.pick_summary(dag, run, report)
    if out is not None:
        shown = report.choice.point if report.choice is not None else run.intrinsic.point
        planner.write_outputs(out, dag, run, shown, {k: summary[k] for k in
                                                    ("pick", "straggler_table")
                                                    if k in summary})
    return {"run": run, "report": report, "summary": summary}


def accuracy(csv_path: str | Path | None = None, *, sources: Collection[str] | None = None,
             max_gpus: int | None = None, calibration: str | Path | Calibration | None = None,
             engine: str = "numba",
             on_row: Callable[[int, int, PublishedRun], None] | None = None) -> AccuracyReport:
    """Simulate every row of a published-runs CSV (`sim accuracy`, bench/accuracy.py) and
    compare with the published throughput and peak memory.

    Args:
        csv_path: A CSV in the schema of ../shared/data/published/SOURCES.md; default the
            reference data's training_runs.csv ($TRAINSIM_SHARED_DATA, else ../shared/data).
        sources: Only the rows of these sources (held-out rows in leave-one-source-out).
        max_gpus: Only the rows of runs on at most this many GPUs (a quick subset).
        calibration: Fitted coefficients (a file or loaded) that replace the catalog's.
        on_row: Called as (rows_done, total, row) before each row, for progress bars.

    Rows trainsim cannot express yet come back in `not_expressible` with their reason.
    """
    check_engine(engine)
    path = Path(csv_path) if csv_path is not None else published_runs_csv()
    if csv_path is None and not path.is_file():
        raise SpecError(f"no published runs at {path}: give a CSV path or set "
                        f"TRAINSIM_SHARED_DATA to the reference data folder")
    runs = read_runs(path)
    if sources is not None:
        unknown = sorted(set(sources) - {r.source for r in runs})
        if unknown:
            raise SpecError(f"{path}: no rows of source {unknown[0]!r}")
        runs = [r for r in runs if r.source in sources]
    if max_gpus is not None:
        runs = [r for r in runs if r.gpus <= max_gpus]
    options = None if calibration is None else calibration_options(calibration)
    results, skipped = _evaluate_runs(runs, options=options, engine=engine, on_row=on_row)
    return AccuracyReport(path, results, skipped, group_stats(results),
                          calibrated=calibration is not None)
