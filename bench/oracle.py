"""Oracle benchmark (issue 15): evaluations per second as planners use the Oracle.

Every figure is measured in this one run, old and new side by side on the same plans, in CPU
seconds of this process (`time.process_time`: on a machine shared with other jobs, wall time
mostly measures them), the two sides taking turns plan by plan:

* *old* — `Oracle(fast=False)`: each plan lowered from scratch and summarised from the full
  SimResult (per-task table, memory and power timelines), as before issue 15;
* *new* — `Oracle(fast=True)` (the default): lowering work shared between plans (graphs and
  stage costs keyed by content, workloads/lowering/cache.py), repeated instructions stamped
  from tapes (replay.py), and the Summary taken from the lean result (simulator/result.py).

Both answer every plan with the same Summary; the bench checks it (`same` column) and stops
if they differ. The old side runs today's lowering (the caches and tapes are all it lacks), so
its rates are those of the code before issue 15. Plan streams, each a fresh Oracle per side (no answer is served from the plan
cache: every plan in a stream is distinct):

* *grid* — the grid planner's candidates (search/grid.py) for the case: a varied stream;
* *aceso* — the plans an Aceso search evaluates (search/aceso/), in its order: single moves
  around a plan (migrate layers, tp, recompute, micro-batch, GPUs between stages), recorded
  once from a whole search (--quick: its first 2 s) and replayed to both sides;

for GPT-3 1.3B on 4 V100 (Aceso's small case: batch 512, 12000 MB) and GPT-3 175B on 1024
A100 (batch 1536; the grid is sampled evenly, the Aceso stream is the single moves around
Megatron's tp 8 / pp 16 / dp 8 plan). Also printed: numba vs the SimPy reference engine on the
first plans of the small grid stream, GPT-3 175B / 1024 GPUs unfolded (one evaluation, old and
new), and the analytical bound (search/bound.py): how many plans of each stream it covers, how
many a branch-and-bound planner would prune before lowering (bound >= the best time found so
far in stream order), bounds per second, and that no bound exceeds the engine's time.

*Issue day* — the same plans timed by the Oracle of commit `ISSUE_DAY` (the code when issue 15
was filed), exported with ``git archive`` and run in a process of its own
(bench/oracle_baseline.py), stream by stream right before the two sides above: issue 15's
"10× today's" is measured against it, since the old side above already has the lowering work
done since (stamped instruction runs, planned collectives shared between groups) and so
understates the gain. *Alone* — this tree's new Oracle run by that same script in a process of
its own right after it (one pass over the stream, the garbage collector off), so ``alone/day``
compares the two under one protocol; ``new/day`` sets the in-process new side, which takes
turns with the old one plan by plan and starts each evaluation with the caches the old side
left, against it.

The process keeps freed memory for reuse as `sim` does at start-up (simulator/malloc_tuning.py;
``--glibc-defaults`` leaves malloc alone); the issue-day process runs with glibc's defaults, as
the code of that day did.

Usage: ``python bench/oracle.py [--quick] [--json] [--issue-day COMMIT|none] [--rounds N]
[--glibc-defaults]`` (``--quick``: shorter streams, no unfolded case; ``--rounds N``: the
issue-day and alone processes N times each, taking turns, each side's least CPU time kept).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

ISSUE_DAY = "483690e"
"""The last commit before issue 15's first change (495bcc0, its sweep): the Oracle the issue
measured ("about 52 ms" an evaluation, on the Aceso stream of the small case)."""
SMALL = ("aceso-gpt-1.3b", "4xV100-PCIe-32GB", 512, 12000.0)
LARGE = ("gpt3-175b", "128x8xA100-SXM4-80GB", 1536, None)
MEGATRON_175B = {"dp": 8, "tp": 8, "pp": 16, "global_batch": 1536, "micro_batch_size": 1,
                 "schedule": "1f1b"}


def _oracles(case: tuple[str, str, int, float | None], **kw: Any) -> tuple[Any, Any]:
    """(old, new) Oracles for `case`."""
    from trainsim.api import load_cluster, load_model
    from trainsim.search.oracle import Oracle

    model, cluster = load_model(case[0]), load_cluster(case[1])
    return Oracle(model, cluster, fast=False, **kw), Oracle(model, cluster, fast=True, **kw)


def _spec(oracle: Any, case: tuple[str, str, int, float | None], budget_s: float) -> Any:
    from trainsim.search.planner import BYTES_PER_MB, SearchSpec

    limit = None if case[3] is None else case[3] * BYTES_PER_MB
    return SearchSpec(model=oracle.model, cluster=oracle.cluster, global_batch=case[2],
                      memory_limit_bytes=limit, time_budget_s=budget_s)


def grid_stream(case: tuple[str, str, int, float | None], limit: int | None) -> list[Any]:
    """The grid planner's candidates that build, as checked plans (evenly sampled to
    `limit`)."""
    from trainsim.errors import PlanError
    from trainsim.search.grid import GridPlanner
    from trainsim.search.planner import SearchState

    _, oracle = _oracles(case)
    state = SearchState(_spec(oracle, case, 600.0), oracle)
    plans = []
    for fields, _ in GridPlanner().candidates(state):
        try:
            plans.append(oracle.plan(fields))
        except PlanError:
            continue
    if limit is not None and len(plans) > limit:
        step = len(plans) / limit
        plans = [plans[int(i * step)] for i in range(limit)]
    return plans


def aceso_stream_small(case: tuple[str, str, int, float | None], budget_s: float) -> list[Any]:
    """The distinct plans a short Aceso search evaluates, in its order."""
    from trainsim.search.aceso.planner import AcesoPlanner
    from trainsim.search.planner import run_search

    _, oracle = _oracles(case)
    result = run_search(AcesoPlanner(), _spec(oracle, case, budget_s), oracle=oracle)
    seen: dict[str, Any] = {}
    for r in result.log:
        if r.plan is not None:
            seen.setdefault(r.summary.plan_key, r.plan)
    return list(seen.values())


def aceso_stream_large(case: tuple[str, str, int, float | None], limit: int) -> list[Any]:
    """Megatron's 175B plan and Aceso's single moves around its middle stage."""
    from trainsim.errors import PlanError
    from trainsim.search.aceso.moves import check_config, config_of, moves
    from trainsim.search.aceso.planner import AcesoPlanner, num_blocks, recompute_ladder
    from trainsim.search.planner import SearchState

    _, oracle = _oracles(case)
    state = SearchState(_spec(oracle, case, 600.0), oracle)
    ctx = AcesoPlanner()._context(state)
    base = oracle.plan(MEGATRON_175B)
    cfg = config_of(base, num_blocks(oracle.model))
    plans = [base]
    for move in moves(cfg, len(cfg.stages) // 2, memory_bound=False,
                      ladder=recompute_ladder(oracle.model)):
        if len(plans) >= limit:
            break
        if not check_config(move.config, **ctx):
            continue
        try:
            plans.append(oracle.plan(move.config.to_fields(case[2])))
        except PlanError:
            continue
    return plans


def _run(oracle: Any, plans: list[Any]) -> tuple[float, list[Any]]:
    """CPU seconds to evaluate every plan (this process's: other jobs on a shared machine do
    not count), and the Summaries (errors kept as Summaries); the garbage collector runs
    before, not during (so one side does not pay for the other's garbage)."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        out = oracle.evaluate_many(plans)
        return time.process_time() - t0, out
    finally:
        gc.enable()


def compare(name: str, case: tuple[str, str, int, float | None], plans: list[Any],
            **kw: Any) -> dict[str, Any]:
    """Old vs new on one stream: evaluations/s each, the ratio, and whether they agree.

    The two sides take turns plan by plan, so a load change on a shared machine hits both."""
    import pandas  # noqa: F401  # the old path's first build_result would import it

    old, new = _oracles(case, **kw)
    old_s = new_s = 0.0
    old_out, new_out = [], []
    for plan in plans:
        for oracle, out in ((old, old_out), (new, new_out)):
            seconds, summary = _run(oracle, [plan])
            out.extend(summary)
            if oracle is old:
                old_s += seconds
            else:
                new_s += seconds
    same = [a.to_dict() for a in old_out] == [b.to_dict() for b in new_out]
    if not same:
        raise SystemExit(f"{name}: old and new Oracles disagree")
    tasks = sum(s.num_tasks for s in new_out)
    return {"stream": name, "plans": len(plans), "tasks_per_plan": tasks / max(len(plans), 1),
            "old_s": old_s, "new_s": new_s, "old_evals_per_s": len(plans) / old_s,
            "new_evals_per_s": len(plans) / new_s, "speedup": old_s / new_s, "same": same,
            "summaries": new_out}


def engines(case: tuple[str, str, int, float | None], plans: list[Any]) -> dict[str, Any]:
    """numba vs SimPy (both on the new Oracle path) on the same plans."""
    from trainsim.api import load_cluster, load_model
    from trainsim.search.oracle import Oracle

    model, cluster = load_model(case[0]), load_cluster(case[1])
    out: dict[str, Any] = {"plans": len(plans)}
    results = {}
    for engine in ("numba", "simpy"):
        seconds, summaries = _run(Oracle(model, cluster, engine=engine), plans)
        out[f"{engine}_evals_per_s"] = len(plans) / seconds
        results[engine] = [s.iteration_time_s for s in summaries]
    out["ratio"] = out["numba_evals_per_s"] / out["simpy_evals_per_s"]
    out["same_times"] = all(a == b or abs(a - b) <= 1e-9 * abs(b)
                            for a, b in zip(results["numba"], results["simpy"]))
    return out


def bound_row(name: str, case: tuple[str, str, int, float | None], plans: list[Any],
              summaries: list[Any]) -> dict[str, Any]:
    """Coverage, pruning rate, speed and soundness of `plan_bound` on a stream."""
    from trainsim.api import load_cluster, load_model
    from trainsim.search.bound import plan_bound
    from trainsim.search.planner import BYTES_PER_MB, fits

    model, cluster = load_model(case[0]), load_cluster(case[1])
    limit = None if case[3] is None else case[3] * BYTES_PER_MB
    from trainsim.workloads.lowering.cache import LoweringCache

    cache = LoweringCache()  # as a planner would hold one (an Oracle's)
    t0 = time.process_time()
    bounds = [plan_bound(model, cluster, p, cache=cache) for p in plans]
    seconds = time.process_time() - t0
    best, pruned, covered, violations = math.inf, 0, 0, 0
    for b, s in zip(bounds, summaries):
        if b is not None:
            covered += 1
            pruned += b >= best
            violations += s.error is None and b > s.iteration_time_s
        if fits(s, limit):
            best = min(best, s.iteration_time_s)
    return {"stream": name, "plans": len(plans), "covered": covered, "pruned": pruned,
            "prune_rate": pruned / covered if covered else 0.0,
            "bounds_per_s": len(plans) / seconds, "violations": violations}


def unfolded() -> dict[str, Any]:
    """GPT-3 175B on 1024 GPUs unfolded (one program rank per GPU): one evaluation each side."""
    from trainsim.workloads.lowering import LoweringOptions

    opt = LoweringOptions(fold=False)
    row: dict[str, Any] = {}
    summaries = []
    for side, oracle in zip(("old", "new"), _oracles(LARGE, options=opt)):
        plan = oracle.plan(MEGATRON_175B)
        seconds, out = _run(oracle, [plan])
        summaries.append(out[0].to_dict())
        row[f"{side}_s"] = seconds
        row["tasks"] = summaries[-1]["num_tasks"]
        del oracle
    row["same"] = summaries[0] == summaries[1]
    if not row["same"]:
        raise SystemExit("175B unfolded: old and new Oracles disagree")
    return row


@contextlib.contextmanager
def issue_day(commit: str) -> Iterator[str | None]:
    """A folder holding commit `commit` exported as package ``trainsim`` (``git archive``), for
    `own_process`; None, with a line saying why, where the export fails (no git history, say).
    Exported once a run, however many streams and rounds time it."""
    import io
    import subprocess
    import tarfile
    import tempfile
    from pathlib import Path

    here = Path(__file__).resolve().parent
    archive = subprocess.run(["git", "-C", str(here.parent), "archive", commit],
                             capture_output=True, check=False)
    if archive.returncode:
        print(f"  [issue-day baseline skipped: git archive {commit}: "
              f"{archive.stderr.decode().strip()}]")
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="trainsim-issue-day-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(Path(tmp, "trainsim"), filter="data")
        yield tmp


@contextlib.contextmanager
def this_tree() -> Iterator[str]:
    """A folder whose ``trainsim`` is this tree (a link), for `own_process`: the "alone" side,
    this tree's new Oracle timed exactly as the issue-day baseline is (bench/oracle_baseline.py
    in a process of its own, one pass over the stream, the garbage collector off).

    The in-process new side (`compare`) takes turns with the old one plan by plan, so each of
    its evaluations starts with the caches the old side left: a fair old/new ratio, but not
    the baseline's protocol. Measured on the CI machine kind (2026-11-27), the Aceso stream of
    the small case: 9.8 ms an evaluation taking turns, 6.9-8.9 ms alone."""
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="trainsim-alone-") as tmp:
        Path(tmp, "trainsim").symlink_to(root, target_is_directory=True)
        yield tmp


