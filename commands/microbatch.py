"""`sim microbatch`: micro-batching methods for variable-length data, side by side.

Draws `--iterations` global batches of `--tokens-per-batch` tokens from the samples' lengths
(`--lengths FILE`, `--synthetic NAME` or `--text FILE --tokenizer T`), forms micro-batches
with each method (packing, token budget, fixed, DynaPipe, ours), replays every iteration on the
engine and prints per method: real tokens/s (padding excluded) and its ratio to packing,
padding efficiency, peak memory, recompute and schedule used, and the median planning time per
iteration. `--out PAGE.html` writes the lengths histogram, the micro-batches of the first
iteration and the timeline of that iteration under the fastest method. `--framework NAME`
plans for that stack: its model and, in every plan each method replays, its plan defaults
(distributed optimizer, sequence parallelism, overlap), as `sim search --framework` does; the
title and the JSON name it.
"""

from __future__ import annotations

from pathlib import Path

import typer

from trainsim import api
from trainsim.commands.output import check_new_file, counting_bar, dumps, print_table, user_errors
from trainsim.search.microbatch.planner import METHODS, MethodResult
from trainsim.simulator.result import SimResult
from trainsim.workloads.framework import get_framework

MAX_ITERATIONS = 10_000
MAX_TOKENS_PER_BATCH = 16_000_000


