"""`sim search`: find a parallel plan with the grid (Megatron-LM) or Aceso planner.

Loads the inputs, runs one planner through `search.planner.run_search` with a progress bar on
stderr, prints a table (or one JSON object with `--json`), and with `--out DIR` writes the best
plan as trainsim JSON, as Aceso's config JSON and — for uniform plans — as Megatron-LM flags,
plus the ranked plans and the search log. Ctrl-C stops the search and reports the best so far.
Existing outputs are never overwritten without `--force`; the files hold no wall-clock figures,
so the same search writes the same bytes. A search in which no candidate fits exits 1 (after
printing the JSON with `best: null` under `--json`) with one line saying why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from trainsim.errors import SpecError

_METHOD = typer.Option("grid", "--method", help="grid (Megatron-LM uniform) or aceso.")
_MODEL = typer.Option(..., "--model", help="Zoo model name or model file.")
_CLUSTER = typer.Option(..., "--cluster", help="Cluster spec, e.g. 4xV100-PCIe-32GB.")
_BATCH = typer.Option(..., "--global-batch", help="Samples per iteration.")
_MEM = typer.Option(None, "--memory-limit-gb", help="Per-GPU memory limit in GB (10^9 bytes); "
                    "the device memory when omitted.")
_BUDGET = typer.Option(60.0, "--time-budget-s", help="Search time budget (s).")
_PROFILE = typer.Option(None, "--profile", help="Op profile: an Aceso profiled-time-* folder or "
                        "a trainsim profile database CSV (default: roofline).")
_OBJ = typer.Option("throughput", "--objective", help="throughput, cost or energy.")
_TOP = typer.Option(5, "--top", help="How many ranked plans to show and keep.")
_OUT = typer.Option(None, "--out", help="Folder for best_plan.json, aceso_config.json, "
                    "megatron_flags.txt, ranked.json and search_log.json.")
_FORCE = typer.Option(False, "--force", help="Overwrite existing outputs.")
_JSON = typer.Option(False, "--json", help="Print one JSON object.")

OUTPUT_FILES = ("best_plan.json", "aceso_config.json", "megatron_flags.txt", "ranked.json",
                "search_log.json")


def lowering_options(profile: Path | None, model: Any) -> Any:
    """LoweringOptions for `--profile`: Aceso folder → measured V100 op times with the tensor-
    parallel collectives already inside them; a CSV → trainsim's profiled cost model."""
    if profile is None:
        return None
    from trainsim.workloads.lowering import LoweringOptions
    if profile.is_dir():
        from trainsim.search.aceso_profile import aceso_lowering_options
        return aceso_lowering_options(profile, model)
    if not profile.is_file():
        raise SpecError(f"--profile {str(profile)!r} is neither a folder nor a file")
    from trainsim.validate.profiled_cost import load_cost_model
    return LoweringOptions(cost_model=load_cost_model(profile))


def search_command(
    method: str = _METHOD, model: str = _MODEL, cluster: str = _CLUSTER,
    global_batch: int = _BATCH, memory_limit_gb: float | None = _MEM,
    time_budget_s: float = _BUDGET, profile: Path | None = _PROFILE,
    objective: str = _OBJ, top: int = _TOP, out: Path | None = _OUT, force: bool = _FORCE,
    as_json: bool = _JSON,
) -> None:
    """Search parallel plans for MODEL on CLUSTER and print the best ones."""
    from trainsim.search.oracle import Oracle
    from trainsim.search.planner import SearchSpec, get_planner

    if out is not None and out.exists() and not out.is_dir():
        raise SpecError(f"--out {str(out)!r} is an existing file; give a folder for "
                        f"{', '.join(OUTPUT_FILES)}")
    if out is not None and not force:
        clash = [n for n in OUTPUT_FILES if (out / n).exists()]
        if clash:
            raise SpecError(f"{out / clash[0]} exists; pass --force to overwrite it")
    planner = get_planner(method)
    spec = SearchSpec(model=model, cluster=cluster, global_batch=global_batch,
                      memory_limit_bytes=None if memory_limit_gb is None
                      else memory_limit_gb * 1e9,
                      time_budget_s=time_budget_s, objective=objective, top_k=top)
    oracle = Oracle(model, cluster)
    oracle.options = lowering_options(profile, oracle.model)
    result = _run_with_progress(planner, spec, oracle, quiet=as_json)
    if out is not None:
        _write(out, result, oracle)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    elif result.ranked:
        _table(result, model, cluster)
    if result.best is None:
        # Not bad input (exit 2): the search ran and found nothing that fits (exit 1).
        typer.echo(f"error: {result.no_fit_reason()}", err=True)
        raise typer.Exit(1)


def _run_with_progress(planner: Any, spec: Any, oracle: Any, quiet: bool) -> Any:
    """Run the search with a rich progress bar on stderr (time budget as the total)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from trainsim.search.planner import run_search

    console = Console(stderr=True)
    with Progress(TextColumn(f"{planner.name}"), BarColumn(),
                  TextColumn("{task.fields[evaluated]} plans, best {task.fields[best]}"),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=quiet or not console.is_terminal) as bar:
        job = bar.add_task("search", total=spec.time_budget_s, evaluated=0, best="-")
        best = [None]

        def tick(record: Any) -> None:
            if record.improved:
                best[0] = f"{record.summary.samples_per_s:.2f} samples/s"
            bar.update(job, completed=min(record.elapsed_s, spec.time_budget_s),
                       evaluated=record.step + 1, best=best[0] or "-")

        return run_search(planner, spec, oracle=oracle, on_record=tick)


def _write(out: Path, result: Any, oracle: Any) -> None:
    """best_plan.json, aceso_config.json, megatron_flags.txt, ranked.json, search_log.json."""
    from trainsim.search.exports import to_aceso_config, to_megatron_flags

    out.mkdir(parents=True, exist_ok=True)
    data = result.to_dict()
    (out / "ranked.json").write_text(json.dumps(data["ranked"], indent=2, sort_keys=True) + "\n")
    # Files on disk hold no wall-clock figures (elapsed_s, search_s): the same search writes
    # the same bytes. The printed JSON keeps them.
    (out / "search_log.json").write_text(json.dumps([r.to_dict(timing=False)
                                                     for r in result.log],
                                                    indent=2, sort_keys=True) + "\n")
    best = result.best
    if best is None or best.plan is None:
        return
    (out / "best_plan.json").write_text(best.plan.to_json())
    config = to_aceso_config(best.plan, oracle.model, oracle.cluster)
    (out / "aceso_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    try:
        flags = to_megatron_flags(best.plan, oracle.model)
    except SpecError as exc:
        flags = f"# not a uniform plan: {exc}"
    (out / "megatron_flags.txt").write_text(flags + "\n")


def _table(result: Any, model: str, cluster: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result.method} search: {model} on {cluster}, global batch "
                        f"{result.spec.global_batch} ({result.evaluated} plans in "
                        f"{result.search_s:.1f} s{', interrupted' if result.interrupted else ''})")
    for col in ("#", "samples/s", "iteration (s)", "peak mem (GB)", "plan"):
        table.add_column(col)
    for i, r in enumerate(result.ranked, 1):
        table.add_row(str(i), f"{r.summary.samples_per_s:.3f}",
                      f"{r.summary.iteration_time_s:.3f}",
                      f"{r.summary.peak_memory_bytes / 1e9:.2f}", r.note)
    Console().print(table)


__all__ = ["OUTPUT_FILES", "lowering_options", "search_command"]
