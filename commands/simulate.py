"""`sim simulate`: one iteration of a model on a cluster under a plan, on built-in defaults.

Resolves the inputs through `trainsim.api`, simulates, renders a summary (rich tables, or one
JSON object with `--json`) and writes the requested timeline / Chrome trace. Files a user
already has are never overwritten without `--force`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from trainsim import api
from trainsim.commands.output import check_new_file, echo_json, stderr_console, user_errors
from trainsim.errors import PlanError, SpecError
from trainsim.search.hetero.objectives import parse_prices, with_prices
from trainsim.simulator.chrome_trace import write_chrome_trace
from trainsim.simulator.result import SimResult
from trainsim.simulator.timeline_groups import (
    RankSelection,
    check_rank,
    default_trace_groups,
)
from trainsim.simulator.timeline_plot import write_timeline_html
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.plan_defaults import DEFAULT_GLOBAL_BATCH

DEFAULT_MODEL = "gpt3-1.3b"
DEFAULT_CLUSTER = "4xV100-SXM2-32GB"

VISION_FAMILIES = frozenset({"wresnet"})
"""Model families whose samples are images (no tokens)."""

EXIT_OOM = 3
"""Exit code of a run whose plan does not fit in memory (2 is bad input)."""

PROGRESS_MIN_TASKS = 50_000
"""Programs at least this big draw a progress bar while they run."""


@user_errors
def simulate_command(
    model: str | None = typer.Option(None, "--model", "-m",
                                     help=f"Zoo name, model YAML, or Hugging Face config.json "
                                     f"(default: the --plan file's, else {DEFAULT_MODEL})."),
    cluster: str | None = typer.Option(None, "--cluster", "-c",
                                       help="Cluster spec (e.g. 2x8xA100-SXM4-80GB), YAML file, "
                                       "or cpu:N (N local processes, described by --profile or "
                                       "the packaged reference profile; default: the --plan "
                                       f"file's, else {DEFAULT_CLUSTER})."),
    plan_file: Path | None = typer.Option(None, "--plan", help="Saved plan file (--save-plan, "
                                          "sim search/energy --out): it names its model and "
                                          "cluster; flags given beside it override its fields "
                                          "(each override is printed)."),
    dp: int | None = typer.Option(None, "--dp", help="Data-parallel degree."),
    tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel degree."),
    pp: int | None = typer.Option(None, "--pp", help="Pipeline-parallel degree."),
    sp: bool | None = typer.Option(None, "--sp/--no-sp", help="Sequence parallelism."),
    cp: int | None = typer.Option(None, "--cp", help="Context parallelism: each sequence split "
                                  "over CP GPUs (ring attention); GPUs = dp x cp x tp x pp."),
    ep: int | None = typer.Option(None, "--ep", help="Expert-parallel degree (MoE models: "
                                  "experts split across data-parallel ranks, all-to-all)."),
    micro_batch: int | None = typer.Option(None, "--micro-batch", help="Micro-batch size."),
    global_batch: int | None = typer.Option(None, "--global-batch",
                                            help=f"Global batch (default {DEFAULT_GLOBAL_BATCH})."),
    dp_batch_split: str | None = typer.Option(
        None, "--dp-batch-split", help="Samples of each data-parallel replica per iteration, "
        "e.g. 12,12,4,4 (sums to --global-batch; heterogeneous clusters give faster GPUs more)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Sequence length."),
    schedule: str | None = typer.Option(None, "--schedule", help="gpipe, 1f1b, interleaved, "
                                        "zb-h1, or torch:<ScheduleClass>."),
    virtual_stages: int | None = typer.Option(None, "--virtual-stages",
                                              help="Model chunks per pipeline rank."),
    recompute: str | None = typer.Option(None, "--recompute",
                                         help="none, selective, full, or op1,op2,..."),
    zero: int | None = typer.Option(None, "--zero", help="ZeRO stage 0-3."),
    freq_mhz: float | None = typer.Option(None, "--freq-mhz", help="SM clock for every GPU."),
    dtype: str | None = typer.Option(None, "--dtype", help="Compute precision: fp16, bf16, "
                                     "fp8 (FP8 linear layers, rest BF16; Hopper), tf32 or fp32 "
                                     "[default: the plan's, fp16]."),
    framework: str | None = typer.Option(None, "--framework", help="Framework profile: "
                                         "megatron, nemo, deepspeed, torchtitan, hf-eager or "
                                         "default (sets the attention kernel and, with --tp > 1 "
                                         "and no --sp/--no-sp, sequence parallelism; "
                                         "workloads/data/frameworks.yaml)."),
    attention: str | None = typer.Option(None, "--attention", help="Attention kernel: flash "
                                         "(fused, no s² activations) or eager (unfused) "
                                         "[default: the framework's, flash]."),
    profile: Path | None = typer.Option(None, "--profile", help="Profile database from `sim "
                                        "profile`: measured op costs replace the roofline."),
    engine: str = typer.Option("numba", "--engine",
                              help="Engine: numba (fast, default) or simpy (reference)."),
    unfold: bool = typer.Option(False, "--unfold", help="Simulate every GPU as its own rank."),
    overlap_grad_reduce: bool | None = typer.Option(
        None, "--overlap-grad-reduce/--no-overlap-grad-reduce",
        help="Reduce gradient buckets behind the backward (DDP/FSDP default, Megatron's "
             "--overlap-grad-reduce) or after it [default: the --framework's; on without "
             "one]."),
    reshard_after_forward: bool | None = typer.Option(
        None, "--reshard-after-forward/--no-reshard-after-forward",
        help="ZeRO-3/FSDP: free gathered parameters after each pass (default) or keep them, "
             "and the unsharded gradients, for the whole step (torchtitan with --pp > 1)."),
    tp_comm_overlap: bool | None = typer.Option(
        None, "--tp-comm-overlap/--no-tp-comm-overlap",
        help="Run tensor-parallel collectives behind compute (Megatron's --tp-comm-overlap, "
             "torchtitan's AsyncTP) instead of between the GEMMs [default: off]."),
    overlap_param_gather: bool | None = typer.Option(
        None, "--overlap-param-gather/--no-overlap-param-gather",
        help="ZeRO-1/2: gather the updated parameters behind the next forward, only the first "
             "bucket exposed (Megatron's --overlap-param-gather) [default: the framework's, "
             "off]."),
    calibration: Path | None = typer.Option(None, "--calibration", help="Calibration file "
                                            "from `sim calibrate`: its fitted coefficients "
                                            "replace the catalog's (roofline runs)."),
    timeline: Path | None = typer.Option(None, "--timeline", help="Write an HTML timeline."),
    trace: Path | None = typer.Option(None, "--trace", help="Write a Chrome/Perfetto trace."),
    timeline_rank: int | None = typer.Option(
        None, "--timeline-rank", help="GPU rank whose own rows the --timeline draws in full "
        "beside the grouped rows (runs of more than 32 ranks draw one row set per stage group)."),
    trace_ranks: str | None = typer.Option(
        None, "--trace-ranks", help="Ranks the --trace keeps: all, or e.g. 0,8,16-31 or stage:0 "
        "[default: all up to 32 ranks, else one representative rank per stage group]."),
    save_plan: Path | None = typer.Option(None, "--save-plan", help="Write the plan as JSON."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    max_tasks: int = typer.Option(api.DEFAULT_MAX_TASKS, "--max-tasks", min=1,
                                  help="Refuse a run estimated to simulate more tasks than this "
                                  "(checked before the work starts)."),
    allow_oom: bool = typer.Option(False, "--allow-oom", help="Exit 0 even when the plan does "
                                   "not fit in memory (default: report it and exit 3)."),
    price: list[str] | None = typer.Option(None, "--price", help="GPU=USD per GPU-hour, "
                                           "overriding the catalog (repeatable), e.g. --price "
                                           "A10=1.5 [default: the --plan file's prices, which "
                                           "sim search --price records, else the catalog's]."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Simulate one training iteration and report time, throughput, memory and energy.

    Exit codes: 0 ok, 2 bad input, 3 the plan does not fit in memory (after the report).
    """
    for path, what in ((timeline, "--timeline"), (trace, "--trace"), (save_plan, "--save-plan")):
        check_new_file(path, force, what)
    trace_selection = _rank_options(timeline, timeline_rank, trace, trace_ranks)
    console = stderr_console(quiet=as_json)
    saved = api.read_plan(plan_file) if plan_file is not None else None
    model = model or (saved and saved.model) or DEFAULT_MODEL
    cluster = cluster or (saved and saved.cluster) or DEFAULT_CLUSTER
    if saved is not None and framework is not None and saved.framework not in (None, framework):
        typer.echo(f"override: --framework {framework} (plan file: {saved.framework})", err=True)
    framework = framework or (saved and saved.framework) or None
    prices = _prices(saved, parse_prices(price))
    given = {"dp": dp, "tp": tp, "pp": pp, "sp": sp, "cp": cp, "ep": ep, "micro_batch_size": micro_batch,
             "global_batch": global_batch, "seq_len": seq_len, "schedule": schedule,
             "virtual_stages": virtual_stages, "zero": zero, "freq_mhz": freq_mhz,
             "recompute": recompute, "dp_batch_split": _split(dp_batch_split),
             "overlap_grad_reduce": overlap_grad_reduce, "tp_comm_overlap": tp_comm_overlap,
             "reshard_after_forward": reshard_after_forward,
             "overlap_param_gather": overlap_param_gather, "dtype": dtype}
    if saved is not None:
        _print_overrides(saved, model, cluster, given)
    if calibration is not None and profile is not None:
        raise SpecError("give --profile (measured op times) or --calibration (fitted roofline "
                        "coefficients), not both")
    options = (None if calibration is None else
               api.calibration_options(calibration, unfold=unfold))
    with console.status("resolving model and cluster..."):
        cost = api.cost_model_for(cluster, profile)
        spec = api.load_model(model)
        hw = with_prices(api.load_cluster(cluster, profile=cost), prices)
    plan = api.make_plan(spec, hw, None if saved is None else saved.fields, **given,
                         framework=framework, attention=attention)
    if global_batch is None and saved is None and plan.global_batch != DEFAULT_GLOBAL_BATCH:
        typer.echo(f"note: global batch {plan.global_batch}: the default "
                   f"{DEFAULT_GLOBAL_BATCH} rounded to a multiple of dp × micro-batch = "
                   f"{plan.dp} × {plan.micro_batch_size}; give --global-batch to choose", err=True)
    if timeline_rank is not None:
        check_rank(timeline_rank, plan.gpus)
    if trace_selection is not None:
        trace_selection.check(plan.gpus, plan.pp)
    with _progress_bar(console) as on_progress:
        result = api.simulate(spec, hw, plan, engine=engine, profile=cost, unfold=unfold,
                              options=options, framework=framework, attention=attention,
                              on_progress=on_progress, max_tasks=max_tasks)
    if save_plan:
        api.save_plan(plan, save_plan, model=model, cluster=cluster, framework=framework,
                      prices=prices)
    if timeline:
        with console.status("drawing the timeline..."):
            write_timeline_html(result, timeline, focus_rank=timeline_rank)
    if trace:
        _write_trace(result, trace, trace_selection)
    if as_json:
        echo_json({"model": spec.name, "cluster": cluster, "engine": engine,
                   "plan": plan.to_dict(), **result.to_summary_dict()})
    else:
        _render(result, spec.name, cluster, plan, timeline, trace, spec.family)
    if result.oom and not allow_oom:
        typer.echo(f"error: {oom_line(result)}", err=True)
        raise typer.Exit(EXIT_OOM)