@user_errors
def microbatch_command(
    model: str = typer.Option(..., "--model", help="Zoo model name or model file."),
    cluster: str = typer.Option(..., "--cluster", help="Cluster spec, e.g. 1x8xA100-SXM4-40GB."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel degree."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline stages."),
    lengths: Path | None = typer.Option(None, "--lengths", help="Sample lengths: a .txt (one "
                                        "per line, or 'input target'), .csv or .parquet file."),
    column: str | None = typer.Option(None, "--column", help="CSV/Parquet column of input "
                                      "lengths."),
    target_column: str | None = typer.Option(None, "--target-column", help="CSV/Parquet "
                                             "column of target lengths."),
    synthetic: str | None = typer.Option(None, "--synthetic", help="A named synthetic "
                                         "mixture (e.g. flan); see workloads/data/"
                                         "length_mixtures.yaml."),
    text: Path | None = typer.Option(None, "--text", help="A text (.txt, one sample per "
                                     "line) or .jsonl file, measured with --tokenizer."),
    tokenizer: Path | None = typer.Option(None, "--tokenizer", help="A local tokenizer.json "
                                          "(or its folder)."),
    samples: int = typer.Option(20_000, "--samples", help="Samples drawn from --synthetic."),
    tokens_per_batch: int = typer.Option(65_536, "--tokens-per-batch",
                                         help="Tokens per global batch."),
    iterations: int = typer.Option(10, "--iterations", help="Global batches to replay."),
    max_len: int | None = typer.Option(None, "--max-len", help="Longest input (default: the "
                                       "model's sequence length)."),
    max_target_len: int | None = typer.Option(None, "--max-target-len", help="Longest target "
                                              "(encoder-decoder; default: the model's)."),
    on_long: str = typer.Option("truncate", "--on-long", help="truncate or reject samples "
                                "longer than --max-len."),
    methods: str = typer.Option(",".join(METHODS), "--methods", help="Comma-separated methods."),
    attention: str | None = typer.Option(None, "--attention", help="Attention kernel every "
                                         "method runs, so all are compared on one kernel: "
                                         "eager or flash (default: --framework's kernel, "
                                         "else eager, DynaPipe's setting)."),
    packing_attention: str | None = typer.Option(None, "--packing-attention", help="Packing's "
                                                 "kernel alone (default: --attention)."),
    zero: int | None = typer.Option(None, "--zero", help="ZeRO stage 0-2 of every method "
                                    "(default: --framework's distributed optimizer, else 0)."),
    framework: str | None = typer.Option(None, "--framework", help="Plan for this stack: "
                                         "the model as it trains it and its plan defaults "
                                         "(distributed optimizer, sequence parallelism, "
                                         "overlap) in every plan; one of workloads/data/"
                                         "frameworks.yaml's profiles."),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic lengths and shuffling."),
    out: Path | None = typer.Option(None, "--out", help="HTML page to write."),
    force: bool = typer.Option(False, "--force", help="Overwrite --out."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Compare micro-batching methods on variable-length data, replayed on the engine."""
    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    for m in chosen:
        if m not in METHODS:
            raise typer.BadParameter(f"{m!r} is not one of {', '.join(METHODS)}",
                                     param_hint="--methods")
    if not chosen:
        raise typer.BadParameter("give at least one method", param_hint="--methods")
    if not 1 <= iterations <= MAX_ITERATIONS:
        raise typer.BadParameter(f"must be 1 to {MAX_ITERATIONS}", param_hint="--iterations")
    if not 1 <= tokens_per_batch <= MAX_TOKENS_PER_BATCH:
        raise typer.BadParameter(f"must be 1 to {MAX_TOKENS_PER_BATCH:,}",
                                 param_hint="--tokens-per-batch")
    if not 1 <= samples <= 10_000_000:
        raise typer.BadParameter("must be 1 to 10,000,000", param_hint="--samples")
    for name, value in (("--dp", dp), ("--tp", tp), ("--pp", pp)):
        if not 1 <= value <= 65_536:
            raise typer.BadParameter("must be 1 to 65536", param_hint=name)
    for name, limit in (("--max-len", max_len), ("--max-target-len", max_target_len)):
        if limit is not None and not 16 <= limit <= 1_048_576:
            raise typer.BadParameter("must be 16 to 1048576", param_hint=name)
    if not 0 <= seed <= 2**32 - 1:
        raise typer.BadParameter("must be 0 to 4294967295", param_hint="--seed")
    for name, kernel in (("--attention", attention), ("--packing-attention", packing_attention)):
        if kernel is not None and kernel not in ("eager", "flash"):
            raise typer.BadParameter("must be eager or flash", param_hint=name)
    if zero is not None and not 0 <= zero <= 2:
        raise typer.BadParameter("must be 0, 1 or 2", param_hint="--zero")
    # an unknown name: one line listing the profiles, before any work
    stack = None if framework is None else get_framework(framework).name
    if stack is None and attention is None:
        attention = "eager"  # DynaPipe's setting; a stack runs its own kernel
    check_new_file(out, force, "--out")
    dataset = api.length_dataset(lengths=lengths, column=column, target_column=target_column,
                                 synthetic=synthetic, text=text, tokenizer=tokenizer,
                                 samples=samples, seed=seed)
    replayed = [0]
    with counting_bar("replay", total=iterations * len(chosen), quiet=as_json) as bar:

        def tick(method: str, _k: int) -> None:
            replayed[0] += 1
            bar(replayed[0], None, method)

        results, planner = api.microbatch(
            model, cluster, dataset, dp=dp, tp=tp, pp=pp, tokens_per_batch=tokens_per_batch,
            iterations=iterations, max_len=max_len, max_target_len=max_target_len,
            on_long=on_long, methods=chosen, packing_attention=packing_attention, seed=seed,
            on_iteration=tick, attention=attention, zero=zero, framework=stack)
    rows = _rows(results)
    under = "" if stack is None else f" under {stack}"
    title = (f"{planner.model.name} on {cluster}{under} (dp={dp} tp={tp} pp={pp}), "
             f"{dataset.name}: "
             f"{iterations} batch{'es' if iterations != 1 else ''} of up to "
             f"{tokens_per_batch:,} tokens")
    if as_json:
        typer.echo(dumps({"title": title, "dataset": dataset.source, "methods": rows,
                          "framework": stack},
                         sort_keys=True))
    else:
        print_table(title, list(rows[0]), [list(r.values()) for r in rows])
    if out is not None:
        from trainsim.search.microbatch.page import write_page  # deferred: start-up time (plotly)

        ran = [r for r in results if r.iterations]
        fastest = max(ran, key=lambda r: r.tokens_per_s, default=None)
        timeline: SimResult | None = None
        if fastest is not None and fastest.iterations[0].plan is not None:
            oracle = planner.oracle(fastest.method)
            timeline = oracle.simulate(fastest.iterations[0].plan)
        write_page(out, planner.dataset or dataset, results, timeline, title)
        if not as_json:
            typer.echo(f"wrote {out}")


def _rows(results: list[MethodResult]) -> list[dict[str, object]]:
    base = next((r.tokens_per_s for r in results if r.method == "packing" and r.iterations),
                None)
    rows: list[dict[str, object]] = []
    for r in results:
        if not r.iterations:
            rows.append({"method": r.method, "real tokens/s": None, "vs packing": None,
                         "padding eff.": None, "peak GiB": None, "OOM iterations": None,
                         "recompute": None, "schedule": None, "plan ms (median)": None,
                         "micro-batches": None, "error": r.error})
            continue
        rows.append({
            "method": r.method, "real tokens/s": round(r.tokens_per_s),
            "vs packing": None if base is None else round(r.tokens_per_s / base, 3),
            "padding eff.": round(r.padding_efficiency, 3),
            "peak GiB": round(r.peak_bytes / 2**30, 2),
            "OOM iterations": sum(not i.fits for i in r.iterations),
            "recompute": ",".join(f"{k}x{v}" for k, v in r.counts("recompute").items()),
            "schedule": ",".join(f"{k}x{v}" for k, v in r.counts("schedule").items()),
            "plan ms (median)": round(r.planning_ms, 2),
            "micro-batches": round(sum(i.micro_batches for i in r.iterations)
                                   / len(r.iterations), 1),
            "error": r.error})
    return rows


__all__ = ["microbatch_command"]
