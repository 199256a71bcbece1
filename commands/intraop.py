"""`sim search --method intraop|alpa|megatron|intraop-pp`: intra-operator sharding search
(issue 17).

Runs `api.intraop`, prints a readable summary — which blocks, which
strategy and layouts, which collectives and what they cost alone — and the engine's figures
(or one JSON object with `--json`). "intraop-pp" (pipeline stages around per-stage CFP,
search/intraop/pipeline.py) prints its grid of (pp, micro-batches) as the engine scored it
and, per stage of the best plan, its layers, GPUs and the strategies of its weighted ops.
With `--out DIR` it writes the plan as JSON (a strategy and input/output specs per op; per
stage for intraop-pp), the summary and the engine's timeline (HTML). A memory limit no
plan meets is one line naming the smallest limit any plan meets, exit 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from trainsim import api
from trainsim.commands.output import check_out_dir, dumps
from trainsim.simulator.timeline_plot import write_timeline_html

if TYPE_CHECKING:  # the planners load scipy.optimize: imported when the command runs
    from trainsim.search.intraop.pipeline import PipelineResult
    from trainsim.search.intraop.planner import IntraopResult

INTRAOP_METHODS = ("intraop", "alpa", "megatron", "intraop-pp")
OUTPUT_FILES = ("intraop_plan.json", "intraop_summary.txt", "intraop_timeline.html")
EXIT_NO_FIT = 3


def intraop_search(*, method: str, model: str, cluster: str, global_batch: int,
                   mesh: str | None, memory_limit_gb: float | None, time_limit_s: float,
                   out: Path | None, force: bool, as_json: bool) -> None:
    """Search, print, write; exit 3 when no plan fits the memory limit."""
    # deferred: start-up time (scipy.optimize behind the intra-op planners)
    from trainsim.search.intraop.planner import IntraopMemoryError, IntraopResult

    check_out_dir(out, OUTPUT_FILES, force)
    try:
        result = api.intraop(model, cluster, method=method, global_batch=global_batch,
                             mesh=mesh, memory_limit_gb=memory_limit_gb,
                             time_limit_s=time_limit_s)
    except IntraopMemoryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_NO_FIT) from None
    text = summary_text(result) if isinstance(result, IntraopResult) else pipeline_text(result)
    if as_json:
        typer.echo(dumps(result.to_dict(), sort_keys=True))
    elif isinstance(result, IntraopResult):
        _print(result)
    else:
        typer.echo(text, nl=False)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / OUTPUT_FILES[0]).write_text(dumps(result.to_dict(), sort_keys=True) + "\n")
        (out / OUTPUT_FILES[1]).write_text(text)
        assert result.program is not None
        write_timeline_html(api.run_program(result.program), out / OUTPUT_FILES[2])
        if not as_json:
            typer.echo("wrote " + ", ".join(str(out / n) for n in OUTPUT_FILES))


def headline(r: IntraopResult) -> str:
    """One line: method, engine figures, search figures."""
    line = (f"{r.method}: {r.model} on mesh {r.plan.mesh.describe()}, batch "
            f"{r.plan.graph.graph.micro_batch_size}: {r.samples_per_s:.2f} samples/s "
            f"(iteration {r.iteration_time_s * 1e3:.1f} ms on the engine), "
            f"{r.memory_bytes / 1e9:.2f} GB/GPU; search {r.search_s:.2f} s, "
            f"{r.oracle_evaluations} Oracle evaluations, ILP strategy space {r.strategy_space}")
    if r.ilp is not None:
        line += f"; ILP {r.ilp.status}, MIP gap {r.ilp.mip_gap:.3g}"
    return line


def summary_text(r: IntraopResult) -> str:
    """The summary as plain text (the file under --out)."""
    lines = [headline(r)]
    for row in r.summary_rows():
        lines.append(f"{row['layer']} ×{row['repeats']}  {' + '.join(row['ops'])}  "
                     f"{row['strategy']}  {row['input']} -> {row['output']}  "
                     f"{row['comm_ms']:.3f} ms  {'; '.join(row['collectives']) or '-'}")
    return "\n".join(lines) + "\n"


def pipeline_text(r: PipelineResult) -> str:
    """The pipelined plan as plain text: headline, the grid, then per stage its layers, GPUs
    and its sharding summary."""
    lines = [(f"{r.method}: {r.model} on mesh {r.mesh.describe()}, batch {r.global_batch}: "
             f"pp {r.pp} × {r.micro_batches} micro-batches (1F1B): {r.samples_per_s:.2f} "
             f"samples/s (iteration {r.iteration_time_s * 1e3:.1f} ms on the engine), "
             f"{r.memory_bytes / 1e9:.2f} GB/GPU; search {r.search_s:.2f} s, "
             f"{r.oracle_evaluations} Oracle evaluations"),
             "grid (pp × micro-batches: iteration ms, GB/GPU):"]
    for c in r.candidates:
        t = f"{c.iteration_time_s * 1e3:.1f} ms" if c.iteration_time_s is not None \
            else "does not fit"
        lines.append(f"  pp {c.pp} × {c.micro_batches}: {t}, {c.memory_bytes / 1e9:.2f} GB")
    for st in r.stages:
        names = st.graph.layer_names
        lines.append(f"stage {st.index}: layers {st.layers.start}-{st.layers.stop - 1} "
                     f"({names[-1] if st.index else names[0]} …), GPUs "
                     f"{st.ranks[0]}-{st.ranks[-1]} as mesh {st.plan.mesh.describe()}, "
                     f"{st.in_flight} micro-batch(es) in flight, "
                     f"{st.memory_bytes() / 1e9:.2f} GB/GPU")
        counts: dict[str, int] = {}
        for n, s in zip(st.graph.nodes, st.plan.strategies, strict=True):
            if n.op.params > 0:
                key = f"{n.op.name}: {s.name}"
                counts[key] = counts.get(key, 0) + 1
        lines += [f"  {k} ×{v}" for k, v in counts.items()]
    return "\n".join(lines) + "\n"


def _print(r: IntraopResult) -> None:
    typer.echo(headline(r))  # one line, whatever the table's width (a title wraps with it)
    table = Table()
    for col in ("layer", "×", "block", "strategy", "in → out", "collectives (fwd/bwd/grad)",
                "comm (ms)"):
        table.add_column(col, justify="right" if col in ("×", "comm (ms)") else "left")
    for row in r.summary_rows():
        table.add_row(row["layer"], str(row["repeats"]), " + ".join(row["ops"]),
                      row["strategy"], f"{row['input']} → {row['output']}",
                      "\n".join(row["collectives"]) or "-", f"{row['comm_ms']:.3f}")
    Console(width=160).print(table)


__all__ = ["INTRAOP_METHODS", "intraop_search"]
