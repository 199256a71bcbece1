"""`sim energy ...`: GPU frequency plans on the iteration time–energy frontier (Perseus).

`frontier` computes the frontier, the baselines and the intrinsic saving (Perseus's: the
fastest frontier plan vs all-max over the same time, search/energy_straggler.py); `pick` chooses
the plan for a straggler's iteration time, and `--straggler-table` lists the savings vs all-max
for slowdowns 1.0–1.5. Inputs are a Perseus profile CSV or a model + cluster +
plan costed by trainsim's DVFS model. In model mode the summary adds `lowered`: the all-max and
no-slowdown plans as `lower()` runs them (transfers and optimizer step included,
search/energy_lowered.py), predicted and simulated, and `--out` also writes them as ParallelPlan
JSON files (`plan_all_max.json`, `plan_no_slowdown.json`) that `sim simulate --plan` runs.
Heavy imports stay inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from trainsim.errors import SpecError, TrainsimError

app = typer.Typer(help="GPU frequency plans on the time-energy frontier (Perseus).",
                  no_args_is_help=True)

_PROFILE = typer.Option(None, "--profile", help="Perseus profile CSV "
                        "(stage,instruction,frequency,time,energy).")
_MB = typer.Option(None, "--microbatches", help="Micro-batches per iteration.")
_GPU = typer.Option(None, "--gpu", help="GPU type whose idle power is the blocking power.")
_PB = typer.Option(None, "--blocking-power-w", help="Blocking power (W), instead of --gpu.")
_MODEL = typer.Option(None, "--model", help="Zoo model name or model file (model mode).")
_CLUSTER = typer.Option(None, "--cluster", help="Cluster spec, e.g. 8xA100-SXM4-80GB.")
_PP = typer.Option(1, "--pp", help="Pipeline stages (model mode).")
_TP = typer.Option(1, "--tp", help="Tensor-parallel degree (model mode).")
_DP = typer.Option(1, "--dp", help="Data-parallel degree (model mode).")
_MBS = typer.Option(1, "--micro-batch-size", help="Samples per micro-batch (model mode).")
_UNIT = typer.Option(1e-3, "--unit-s", help="Time quantum of the crashing steps (s); default "
                     "1e-3 (Perseus/Lowtime's 1 ms). The steps grow as 1/unit: a larger unit "
                     "is proportionally faster and coarser.")
_OUT = typer.Option(None, "--out", help="Directory for plans.json and frontier.html.")
_FORCE = typer.Option(False, "--force", help="Overwrite existing outputs.")
_JSON = typer.Option(False, "--json", help="Print one JSON object.")


#: Fastest frontier plans tried (as is and tightened) for the lowered no-slowdown plan.
LOWERED_CANDIDATES: int = 8

#: Crashing work (steps × DAG instructions) above which `frontier`/`pick` print a hint to use a
#: larger --unit-s: each step is a max flow over the DAG, about 2·10^6 instruction-steps per
#: second on one core (2 stages × 3000 micro-batches, 1.4·10^8 of them: about a minute).
LARGE_WORK: float = 5e7

#: Plan files written in model mode: summary key -> file name.
PLAN_FILES: dict[str, str] = {"all_max": "plan_all_max.json",
                              "no_slowdown": "plan_no_slowdown.json"}


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _load(profile: Path | None, microbatches: int | None, gpu: str | None,
          blocking_power_w: float | None, model: str | None, cluster: str | None, pp: int,
          tp: int, dp: int, micro_batch_size: int) -> Any:
    """Build the instruction DAG from either input mode."""
    from trainsim.search.energy_dag import build_dag
    from trainsim.search.energy_profile import (
        blocking_power_of,
        load_perseus_csv,
        profile_from_model,
    )
    if (profile is None) == (model is None):
        raise SpecError("give either --profile CSV (with --microbatches) or --model with "
                        "--cluster and plan flags")
    if microbatches is None:
        raise SpecError("--microbatches is required")
    if profile is not None:
        if (gpu is None) == (blocking_power_w is None):
            raise SpecError("give exactly one of --gpu TYPE and --blocking-power-w W with "
                            "--profile")
        power = blocking_power_w if blocking_power_w is not None else blocking_power_of(gpu)
        prof = load_perseus_csv(profile, blocking_power_w=float(power))
    else:
        if cluster is None:
            raise SpecError("--model needs --cluster")
        plan = {"pp": pp, "tp": tp, "dp": dp, "micro_batch_size": micro_batch_size,
                "num_micro_batches": microbatches, "schedule": "1f1b"}
        prof = profile_from_model(model, cluster, plan)
        if blocking_power_w is not None:
            from dataclasses import replace
            prof = replace(prof, blocking_power_w=float(blocking_power_w))
    return build_dag(prof, microbatches)


def _check_out(out: Path | None, force: bool) -> None:
    if out is None:
        return
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {str(out)!r} is an existing file; give a folder for "
                        f"plans.json and frontier.html")
    for name in ("plans.json", "frontier.html", *PLAN_FILES.values()):
        if (out / name).exists() and not force:
            raise SpecError(f"{out / name} exists; pass --force to overwrite it")


def _plan_json(dag: Any, point: Any) -> dict[str, Any]:
    ranks = []
    for s, nodes in enumerate(dag.stage_order):
        ranks.append({"rank": s, "instructions": [dag.label(i) for i in nodes],
                      "freq_mhz": [float(point.freq_mhz[i]) for i in nodes]})
    return {"time_s": point.time_s, "energy_j": point.energy_j, "ranks": ranks}


def _dumps(doc: Any, indent: int | None = None) -> str:
    """Strict JSON: a non-finite number (never expected: inputs are checked) becomes null
    rather than the invalid tokens NaN/Infinity."""
    import math

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(doc), indent=indent, allow_nan=False)


def _hint(steps: int, nodes: int, unit_s: float) -> str | None:
    """One line suggesting a larger --unit-s when the crashing work is large, else None."""
    if steps * nodes <= LARGE_WORK:
        return None
    return (f"hint: about {steps} crashing steps over {nodes} instructions (may take "
            f"minutes); a larger --unit-s (now {unit_s:g} s) needs proportionally fewer steps")


def _compute_with_progress(dag: Any, unit_s: float) -> Any:
    """`compute_frontier` with a rich progress bar on stderr (crashing steps as the total)
    and, for a large DAG × step count, a hint line on stderr before the work starts."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from trainsim.search.energy_frontier import compute_frontier

    console = Console(stderr=True)
    with Progress(TextColumn("frontier"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("steps"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        job = bar.add_task("crash", total=None)

        def tick(step: Any) -> None:
            if step.iteration == 0:
                total = max(step.makespan_units - step.final_makespan_units, 1)
                hint = _hint(total, dag.num_nodes, unit_s)
                if hint is not None:
                    typer.echo(hint, err=True)
                bar.update(job, total=total)
            bar.update(job, completed=step.iteration)

        return compute_frontier(dag, unit_s=unit_s, on_step=tick)


def _run_frontier(dag: Any, unit_s: float) -> dict[str, Any]:
    from trainsim.search.energy_baselines import all_baselines
    from trainsim.search.energy_straggler import intrinsic_saving
    if not (unit_s > 0 and unit_s < float("inf")):
        raise SpecError(f"--unit-s {unit_s!r} must be a finite number of seconds > 0")
    fr = _compute_with_progress(dag, unit_s)
    baselines = all_baselines(dag, unit_s=unit_s)
    top = baselines[0].point
    intrinsic = intrinsic_saving(fr.points, top, blocking_power_w=dag.profile.blocking_power_w,
                                 num_stages=dag.num_stages)
    return {"frontier": fr, "baselines": baselines, "all_max": top, "intrinsic": intrinsic}


def _write(out: Path, dag: Any, res: dict[str, Any], chosen: Any, extra: dict[str, Any]) -> None:
    from trainsim.search.energy_plot import frontier_figure, write_html
    out.mkdir(parents=True, exist_ok=True)
    doc = {"source": dag.profile.source, "num_stages": dag.num_stages,
           "num_micro_batches": dag.num_micro_batches,
           "blocking_power_w": dag.profile.blocking_power_w, **extra,
           "plans": [_plan_json(dag, p) for p in res["frontier"].points]}
    (out / "plans.json").write_text(_dumps(doc, indent=1) + "\n")
    fig = frontier_figure(dag, res["frontier"].points, res["baselines"], chosen,
                          title=f"{Path(dag.profile.source).name}, "
                                f"{dag.num_micro_batches} micro-batches")
    write_html(fig, str(out / "frontier.html"))


def _summary(dag: Any, res: dict[str, Any]) -> dict[str, Any]:
    top = res["all_max"]
    return {
        "source": dag.profile.source, "num_stages": dag.num_stages,
        "num_micro_batches": dag.num_micro_batches,
        "blocking_power_w": dag.profile.blocking_power_w,
        "all_max": {"time_s": top.time_s, "energy_j": top.energy_j},
        "frontier": [{"time_s": p.time_s, "energy_j": p.energy_j}
                     for p in res["frontier"].points],
        "intrinsic_saving": res["intrinsic"].saving,
        "intrinsic": _intrinsic_json(res["intrinsic"]),
        "baselines": {b.name: {"time_s": b.point.time_s, "energy_j": b.point.energy_j}
                      for b in res["baselines"]},
        "planner_s": res["frontier"].planner_s,
    }


def _intrinsic_json(intrinsic: Any) -> dict[str, Any]:
    """The intrinsic saving's parts: the fastest plan, the all-max energy over its time, and
    the saving at the all-max time for comparison."""
    return {"fastest_time_s": intrinsic.time_s, "fastest_energy_j": intrinsic.point.energy_j,
            "all_max_energy_at_fastest_j": intrinsic.all_max_energy_at_fastest_j,
            "saving": intrinsic.saving,
            "saving_at_all_max_time": intrinsic.saving_at_all_max_time}


def _pick_json(choice: Any) -> dict[str, Any]:
    """One straggler pick without its plan: T′, the plan's time, energies, saving."""
    return {"slowdown": choice.slowdown, "deadline_s": choice.deadline_s,
            "time_s": choice.point.time_s, "energy_j": choice.energy_j,
            "all_max_energy_j": choice.all_max_energy_j, "saving": choice.saving}


def _lowered(dag: Any, res: dict[str, Any]) -> dict[str, Any] | None:
    """Model mode: the all-max plan and the lowest-energy plan no slower than it, both as
    `lower()` runs them (predicted with its transfers and optimizer step, and simulated).
    The no-slowdown plan is picked under that prediction (`energy_lowered.no_slowdown`):
    transfer delays can lengthen a plan whose instruction DAG ties the all-max time. None for a
    profile CSV."""
    import numpy as np

    from trainsim.search.energy_lowered import (
        LoweredExtras,
        all_max_freq,
        frequency_plan,
        no_slowdown,
        replay_lowered,
    )
    from trainsim.workloads.lowering import lower
    meta = dag.profile.metadata
    if "plan" not in meta:
        return None
    spec, hw, plan = meta["model_spec"], meta["cluster"], meta["plan"]
    top_freq = all_max_freq(dag)
    try:
        extras = LoweredExtras.from_program(
            dag, lower(spec, hw, frequency_plan(dag, top_freq, plan)))
    except SpecError as exc:
        return {"note": str(exc)}
    fastest = [p.freq_mhz for p in res["frontier"].points[::-1][:LOWERED_CANDIDATES]]
    chosen = {"all_max": top_freq, "no_slowdown": no_slowdown(dag, fastest, extras)}
    out: dict[str, Any] = {}
    for key, freq in chosen.items():
        check, _ = replay_lowered(dag, np.asarray(freq), spec, hw, plan, extras=extras,
                                  check=False)
        out[key] = {"predicted_time_s": check.predicted_time_s,
                    "predicted_energy_j": check.predicted_energy_j,
                    "simulated_time_s": check.replayed_time_s,
                    "simulated_energy_j": check.replayed_energy_j,
                    "plan": frequency_plan(dag, freq, plan)}
    out["saving"] = 1.0 - (out["no_slowdown"]["simulated_energy_j"]
                           / out["all_max"]["simulated_energy_j"])
    return out


def _lowered_json(lowered: dict[str, Any] | None) -> dict[str, Any] | None:
    if lowered is None or "note" in lowered:
        return lowered
    return {k: ({f: v for f, v in d.items() if f != "plan"} if isinstance(d, dict) else d)
            for k, d in lowered.items()}


def _write_plans(out: Path, lowered: dict[str, Any] | None) -> None:
    """Model mode: the lowered plans as ParallelPlan JSON (existing files were refused up
    front by `_check_out` unless --force)."""
    if lowered is None or "note" in lowered:
        return
    for key, name in PLAN_FILES.items():
        lowered[key]["plan"].save(out / name, force=True)


@app.command("frontier")
def frontier_command(profile: Path = _PROFILE, microbatches: int = _MB, gpu: str = _GPU,
                     blocking_power_w: float = _PB, model: str = _MODEL, cluster: str = _CLUSTER,
                     pp: int = _PP, tp: int = _TP, dp: int = _DP,
                     micro_batch_size: int = _MBS, unit_s: float = _UNIT, out: Path = _OUT,
                     force: bool = _FORCE, as_json: bool = _JSON) -> None:
    """Every frequency plan on the iteration time–energy frontier, with baselines."""
    try:
        _check_out(out, force)
        dag = _load(profile, microbatches, gpu, blocking_power_w, model, cluster, pp, tp, dp,
                    micro_batch_size)
        res = _run_frontier(dag, unit_s)
        summary = _summary(dag, res)
        lowered = _lowered(dag, res)
        if lowered is not None:
            summary["lowered"] = _lowered_json(lowered)
        if out is not None:
            chosen = min(res["frontier"].points, key=lambda p: (p.time_s, p.energy_j))
            _write(out, dag, res, chosen, {"all_max": summary["all_max"]})
            _write_plans(out, lowered)
    except TrainsimError as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(_dumps(summary))
        return
    top = res["all_max"]
    typer.echo(f"{dag.num_stages} stages x {dag.num_micro_batches} micro-batches, "
               f"{len(summary['frontier'])} frontier plans in {summary['planner_s']:.2f} s")
    intr = res["intrinsic"]
    typer.echo(f"all-max: {top.time_s:.4f} s {top.energy_j:.1f} J; intrinsic saving "
               f"{intr.saving:.1%} (fastest plan {intr.time_s:.4f} s vs all-max over that "
               f"time; {intr.saving_at_all_max_time:.1%} at the all-max time)")
    for name, b in summary["baselines"].items():
        typer.echo(f"  {name:13s} {b['time_s']:.4f} s {b['energy_j']:.1f} J")
    low = summary.get("lowered")
    if low and "note" not in low:
        for key in PLAN_FILES:
            d = low[key]
            typer.echo(f"lowered {key}: predicted {d['predicted_time_s']:.6f} s "
                       f"{d['predicted_energy_j']:.3f} J, simulated {d['simulated_time_s']:.6f} "
                       f"s {d['simulated_energy_j']:.3f} J")
        typer.echo(f"lowered saving at no slowdown {low['saving']:.1%}")
    elif low:
        typer.echo(f"lowered: {low['note']}")


@app.command("pick")
def pick_command(straggler: float = typer.Option(None, "--straggler",
                                                 help="Slowdown factor T'/T_allmax (>= 1)."),
                 deadline_s: float = typer.Option(None, "--deadline-s",
                                                  help="Straggler's iteration time T' (s)."),
                 straggler_table: bool = typer.Option(
                     False, "--straggler-table",
                     help="Also list the saving vs all-max for slowdowns 1.0, 1.1, ..., 1.5 "
                          "(alone: the table only)."),
                 profile: Path = _PROFILE, microbatches: int = _MB, gpu: str = _GPU,
                 blocking_power_w: float = _PB, model: str = _MODEL, cluster: str = _CLUSTER,
                 pp: int = _PP, tp: int = _TP, dp: int = _DP,
                 micro_batch_size: int = _MBS, unit_s: float = _UNIT, out: Path = _OUT,
                 force: bool = _FORCE, as_json: bool = _JSON) -> None:
    """The lowest-energy plan that finishes by a straggler's iteration time.

    With --straggler-table, also the saving vs all-max at T' = 1.0, 1.1, ..., 1.5 × T_allmax
    (JSON key `straggler_table`); alone, the table replaces the single pick.
    """
    from trainsim.search.energy_straggler import pick, savings_table
    try:
        if not straggler_table and straggler is None and deadline_s is None:
            raise SpecError("give --straggler (slowdown factor), --deadline-s or "
                            "--straggler-table")
        _check_out(out, force)
        dag = _load(profile, microbatches, gpu, blocking_power_w, model, cluster, pp, tp, dp,
                    micro_batch_size)
        res = _run_frontier(dag, unit_s)
        kw = {"blocking_power_w": dag.profile.blocking_power_w, "num_stages": dag.num_stages}
        choice = None
        if straggler is not None or deadline_s is not None:
            choice = pick(res["frontier"].points, res["all_max"], slowdown=straggler,
                          deadline_s=deadline_s, **kw)
        summary = _summary(dag, res)
        table = None
        if straggler_table:
            table = savings_table(res["frontier"].points, res["all_max"], **kw)
            summary["straggler_table"] = [_pick_json(c) for c in table]
        if choice is not None:
            summary["pick"] = {**_pick_json(choice), "plan": _plan_json(dag, choice.point)}
        if out is not None:
            shown = choice.point if choice is not None else res["intrinsic"].point
            _write(out, dag, res, shown, {k: summary[k] for k in ("pick", "straggler_table")
                                          if k in summary})
    except TrainsimError as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(_dumps(summary))
        return
    if choice is not None:
        typer.echo(f"T' = {choice.deadline_s:.4f} s ({choice.slowdown:.3f} x all-max): plan "
                   f"{choice.point.time_s:.4f} s, {choice.energy_j:.1f} J incl. waiting; "
                   f"all-max {choice.all_max_energy_j:.1f} J; saving {choice.saving:.1%}")
    if table is not None:
        typer.echo("slowdown   T' s       plan s     energy J     all-max J    saving")
        for c in table:
            typer.echo(f"{c.slowdown:8.2f} {c.deadline_s:9.4f} {c.point.time_s:10.4f} "
                       f"{c.energy_j:12.1f} {c.all_max_energy_j:12.1f} {c.saving:8.1%}")