def _rank_options(timeline: Path | None, timeline_rank: int | None, trace: Path | None,
                  trace_ranks: str | None) -> RankSelection | None:
    """Check --timeline-rank and --trace-ranks before any work (their ranges once the plan is
    known); return the parsed --trace-ranks."""
    if timeline_rank is not None and timeline is None:
        raise SpecError("--timeline-rank needs --timeline FILE.html")
    if timeline_rank is not None and timeline_rank < 0:
        raise SpecError(f"--timeline-rank {timeline_rank} must be a GPU rank >= 0")
    if trace_ranks is None:
        return None
    if trace is None:
        raise SpecError("--trace-ranks needs --trace FILE.json")
    return RankSelection.parse(trace_ranks)


def _write_trace(result: SimResult, path: Path, selection: RankSelection | None) -> None:
    """The Chrome trace of the chosen ranks; past 32 ranks and none chosen, one representative
    rank per stage group (one stderr line says so)."""
    if selection is not None:
        write_chrome_trace(result, path, ranks=selection.resolve(result))
        return
    groups, line = default_trace_groups(result)
    if groups is None:
        write_chrome_trace(result, path)
    else:
        write_chrome_trace(result, path, ranks=[g.representative for g in groups],
                           notes={g.representative: f"stands for {g.label}, {g.gpus} GPUs"
                                  for g in groups})
    if line:
        typer.echo(line, err=True)


