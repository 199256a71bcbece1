"""`sim search`: find a parallel plan with the grid (Megatron-LM) or Aceso planner.

Loads the inputs, runs one planner through `search.planner.run_search` with a progress bar on
stderr, prints a table (or one JSON object with `--json`), and with `--out DIR` writes the best
plan as trainsim JSON, as Aceso's config JSON and — for plans Megatron-LM runs — as Megatron-LM flags,
plus the ranked plans and the search log. Ctrl-C stops the search and reports the best so far.
Existing outputs are never overwritten without `--force`; the files hold no wall-clock figures,
so the same search writes the same bytes. A search in which no candidate fits exits 1 (after
printing the JSON with `best: null` under `--json`) with one line saying why.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trainsim import api
from trainsim.commands.intraop import INTRAOP_METHODS, intraop_search
from trainsim.commands.output import check_out_dir, dumps, user_errors
from trainsim.errors import SpecError, unknown_name
from trainsim.search.exports import SEARCH_OUTPUT_FILES
from trainsim.search.hetero.objectives import check_limits, limit_miss, parse_prices, run_totals
from trainsim.search.methods import EVALUATION_BUDGET_METHODS, PLANNERS
from trainsim.search.planner import SearchRecord, SearchResult
from trainsim.workloads.framework import get_framework
from trainsim.workloads.plan import ParallelPlan

_METHOD = typer.Option("grid", "--method", help="grid (Megatron-LM uniform), aceso, or for "
                       "clusters of several GPU types hetero (ours), fasop (FASOP's search "
                       "on our Oracle) or uniform (Megatron-LM, nodes as written); intra-op "
                       "sharding: intraop (CFP), intraop-pp (CFP per pipeline stage), alpa "
                       "(ILP) or megatron (hand TP).")
_MODEL = typer.Option(..., "--model", help="Zoo model name or model file.")
_CLUSTER = typer.Option(..., "--cluster", help="Cluster spec, e.g. 4xV100-PCIe-32GB.")
_BATCH = typer.Option(..., "--global-batch", help="Samples per iteration.")
_MEM = typer.Option(None, "--memory-limit-gb", help="Per-GPU memory limit in GB (10^9 bytes); "
                    "the device memory when omitted.")
_BUDGET = typer.Option(60.0, "--time-budget-s", help="Search time budget (s).")
_MAX_EVALS = typer.Option(None, "--max-evals", help="hetero, fasop, uniform: stop after this "
                          "many plans run (default 1000), or at --time-budget-s if sooner. "
                          "Counted, not timed: the same search runs the same plans on any "
                          "machine.")
_PROFILE = typer.Option(None, "--profile", help="Op profile: an Aceso profiled-time-* folder or "
                        "a trainsim profile database CSV (default: roofline).")
_OBJ = typer.Option("throughput", "--objective", help="throughput, cost or energy.")
_TOP = typer.Option(5, "--top", help="How many ranked plans to show and keep.")
_OUT = typer.Option(None, "--out", help="Folder for best_plan.json, aceso_config.json, "
                    "megatron_flags.txt, ranked.json and search_log.json.")
_FORCE = typer.Option(False, "--force", help="Overwrite existing outputs.")
_JSON = typer.Option(False, "--json", help="Print one JSON object.")
_PRICE = typer.Option(None, "--price", help="GPU=USD per GPU-hour, overriding the catalog "
                      "(repeatable), e.g. --price A10=1.5; --out's best_plan.json records "
                      "them, so `sim simulate --plan` prices the plan alike.")
_TOKENS = typer.Option(None, "--tokens", help="Tokens the training run covers: prints its days "
                       "and dollars at the best plan's speed.")
_BUDGET_USD = typer.Option(None, "--budget-usd", help="Fail (exit 1, saying how close the best "
                           "came) when the run over --tokens costs more.")
_DEADLINE = typer.Option(None, "--deadline-days", help="Fail (exit 1, saying how close the best "
                         "came) when the run over --tokens takes longer.")
_FRAMEWORK = typer.Option(None, "--framework", help="Plan for this stack (grid, aceso, "
                          "hetero, fasop, uniform): the model as it trains it and its plan "
                          "defaults (sequence parallelism, distributed optimizer, overlap) in "
                          "every candidate; one of workloads/data/frameworks.yaml's profiles.")
_MESH = typer.Option(None, "--mesh", help="intraop/alpa/megatron: device mesh, e.g. 8 or 2x4 "
                     "(default: 1-D over every GPU).")


@user_errors
def search_command(
    method: str = _METHOD, model: str = _MODEL, cluster: str = _CLUSTER,
    global_batch: int = _BATCH, memory_limit_gb: float | None = _MEM,
    time_budget_s: float = _BUDGET, profile: Path | None = _PROFILE,
    objective: str = _OBJ, top: int = _TOP, out: Path | None = _OUT, force: bool = _FORCE,
    as_json: bool = _JSON, price: list[str] | None = _PRICE, tokens: float | None = _TOKENS,
    budget_usd: float | None = _BUDGET_USD, deadline_days: float | None = _DEADLINE,
    mesh: str | None = _MESH, framework: str | None = _FRAMEWORK,
    max_evals: int | None = _MAX_EVALS,
) -> None:
    """Search parallel plans for MODEL on CLUSTER and print the best ones."""
    if method not in INTRAOP_METHODS and method not in PLANNERS:
        raise SpecError(str(unknown_name("search method", method, (*PLANNERS, *INTRAOP_METHODS))))
    if mesh is not None and method not in INTRAOP_METHODS:
        raise SpecError(f"--mesh applies to the intra-op methods ({', '.join(INTRAOP_METHODS)})"
                        f"; --method {method} plans the whole cluster")
    if max_evals is not None and method not in EVALUATION_BUDGET_METHODS:
        raise SpecError(f"--max-evals applies to {', '.join(EVALUATION_BUDGET_METHODS)}; "
                        f"--method {method} is bounded by --time-budget-s only")
    if max_evals is not None and max_evals < 1:
        raise SpecError(f"--max-evals {max_evals} must be >= 1")
    if framework is not None and method in INTRAOP_METHODS:
        # the intra-op methods plan SPMD shardings (CFP, Alpa) of their own, not a stack's
        # tensor/pipeline plan: none of a profile's plan defaults has a meaning there
        raise SpecError(f"--framework applies to the pipeline planners ({', '.join(PLANNERS)})"
                        f"; --method {method} plans intra-op shardings without one")
    if framework is not None:
        get_framework(framework)  # an unknown name: one line listing the profiles, now
    if method in INTRAOP_METHODS:
        intraop_search(method=method, model=model, cluster=cluster, global_batch=global_batch,
                       mesh=mesh, memory_limit_gb=memory_limit_gb, time_limit_s=time_budget_s,
                       out=out, force=force, as_json=as_json)
        return
    prices = parse_prices(price)
    check_limits(tokens, budget_usd, deadline_days)
    check_out_dir(out, SEARCH_OUTPUT_FILES, force)
    console = Console(stderr=True)
    with Progress(TextColumn(method), BarColumn(),
                  TextColumn("{task.fields[evaluated]} plans, best {task.fields[best]}"),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=as_json or not console.is_terminal) as bar:
        job = bar.add_task("search", total=time_budget_s, evaluated=0, best="-")
        best: list[str] = ["-"]

        def tick(record: SearchRecord) -> None:
            if record.improved:
                best[0] = f"{record.summary.samples_per_s:.2f} samples/s"
            bar.update(job, completed=min(record.elapsed_s, time_budget_s),
                       evaluated=record.step + 1, best=best[0])

        result = api.search(model, cluster, global_batch=global_batch, method=method,
                            memory_limit_gb=memory_limit_gb, time_budget_s=time_budget_s,
                            profile=profile, objective=objective, top=top, prices=prices,
                            on_record=tick, framework=framework, max_evals=max_evals)
    written: list[Path] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in api.search_files(result, model=model, cluster=cluster,
                                           framework=framework, prices=prices).items():
            (out / name).write_text(text)
            written.append(out / name)
    if as_json:
        typer.echo(dumps(result.to_dict(), sort_keys=True))
    elif result.ranked:
        _table(result, model, cluster)
    if written and not as_json:
        typer.echo("wrote " + ", ".join(str(p) for p in written))
    if result.best is None:
        # Not bad input (exit 2): the search ran and found nothing that fits (exit 1).
        typer.echo(f"error: {result.no_fit_reason()}", err=True)
        raise typer.Exit(1)
    if tokens is not None:
        s = result.best.summary
        usd_per_hour = s.cost_usd / s.iteration_time_s * 3600 if s.iteration_time_s > 0 else 0.0
        totals = run_totals(tokens, s.tokens_per_s, usd_per_hour)
        miss = limit_miss(totals, budget_usd, deadline_days)
        if miss is not None:  # the search ran; no plan meets the limit (exit 1, as no fit)
            typer.echo(f"error: no plan meets the limits; the best ({result.best.note}) {miss}",
                       err=True)
            raise typer.Exit(1)
        if not as_json:
            typer.echo(f"best plan: {totals.describe()}")


def plan_words(plan: ParallelPlan) -> str:
    """A plan in words: `dp2 tp2 pp1 mb4×2, recompute selective` (+ what differs from a
    uniform Megatron plan: per-stage layers, per-op degrees, ZeRO, schedule)."""
    words = [(f"dp{plan.dp} tp{plan.tp} pp{plan.pp} mb{plan.micro_batch_size}"
              f"×{plan.num_micro_batches}")]
    policies = plan.stage_recompute if plan.stage_recompute is not None else (plan.recompute,)
    texts = [p if isinstance(p, str) else ",".join(p) for p in policies]
    words.append("recompute " + (texts[0] if len(set(texts)) == 1 else " / ".join(texts)))
    if plan.stage_layers is not None and plan.pp > 1:
        words.append("layers " + "/".join(str(n) for n in plan.stage_layers))
    if plan.stage_tp is not None and set(plan.stage_tp) != {plan.tp}:
        words.append("stage tp " + "/".join(str(n) for n in plan.stage_tp))
    if plan.op_tp or plan.stage_op_tp:
        words.append("per-op tp")
    if plan.zero:
        words.append(f"zero {plan.zero}")
    if plan.schedule != "1f1b":
        words.append(plan.schedule)
    if plan.dp_batch_split is not None:
        words.append("batch split " + "/".join(str(n) for n in plan.dp_batch_split))
    if plan.node_order is not None:
        words.append("node order " + ",".join(str(n) for n in plan.node_order))
    return ", ".join(words)


def _table(result: SearchResult, model: str, cluster: str) -> None:
    table = Table(title=f"{result.method} search: {model} on {cluster}, global batch "
                        f"{result.spec.global_batch} ({result.evaluated} plans in "
                        f"{result.search_s:.1f} s"
                        f"{f', {result.pruned} pruned by the bound' if result.pruned else ''}"
                        f"{f', {result.capped} left by the budget' if result.capped else ''}"
                        f"{', interrupted' if result.interrupted else ''})")
    for col in ("#", "samples/s", "iteration (s)", "peak mem (GiB)", "plan", "found by"):
        table.add_column(col, justify="right" if col[0] in "#sip" and col != "plan" else "left")
    for i, r in enumerate(result.ranked, 1):
        table.add_row(str(i), f"{r.summary.samples_per_s:.3f}",
                      f"{r.summary.iteration_time_s:.3f}",
                      f"{r.summary.peak_memory_bytes / 2**30:.2f}",
                      "-" if r.plan is None else plan_words(r.plan), r.note)
    Console().print(table)


__all__ = ["plan_words", "search_command"]
