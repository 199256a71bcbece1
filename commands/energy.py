"""`sim energy ...`: GPU frequency plans on the iteration time–energy frontier (Perseus).

`frontier` computes the frontier, the baselines and the intrinsic saving (Perseus's: the
fastest frontier plan vs all-max over the same time, search/energy/straggler.py); `pick` chooses
the plan for a straggler's iteration time, and `--straggler-table` lists the savings vs all-max
for slowdowns 1.0–1.5. Inputs are a Perseus profile CSV or a model + cluster +
plan costed by trainsim's DVFS model. In model mode the summary adds `lowered`: the all-max and
no-slowdown plans as `lower()` runs them (transfers and optimizer step included,
search/energy/lowered.py), predicted and simulated, and `--out` also writes them as ParallelPlan
JSON files (`plan_all_max.json`, `plan_no_slowdown.json`) that `sim simulate --plan` runs.

This module only parses options, calls `trainsim.api` (which loads the planner,
search/energy/planner.py, on first use: it compiles numba kernels), draws the progress bar and
renders.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from trainsim import api
from trainsim.commands.output import check_out_dir, dumps, user_errors
from trainsim.errors import SpecError
from trainsim.search.energy.outputs import OUTPUT_FILES, PLAN_FILES

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
_CAL = typer.Option(None, "--calibration", help="Calibration file from `sim calibrate` "
                    "(model mode): its fitted DVFS coefficients replace the catalog's.")
_UNIT = typer.Option(None, "--unit-s", help="Time quantum of the crashing steps (s); default "
                     "Perseus/Lowtime's 1 ms, or 5 % of the shortest instruction where that is "
                     "less. The steps grow as 1/unit: a larger unit is proportionally faster "
                     "and coarser.")
_OUT = typer.Option(None, "--out", help="Directory for plans.json and frontier.html.")
_FORCE = typer.Option(False, "--force", help="Overwrite existing outputs.")
_JSON = typer.Option(False, "--json", help="Print one JSON object.")


#: Crashing work (steps × DAG instructions) above which `frontier`/`pick` print a hint to use a
#: larger --unit-s: each step is a max flow over the DAG, about 2·10^6 instruction-steps per
#: second on one core (2 stages × 3000 micro-batches, 1.4·10^8 of them: about a minute).
LARGE_WORK: float = 5e7
WORK_PER_S: float = 2e6
"""Crashing work done per second (LARGE_WORK's measurement)."""
MAX_WORK: float = 7.2e9
"""Crashing work refused before it starts: an hour at `WORK_PER_S`."""


def _dag(profile: Path | None, microbatches: int | None, gpu: str | None,
         blocking_power_w: float | None, model: str | None, cluster: str | None, pp: int,
         tp: int, dp: int, micro_batch_size: int, calibration: Path | None) -> Any:
    return api.energy_dag(microbatches=microbatches, profile=profile, gpu=gpu,
                          blocking_power_w=blocking_power_w, model=model, cluster=cluster,
                          pp=pp, tp=tp, dp=dp, micro_batch_size=micro_batch_size,
                          calibration=calibration)


def _hint(steps: int, nodes: int, unit_s: float) -> str | None:
    """One line suggesting a larger --unit-s when the crashing work is large, else None;
    SpecError (before any step runs) when it would take over an hour (`MAX_WORK`)."""
    work = steps * nodes
    if work <= LARGE_WORK:
        return None
    minutes = work / WORK_PER_S / 60
    if work > MAX_WORK:
        raise SpecError(f"--unit-s {unit_s:g}: about {steps:,} crashing steps over {nodes} "
                        f"instructions, some {minutes:,.0f} minutes of work; give --unit-s "
                        f"{unit_s * work / LARGE_WORK:.2g} or more for well under a minute")
    took = f"about {minutes:.0f} minutes" if minutes >= 1.5 else \
        f"about {work / WORK_PER_S:.0f} seconds"
    return (f"hint: about {steps:,} crashing steps over {nodes} instructions ({took}); a "
            f"larger --unit-s (now {unit_s:g} s) needs proportionally fewer steps")


def _check_work(dag: Any, unit_s: float) -> None:
    """Refuse, before it is set up, crashing work over an hour (`MAX_WORK`) when --unit-s is
    finer than `ESTIMATE_UNIT_S`: such a unit takes minutes to prepare before the first step
    reports its size. At coarser units that first step is cheap, and `_progress`'s first tick
    refuses the same work before any step runs (estimating it here would prepare it twice)."""
    # deferred: start-up time (the energy planner compiles numba kernels at import)
    from trainsim.search.energy.planner import ESTIMATE_UNIT_S, estimate_steps

    if unit_s < ESTIMATE_UNIT_S:
        _hint(estimate_steps(dag, unit_s), dag.num_nodes, unit_s)


@contextmanager
def _progress(num_nodes: int, unit_s: float) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr (crashing steps as the total), as the planner's
    `on_step(steps_done, steps_total)`; for a large DAG × step count, a hint line on stderr
    before the work starts."""
    console = Console(stderr=True)
    with Progress(TextColumn("frontier"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("steps"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        job = bar.add_task("crash", total=None)

        def tick(done: int, total: int) -> None:
            if done == 0:
                hint = _hint(total, num_nodes, unit_s)
                if hint is not None:
                    typer.echo(hint, err=True)
                bar.update(job, total=total)
            bar.update(job, completed=done)

        yield tick


@app.command("frontier")
@user_errors
def frontier_command(profile: Path = _PROFILE, microbatches: int = _MB, gpu: str = _GPU,
                     blocking_power_w: float = _PB, model: str = _MODEL, cluster: str = _CLUSTER,
                     pp: int = _PP, tp: int = _TP, dp: int = _DP,
                     micro_batch_size: int = _MBS, unit_s: float | None = _UNIT,
                     out: Path = _OUT,
                     force: bool = _FORCE, as_json: bool = _JSON,
                     calibration: Path = _CAL) -> None:
    """Every frequency plan on the iteration time–energy frontier, with baselines."""
    check_out_dir(out, OUTPUT_FILES, force)
    dag = _dag(profile, microbatches, gpu, blocking_power_w, model, cluster, pp, tp, dp,
               micro_batch_size, calibration)
    unit_s = api.energy_unit_s(dag, unit_s)
    _check_work(dag, unit_s)
    with _progress(dag.num_nodes, unit_s) as tick:
        res = api.energy_frontier(dag, unit_s=unit_s, out=out, on_step=tick, model=model,
                                  cluster=cluster)
    run, lowered, summary = res["run"], res["lowered"], res["summary"]
    if as_json:
        typer.echo(dumps(summary, indent=None))
        return
    top = run.all_max
    typer.echo(f"{dag.num_stages} stages x {dag.num_micro_batches} micro-batches, "
               f"{len(summary['frontier'])} frontier plans in {summary['planner_s']:.2f} s")
    intr = run.intrinsic
    typer.echo(f"all-max: {top.time_s:.4f} s {top.energy_j:.1f} J; intrinsic saving "
               f"{intr.saving:.1%} (fastest plan {intr.time_s:.4f} s vs all-max over that "
               f"time; {intr.saving_at_all_max_time:.1%} at the all-max time)")
    for name, b in summary["baselines"].items():
        typer.echo(f"  {name:13s} {b['time_s']:.4f} s {b['energy_j']:.1f} J")
    if lowered is not None and lowered.note is None:
        for key in PLAN_FILES:
            d = lowered.plans[key]
            typer.echo(f"lowered {key}: predicted {d.predicted_time_s:.6f} s "
                       f"{d.predicted_energy_j:.3f} J, simulated {d.simulated_time_s:.6f} "
                       f"s {d.simulated_energy_j:.3f} J")
        typer.echo(f"lowered saving at no slowdown {lowered.saving:.1%}")
    elif lowered is not None:
        typer.echo(f"lowered: {lowered.note}")


@app.command("pick")
@user_errors
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
                 micro_batch_size: int = _MBS, unit_s: float | None = _UNIT,
                 out: Path = _OUT,
                 force: bool = _FORCE, as_json: bool = _JSON,
                 calibration: Path = _CAL) -> None:
    """The lowest-energy plan that finishes by a straggler's iteration time.

    With --straggler-table, also the saving vs all-max at T' = 1.0, 1.1, ..., 1.5 × T_allmax
    (JSON key `straggler_table`); alone, the table replaces the single pick.
    """
    check_out_dir(out, OUTPUT_FILES, force)
    if not straggler_table and straggler is None and deadline_s is None:
        raise api.SpecError("give --straggler (slowdown factor), --deadline-s or "
                            "--straggler-table")
    dag = _dag(profile, microbatches, gpu, blocking_power_w, model, cluster, pp, tp, dp,
               micro_batch_size, calibration)
    unit_s = api.energy_unit_s(dag, unit_s)
    _check_work(dag, unit_s)
    with _progress(dag.num_nodes, unit_s) as tick:
        res = api.energy_pick(dag, slowdown=straggler, deadline_s=deadline_s,
                              table=straggler_table, unit_s=unit_s, out=out, on_step=tick)
    choice, table, summary = res["report"].choice, res["report"].table, res["summary"]
    if as_json:
        typer.echo(dumps(summary, indent=None))
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