def _split(text: str | None) -> list[int] | None:
    """--dp-batch-split "16,16,8" as [16, 16, 8] (the plan checks the values)."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise PlanError(f"--dp-batch-split={text!r} must be comma-separated sample counts, one "
                        f"per data-parallel replica, e.g. 16,16,8,8") from None


def _prices(saved: api.PlanFile | None, given: dict[str, float]) -> dict[str, float]:
    """The GPU prices of the run: the plan file's (what its search was priced with), each
    --price overriding (printed when it changes the file's)."""
    prices = dict(saved.prices or {}) if saved is not None else {}
    for name, usd in given.items():
        if name in prices and prices[name] != usd:
            typer.echo(f"override: --price {name}={usd:g} (plan file: {prices[name]:g})",
                       err=True)
        prices[name] = usd
    return prices


def _print_overrides(saved: api.PlanFile, model: str, cluster: str,
                     given: dict[str, Any]) -> None:
    """One stderr line per flag that changes what the plan file says."""
    for key, value in (("model", model), ("cluster", cluster)):
        was = getattr(saved, key)
        if was is not None and value != was:
            typer.echo(f"override: --{key} {value} (plan file: {was})", err=True)
    for key, value in given.items():
        if value is not None and saved.fields.get(key) != value:
            flag = "--micro-batch" if key == "micro_batch_size" else "--" + key.replace("_", "-")
            typer.echo(f"override: {flag} {value} (plan file: {saved.fields.get(key)})",
                       err=True)


def oom_line(result: SimResult) -> str:
    """One line naming the first rank over capacity, its need and the capacity."""
    worst = next(r for r in result.ranks if r.oom)
    return (f"plan does not fit in memory: rank {worst.rank} needs "
            f"{worst.peak_memory_bytes / 2**30:.2f} GiB, capacity "
            f"{worst.memory_capacity_bytes / 2**30:.2f} GiB (--allow-oom reports it with exit "
            f"0; --recompute, --zero, more --pp/--tp or a smaller --micro-batch need less)")


@contextmanager
def _progress_bar(console: Console) -> Iterator[Callable[[int, int], None]]:
    """An engine progress callback that draws a bar on stderr, only once the run turns out
    big enough to wait for."""
    bar: list[Progress] = []
    job: list[TaskID] = []

    def update(done: int, total: int) -> None:
        if not bar:
            if total < PROGRESS_MIN_TASKS or console.quiet:
                return
            bar.append(Progress(TextColumn("simulating"), BarColumn(),
                                TextColumn("{task.completed:,}/{task.total:,} tasks"),
                                TimeElapsedColumn(), console=console))
            bar[0].start()
            job.append(bar[0].add_task("simulate", total=total))
        bar[0].update(job[0], completed=done)

    try:
        yield update
    finally:
        if bar:
            bar[0].stop()


def _throughput(summary: dict[str, Any], family: str) -> str:
    """Throughput in the model's units: images/s for vision models, samples and tokens/s for
    language models."""
    if family in VISION_FAMILIES:
        return f"{summary['samples_per_s']:.4g} images/s"
    return f"{summary['samples_per_s']:.4g} samples/s, {summary['tokens_per_s']:.4g} tokens/s"


def _render(result: SimResult, model: str, cluster: str, plan: ParallelPlan,
            timeline: Path | None, trace: Path | None, family: str) -> None:
    console = Console()
    s = result.to_summary_dict()
    head = Table(title=f"{model} on {cluster}: dp={plan.dp} tp={plan.tp} pp={plan.pp} "
                       + (f"cp={plan.cp} " if plan.cp > 1 else "") +
                       f"mb={plan.micro_batch_size}×{plan.num_micro_batches} {plan.schedule} "
                       f"recompute={plan.recompute} zero={plan.zero}", show_header=False)
    head.add_column("metric")
    head.add_column("value", justify="right")
    rows = [("iteration time", f"{s['iteration_time_s']:.4g} s"),
            ("throughput", _throughput(s, family)),
            ("model FLOPs utilisation", f"{100 * s['mfu']:.1f} %" if s["mfu"] else "-"),
            ("compute idle: bubble + waits (max rank)", f"{100 * s['bubble_fraction']:.1f} %"),
            ("peak memory (max rank)", f"{s['peak_memory_bytes'] / 2**30:.2f} GiB"
             + ("  [red]OOM[/red]" if s["oom"] else "")),
            ("energy per iteration", f"{s['energy_j'] / 1e3:.4g} kJ"),
            ("tasks / program ranks / GPUs",
             f"{s['num_tasks']} / {s['num_ranks']} / {s['num_physical_ranks']}")]
    if result.cost_usd:
        rows.append(("cost per iteration", f"${result.cost_usd:.4g}"))
    for k, v in rows:
        head.add_row(k, v)
    console.print(head)
    ranks = Table(title="per rank")
    for col in ("rank", "GPUs", "busy s", "bubble %", "peak GiB", "energy kJ", "OOM"):
        ranks.add_column(col, justify="right")
    spans: list[tuple[int, int, tuple[str, ...]]] = []
    for r in result.ranks:  # consecutive identical ranks share one row ("0-63")
        cells = (str(len(r.represents)), f"{r.busy_s:.3f}", f"{100 * r.bubble_fraction:.1f}",
                 f"{r.peak_memory_bytes / 2**30:.2f}", f"{r.energy_j / 1e3:.3g}",
                 "yes" if r.oom else "")
        if spans and spans[-1][2] == cells and spans[-1][1] == r.rank - 1:
            spans[-1] = (spans[-1][0], r.rank, cells)
        else:
            spans.append((r.rank, r.rank, cells))
    for first, last, shown in spans:
        ranks.add_row(str(first) if first == last else f"{first}-{last}", *shown)
    console.print(ranks)
    for path, what in ((timeline, "timeline"), (trace, "Chrome trace")):
        if path:
            console.print(f"wrote {what}: {path}")
