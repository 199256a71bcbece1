"""`sim simulate`: one iteration of a model on a cluster under a plan, on built-in defaults.

Loads the inputs, calls `trainsim.simulator.simulate` machinery, renders a summary (rich
tables, or one JSON object with `--json`) and writes the requested timeline / Chrome trace.
Files a user already has are never overwritten without `--force`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from trainsim.errors import PlanError, TrainsimError

DEFAULT_MODEL = "gpt3-1.3b"
DEFAULT_CLUSTER = "4xV100-SXM2-32GB"
DEFAULT_GLOBAL_BATCH = 512


def _check_new(path: Path | None, force: bool, what: str) -> None:
    if path is not None and path.exists() and not force:
        raise TrainsimError(f"{what} {str(path)!r} exists; pass --force to overwrite it")


def _cpu_processes(spec: str) -> int:
    text = spec.split(":", 1)[1]
    if not text.isdigit() or int(text) < 1:
        raise TrainsimError(f"cluster {spec!r}: expected cpu:N with N processes, e.g. cpu:2")
    return int(text)


def default_degrees(gpus: int, blocks: int, dp: int | None, tp: int | None,
                    pp: int | None) -> tuple[int, int, int]:
    """Fill unset degrees: with none given, a pipeline over every GPU when the model has enough
    layers (else data parallelism); otherwise tp and pp default to 1 and dp takes the rest."""
    for flag, value in (("--dp", dp), ("--tp", tp), ("--pp", pp)):
        if value is not None and value < 1:
            raise PlanError(f"{flag}={value} must be a positive integer")
    if dp is None and tp is None and pp is None:
        if 1 < gpus <= blocks:
            return 1, 1, gpus
        return gpus, 1, 1
    tp = 1 if tp is None else tp
    pp = 1 if pp is None else pp
    if dp is None:
        if gpus % (tp * pp):
            raise PlanError(f"plan tp×pp = {tp}×{pp} does not divide the cluster's {gpus} GPUs; "
                            f"give --dp or change --tp/--pp")
        dp = gpus // (tp * pp)
    return dp, tp, pp


def simulate_command(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m",
                              help="Zoo name, model YAML, or Hugging Face config.json."),
    cluster: str = typer.Option(DEFAULT_CLUSTER, "--cluster", "-c",
                                help="Cluster spec (e.g. 2x8xA100-SXM4-80GB), YAML file, or "
                                "cpu:N (N local processes; needs --profile)."),
    plan_file: Path | None = typer.Option(None, "--plan", help="ParallelPlan JSON file; flags "
                                          "given on the command line override its fields."),
    dp: int | None = typer.Option(None, "--dp", help="Data-parallel degree."),
    tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel degree."),
    pp: int | None = typer.Option(None, "--pp", help="Pipeline-parallel degree."),
    sp: bool | None = typer.Option(None, "--sp/--no-sp", help="Sequence parallelism."),
    micro_batch: int | None = typer.Option(None, "--micro-batch", help="Micro-batch size."),
    global_batch: int | None = typer.Option(None, "--global-batch",
                                            help=f"Global batch (default {DEFAULT_GLOBAL_BATCH})."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Sequence length."),
    schedule: str | None = typer.Option(None, "--schedule", help="gpipe, 1f1b, interleaved, "
                                        "zb-h1, or torch:<ScheduleClass>."),
    virtual_stages: int | None = typer.Option(None, "--virtual-stages",
                                              help="Model chunks per pipeline rank."),
    recompute: str | None = typer.Option(None, "--recompute",
                                         help="none, selective, full, or op1,op2,..."),
    zero: int | None = typer.Option(None, "--zero", help="ZeRO stage 0-3."),
    freq_mhz: float | None = typer.Option(None, "--freq-mhz", help="SM clock for every GPU."),
    profile: Path | None = typer.Option(None, "--profile", help="Profile database from `sim "
                                        "profile`: measured op costs replace the roofline."),
    engine: str = typer.Option("numba", "--engine",
                              help="Engine: numba (fast, default) or simpy (reference)."),
    unfold: bool = typer.Option(False, "--unfold", help="Simulate every GPU as its own rank."),
    timeline: Path | None = typer.Option(None, "--timeline", help="Write an HTML timeline."),
    trace: Path | None = typer.Option(None, "--trace", help="Write a Chrome/Perfetto trace."),
    save_plan: Path | None = typer.Option(None, "--save-plan", help="Write the plan as JSON."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Simulate one training iteration and report time, throughput, memory and energy."""
    from rich.console import Console

    from trainsim.simulator.simulate import resolve_cluster, resolve_model
    from trainsim.workloads.lowering import LoweringOptions, lower
    from trainsim.workloads.plan import ParallelPlan

    for path, what in ((timeline, "timeline"), (trace, "trace"), (save_plan, "plan file")):
        _check_new(path, force, what)
    console = Console(stderr=True, quiet=as_json or not sys.stderr.isatty())
    cost = None
    with console.status("resolving model and cluster..."):
        spec = resolve_model(model)
        if profile is not None:
            from trainsim.validate.profiled_cost import load_cost_model
            cost = load_cost_model(profile)
        if cluster.startswith("cpu:") and cost is None:
            raise TrainsimError(f"--cluster {cluster} describes this machine from a profile "
                                f"database: give --profile DB (from `sim profile`)")
        if cluster.startswith("cpu:"):
            # The local machine as a cluster of N processes, described by the profile.
            from trainsim.validate.cpu_hardware import cpu_cluster
            hw = cpu_cluster(cost.db, _cpu_processes(cluster))
        else:
            hw = resolve_cluster(cluster)
    fields: dict[str, Any] = ParallelPlan.load(plan_file).to_dict() if plan_file else {}
    given = {"dp": dp, "tp": tp, "pp": pp, "sp": sp, "micro_batch_size": micro_batch,
             "global_batch": global_batch, "seq_len": seq_len, "schedule": schedule,
             "virtual_stages": virtual_stages, "zero": zero, "freq_mhz": freq_mhz}
    if recompute is not None:
        given["recompute"] = recompute if recompute in ("none", "selective", "full") \
            else [r.strip() for r in recompute.split(",") if r.strip()]
    if not plan_file:
        blocks = int(getattr(spec, "num_blocks", 0) or spec.num_layers)
        given["dp"], given["tp"], given["pp"] = default_degrees(hw.num_gpus, blocks, dp, tp, pp)
        if global_batch is None:
            given["global_batch"] = DEFAULT_GLOBAL_BATCH
    for key, value in given.items():
        if value is not None:
            fields[key] = value
    if plan_file and any(given[k] is not None for k in ("global_batch", "micro_batch_size",
                                                          "dp")):
        fields["num_micro_batches"] = None  # re-derived from the overriding batch fields
    plan = ParallelPlan.build(spec, hw, **fields)
    with console.status(f"lowering {spec.name} on {hw.num_gpus} GPUs..."):
        program = lower(spec, hw, plan, LoweringOptions(fold=not unfold, cost_model=cost))
    result = _run_with_progress(program, engine, console)
    if save_plan:
        plan.save(save_plan, force=force)
    if timeline:
        from trainsim.simulator.timeline_plot import write_timeline_html
        with console.status("drawing the timeline..."):
            write_timeline_html(result, timeline)
    if trace:
        from trainsim.simulator.chrome_trace import write_chrome_trace
        write_chrome_trace(result, trace)
    if as_json:
        out = {"model": spec.name, "cluster": cluster, "engine": engine,
               "plan": plan.to_dict(), **result.to_summary_dict()}
        typer.echo(json.dumps(out, indent=2, allow_nan=False))
        return
    _render(result, spec.name, cluster, plan, timeline, trace)