def own_process(streams: list[tuple[str, tuple[str, str, int, float | None], list[Any]]],
                path: str, label: str, *, keep_memory: bool = False) -> dict[str, float] | None:
    """Run bench/oracle_baseline.py on `streams` with the trainsim package found under `path`
    (`issue_day`, `this_tree`): CPU seconds per stream, or None (with a line saying why) if the
    run fails (`keep_memory`: freed memory kept, as `sim` does)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    spec = {"streams": [{"name": name, "model": case[0], "cluster": case[1],
                         "plans": [p.to_dict() for p in plans]}
                        for name, case, plans in streams]}
    Path(path, "streams.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [sys.executable, str(here / "oracle_baseline.py"), str(Path(path, "streams.json"))]
    run = subprocess.run(cmd + (["--keep-freed-memory"] if keep_memory else []), env=env,
                         capture_output=True, text=True, check=False)
    if run.returncode:
        print(f"  [{label} failed: {run.stderr.strip().splitlines()[-1:]}]")
        return None
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if not out["trainsim"].startswith(path):
        raise SystemExit(f"{label} imported {out['trainsim']}, not {path}")
    for r in out["streams"]:
        if r["errors"]:
            print(f"  [{label}: {r['name']}: {r['errors']} of {r['plans']} plans failed; "
                  "left out]")
    return {r["name"]: r["cpu_s"] for r in out["streams"] if not r["errors"]}


def _keep_least(into: dict[str, float], got: dict[str, float] | None) -> None:
    """Fold one round's CPU seconds per stream into `into`, keeping each stream's least."""
    for name, seconds in (got or {}).items():
        into[name] = min(seconds, into.get(name, math.inf))


def _timed(label: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    print(f"  [{label}: {time.perf_counter() - t0:.1f} s]", flush=True)
    return out


def render(report: dict[str, Any]) -> str:
    """The tables, as text."""
    day = report.get("issue_day") or {}
    own = report.get("alone") or {}
    lines = [(f"trainsim Oracle benchmark ({report['mode']}): evaluations per CPU second, "
              "old (fast=False) vs new (fast=True), same plans, taking turns; issue day: "
              f"commit {report['issue_day_commit']}'s Oracle on the same plans, in a process "
              "of its own; alone: this tree's new Oracle timed as the issue day is"), ""]
    lines.append(f"{'case / stream':34} {'plans':>6} {'tasks/plan':>10} {'day eval/s':>11} "
                 f"{'old eval/s':>11} {'new eval/s':>11} {'new/old':>8} {'new/day':>8} "
                 f"{'same':>5} {'alone eval/s':>13} {'alone/day':>10}")
    for r in report["streams"]:
        d, a = day.get(r["stream"]), own.get(r["stream"])
        day_rate = "n/a" if d is None else f"{r['plans'] / d:.1f}"
        vs_day = "n/a" if d is None else f"{d / r['new_s']:.2f}x"
        a_rate = "n/a" if a is None else f"{r['plans'] / a:.1f}"
        a_vs_day = "n/a" if a is None or d is None else f"{d / a:.2f}x"
        lines.append(f"{r['stream']:34} {r['plans']:>6} {r['tasks_per_plan']:>10,.0f} "
                     f"{day_rate:>11} {r['old_evals_per_s']:>11.1f} "
                     f"{r['new_evals_per_s']:>11.1f} {r['speedup']:>7.2f}x {vs_day:>8} "
                     f"{'yes' if r['same'] else 'NO':>5} {a_rate:>13} {a_vs_day:>10}")
    lines.append("(same: new and old give identical Summaries; the issue-day code predates "
                 "physics changes since, so its answers differ and only its speed is compared;"
                 " alone/day: both in a process of their own, one pass, bench/oracle_baseline.py)")
    u = report.get("unfolded")
    if u:
        lines.append("")
        lines.append(f"GPT-3 175B / 1024 A100 unfolded ({u['tasks']:,} tasks), one evaluation "
                     f"(CPU s): old {u['old_s']:.2f}, new {u['new_s']:.2f} "
                     f"({u['old_s'] / u['new_s']:.2f}x), same: {'yes' if u['same'] else 'NO'}")
    e = report["engines"]
    lines.append("")
    lines.append(f"engines on the first {e['plans']} small grid plans (new path): numba "
                 f"{e['numba_evals_per_s']:.1f} eval/s, SimPy {e['simpy_evals_per_s']:.2f} "
                 f"eval/s ({e['ratio']:.0f}x), same iteration times: "
                 f"{'yes' if e['same_times'] else 'NO'}")
    lines.append("")
    lines.append(f"{'bound (search/bound.py) / stream':34} {'plans':>6} {'covered':>8} "
                 f"{'pruned':>7} {'rate':>6} {'bounds/s':>9} {'bound>engine':>12}")
    for r in report["bounds"]:
        lines.append(f"{r['stream']:34} {r['plans']:>6} {r['covered']:>8} {r['pruned']:>7} "
                     f"{r['prune_rate']:>6.0%} {r['bounds_per_s']:>9.0f} {r['violations']:>12}")
    lines.append("(pruned: bound >= best fitting time found earlier in the stream, so a "
                 "branch-and-bound planner skips it before lowering)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter streams, no unfolded case")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--issue-day", default=ISSUE_DAY, metavar="COMMIT",
                        help=f"commit whose Oracle is the issue's baseline (default {ISSUE_DAY};"
                             " 'none' skips it)")
    parser.add_argument("--rounds", type=int, default=1, metavar="N",
                        help="time the issue-day and alone processes N times each, taking "
                             "turns, and keep each one's least CPU time (default 1)")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="leave glibc malloc's thresholds alone (sim raises them at start-up: "
                             "simulator/malloc_tuning.py)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: must be at least 1")
    if not args.glibc_defaults:
        from trainsim.simulator.malloc_tuning import keep_freed_memory

        keep_freed_memory()
    quick = args.quick
    from trainsim.simulator.engine_numba import event_times
    from trainsim.simulator.random_program import random_program

    event_times(random_program(0, 2, 20).freeze())  # compile / load numba before timing
    report: dict[str, Any] = {"mode": "quick" if quick else "full"}
    small_grid = _timed("small grid stream", lambda: grid_stream(SMALL, 24 if quick else None))
    small_aceso = _timed("small aceso stream",  # full: the whole search (no budget cut)
                         lambda: aceso_stream_small(SMALL, 2.0 if quick else 60.0))
    large_grid = _timed("large grid stream", lambda: grid_stream(LARGE, 3 if quick else 6))
    large_aceso = _timed("large aceso stream", lambda: aceso_stream_large(LARGE,
                                                                           3 if quick else 6))
    streams = [("1.3B / 4 V100: grid", SMALL, small_grid),
               ("1.3B / 4 V100: aceso moves", SMALL, small_aceso),
               ("175B / 1024 A100: grid (sampled)", LARGE, large_grid),
               ("175B / 1024 A100: aceso moves", LARGE, large_aceso)]
    # stream by stream, the issue-day process right before the two in-process sides, so a
    # change of the machine's speed meets all three alike
    report["issue_day_commit"] = args.issue_day
    report["streams"], day, own = [], {}, {}
    with (issue_day(args.issue_day) if args.issue_day != "none"
          else contextlib.nullcontext(None)) as day_root, this_tree() as own_root:
        for name, case, plans in streams:
            for _ in range(args.rounds):
                if day_root is not None:
                    got = _timed(f"{name}: issue day", lambda s=(name, case, plans): own_process(
                        [s], day_root, f"issue-day baseline ({args.issue_day})"))
                    _keep_least(day, got)
                got = _timed(f"{name}: alone", lambda s=(name, case, plans): own_process(
                    [s], own_root, "this tree alone", keep_memory=not args.glibc_defaults))
                _keep_least(own, got)
            report["streams"].append(_timed(name, lambda n=name, c=case, p=plans: compare(
                n, c, p)))
    report["issue_day"] = day or None
    report["alone"] = own or None
    if not quick:
        report["unfolded"] = _timed("175B unfolded", unfolded)
    report["engines"] = _timed("engines", lambda: engines(SMALL, small_grid[:8 if quick else 16]))
    report["bounds"] = [bound_row(name, case, plans, r["summaries"])
                        for (name, case, plans), r in zip(streams, report["streams"])]
    for r in report["streams"]:
        del r["summaries"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))


if __name__ == "__main__":
    main()