def _run_with_progress(program: Any, engine: str, console: Any) -> Any:
    """Run the program, with a progress bar on stderr when it is big enough to wait for."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from trainsim.simulator.simulate import run_program

    if program.num_tasks < 50_000 or console.quiet:
        return run_program(program, engine=engine)
    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed:,}/"
                  "{task.total:,} tasks"), TimeElapsedColumn(), console=console) as bar:
        job = bar.add_task("simulate", total=program.num_tasks)
        return run_program(program, engine=engine,
                           on_progress=lambda done, total: bar.update(job, completed=done))


def _render(result: Any, model: str, cluster: str, plan: Any, timeline: Path | None,
            trace: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    s = result.to_summary_dict()
    head = Table(title=f"{model} on {cluster}: dp={plan.dp} tp={plan.tp} pp={plan.pp} "
                       f"mb={plan.micro_batch_size}×{plan.num_micro_batches} {plan.schedule} "
                       f"recompute={plan.recompute} zero={plan.zero}", show_header=False)
    head.add_column("metric")
    head.add_column("value", justify="right")
    rows = [("iteration time", f"{s['iteration_time_s']:.4g} s"),
            ("throughput", f"{s['samples_per_s']:.4g} samples/s, {s['tokens_per_s']:.4g} tokens/s"),
            ("model FLOPs utilisation", f"{100 * s['mfu']:.1f} %" if s["mfu"] else "-"),
            ("compute idle: bubble + waits (max rank)", f"{100 * s['bubble_fraction']:.1f} %"),
            ("peak memory (max rank)", f"{s['peak_memory_bytes'] / 2**30:.2f} GiB"
             + ("  [red]OOM[/red]" if s["oom"] else "")),
            ("energy per iteration", f"{s['energy_j'] / 1e3:.4g} kJ"),
            ("tasks / program ranks / GPUs",
             f"{s['num_tasks']} / {s['num_ranks']} / {s['num_physical_ranks']}")]
    price = result.program.metadata.get("price_per_hour_usd")
    if price:
        rows.append(("cost per iteration", f"${price * s['iteration_time_s'] / 3600:.4g}"))
    for k, v in rows:
        head.add_row(k, v)
    console.print(head)
    ranks = Table(title="per rank")
    for col in ("rank", "GPUs", "busy s", "bubble %", "peak GiB", "energy kJ", "OOM"):
        ranks.add_column(col, justify="right")
    rows: list[tuple[int, int, tuple[str, ...]]] = []
    for r in result.ranks:  # consecutive identical ranks share one row ("0-63")
        cells = (str(len(r.represents)), f"{r.busy_s:.3f}", f"{100 * r.bubble_fraction:.1f}",
                 f"{r.peak_memory_bytes / 2**30:.2f}", f"{r.energy_j / 1e3:.3g}",
                 "yes" if r.oom else "")
        if rows and rows[-1][2] == cells and rows[-1][1] == r.rank - 1:
            rows[-1] = (rows[-1][0], r.rank, cells)
        else:
            rows.append((r.rank, r.rank, cells))
    for first, last, cells in rows:
        ranks.add_row(str(first) if first == last else f"{first}-{last}", *cells)
    console.print(ranks)
    for path, what in ((timeline, "timeline"), (trace, "Chrome trace")):
        if path:
            console.print(f"wrote {what}: {path}")
