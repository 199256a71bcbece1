"""Energy planner benchmark: our frontier vs Lowtime 0.3.0 on the Perseus reference profiles.

For each reference case (GPT-3 175B on A100-SXM, 8 stages, 12/24/48/96 micro-batches; `--all`
adds BLOOM) it prints: our planner time, Lowtime's time on the same input run in this process
(`pip install lowtime==0.3.0`; capped by `--lowtime-budget-s` per case, then extrapolated from
its measured seconds per iteration × the iteration count of its published frontier, flagged),
`speedup_vs_lowtime`, `max_energy_gap_vs_lowtime` (relative, ≤ 0 = never worse) of our frontier
against Lowtime's published frontier CSV in its own convention (model energy at quantised time),
the all-max iteration time vs the 1F1B replay, and the intrinsic saving at no slowdown vs the
Perseus paper. Usage: ``python bench/energy.py [--json] [--all] [--lowtime-budget-s 60]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "perseus"
P_BLOCK_A100_W = 83.64  # Perseus-measured blocking power, shared/data/perseus/SOURCES.md


def run_lowtime(csv_path: Path, m: int, p_block_w: float, budget_s: float,
                unit_s: float = 1e-3) -> dict:
    """Lowtime 0.3.0's Perseus pipeline on the same profile (its examples/perseus.py recipe:
    Pareto options, effective cost E − P_block·t, exponential fit, 1F1B DAG, PD solver)."""
    import networkx as nx
    import pandas as pd
    from lowtime.cost_model import ExponentialModel
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
    from lowtime.perseus.instruction import Backward, Forward
    from lowtime.perseus.schedule import Synchronous1F1B
    from lowtime.solver import PhillipsDessouky

    start = time.perf_counter()
    df = pd.read_csv(csv_path)
    p = int(df.stage.max()) + 1
    spec = {}
    for cls in (Forward, Backward):
        for s in range(p):
            sub = df[(df.stage == s) & (df.instruction == cls.__name__.lower())]
            opts = [ExecutionOption[int](real_time=r.time, unit_time=unit_s, cost=r.energy,
                                         knob=int(r.frequency)) for r in sub.itertuples()]
            cand = CandidateExecutionOptions[int](options=opts)
            for o in cand.options:
                o.cost -= p_block_w * o.quant_time * o.unit_time
            spec[(s, cls)] = OperationSpec[int](options=cand, cost_model=ExponentialModel(cand))
    dag = nx.DiGraph()
    nid, key = 2, {}
    for s in range(p):
        ids = []
        for inst in Synchronous1F1B(num_stages=p, num_micro_batches=m, stage_id=s,
                                    operation_spec_map={Forward: spec[(s, Forward)],
                                                        Backward: spec[(s, Backward)]}):
            dag.add_node(nid, op=inst)
            key[(type(inst).__name__, s, inst.micro_batch_id)] = nid
            ids.append(nid)
            nid += 1
        dag.add_edges_from(itertools.pairwise(ids))
    for s in range(p - 1):
        for j in range(m):
            dag.add_edge(key[("Forward", s, j)], key[("Forward", s + 1, j)])
            dag.add_edge(key[("Backward", s + 1, j)], key[("Backward", s, j)])
    add_source_node(dag, 0)
    add_sink_node(dag, 1)
    dag.graph["source_node"], dag.graph["sink_node"] = 0, 1
    rows, finished = [], True
    for result in PhillipsDessouky(dag).run():
        rows.append((result.real_time, result.cost + p * result.real_time * p_block_w))
        if time.perf_counter() - start > budget_s:
            finished = False
            break
    return {"seconds": time.perf_counter() - start, "iterations": len(rows),
            "finished": finished, "rows": rows}


def bench_case(model: str, m: int, budget_s: float, with_lowtime: bool) -> dict:
    from trainsim.search.energy_baselines import all_baselines
    from trainsim.search.energy_dag import build_dag
    from trainsim.search.energy_frontier import compute_frontier, energy_at
    from trainsim.search.energy_profile import load_perseus_csv
    from trainsim.search.energy_replay import replay

    csv_path = DATA / "stage_profile" / f"{model}+a100_sxm_bf16.csv"
    prof = load_perseus_csv(csv_path, blocking_power_w=P_BLOCK_A100_W)
    dag = build_dag(prof, m)
    fr = compute_frontier(dag)
    base = {b.name: b.point for b in all_baselines(dag)}
    top = base["all-max"]
    check, _ = replay(dag, top.freq_mhz)
    e0 = energy_at(fr.points, top.time_s, P_BLOCK_A100_W, dag.num_stages)
    ref = np.loadtxt(DATA / "lowtime_frontier_emulation" / "a100_sxm" / f"{model}_bf16_mb{m}.csv",
                     delimiter=",", skiprows=1)
    gaps = [(energy_at(fr.steps, t, P_BLOCK_A100_W, dag.num_stages, quantised="model") - e) / e
            for t, e in ref]
    out = {
        "case": f"{model} a100_sxm mb{m}", "planner_s": round(fr.planner_s, 3),
        "frontier_plans": len(fr.points), "crash_steps": len(fr.steps) - 1,
        "max_energy_gap_vs_lowtime": float(max(gaps)),
        "lowtime_time_range_s": [float(ref[-1, 0]), float(ref[0, 0])],
        "all_max_time_s": top.time_s, "all_max_replay_time_s": check.replayed_time_s,
        "all_max_energy_j": top.energy_j,
        "intrinsic_saving": 1.0 - e0 / top.energy_j,
        "envpipe_saving": 1.0 - base["EnvPipe"].energy_j / top.energy_j,
        "zeus_per_stage": {"time_s": base["ZeusPerStage"].time_s,
                           "energy_j": base["ZeusPerStage"].energy_j},
    }
    if with_lowtime:
        lt = run_lowtime(csv_path, m, P_BLOCK_A100_W, budget_s)
        est = lt["seconds"] if lt["finished"] else \
            lt["seconds"] / max(1, lt["iterations"]) * len(ref)
        out["lowtime_s"] = round(est, 3)
        out["lowtime_extrapolated"] = not lt["finished"]
        out["lowtime_iterations_run"] = lt["iterations"]
        out["speedup_vs_lowtime"] = round(est / fr.planner_s, 2)
    else:
        out["speedup_vs_lowtime"] = None
    return out


def _warm_up() -> None:
    """Compile the numba kernels (or load them from the cache) before anything is timed."""
    from trainsim.search.energy_dag import build_dag
    from trainsim.search.energy_frontier import compute_frontier
    from trainsim.search.energy_profile import load_perseus_csv
    prof = load_perseus_csv(DATA / "stage_profile" / "gpt3-175b+a100_sxm_bf16.csv",
                            blocking_power_w=P_BLOCK_A100_W)
    compute_frontier(build_dag(prof, 2))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--all", action="store_true", help="BLOOM too")
    ap.add_argument("--lowtime-budget-s", type=float, default=60.0,
                    help="seconds Lowtime may run per case before extrapolating")
    ap.add_argument("--micro-batches", type=int, nargs="*", default=[12, 24, 48, 96])
    args = ap.parse_args(argv)
    if not DATA.is_dir():
        print(f"reference data not found at {DATA}", file=sys.stderr)
        raise SystemExit(1)
    try:
        import lowtime  # noqa: F401
        with_lowtime, note = True, "lowtime 0.3.0 run side by side"
    except ImportError:
        with_lowtime = False
        note = ("lowtime not installed (pip install lowtime==0.3.0): "
                "speedup_vs_lowtime is null")
    models = ["gpt3-175b", "bloom"] if args.all else ["gpt3-175b"]
    _warm_up()
    cases = [bench_case(model, m, args.lowtime_budget_s, with_lowtime)
             for model in models for m in args.micro_batches]
    doc = {"note": note, "cases": cases,
           "max_energy_gap_vs_lowtime": max(c["max_energy_gap_vs_lowtime"] for c in cases),
           "min_speedup_vs_lowtime": (min(c["speedup_vs_lowtime"] for c in cases)
                                      if with_lowtime else None)}
    if args.json:
        print(json.dumps(doc))
        return
    print(note)
    print(f"{'case':26s} {'ours s':>7s} {'lowtime s':>10s} {'speedup':>8s} {'gap':>8s} "
          f"{'T_allmax':>9s} {'replay':>9s} {'intrinsic':>9s}")
    for c in cases:
        lt = f"{c.get('lowtime_s', float('nan')):.1f}{'*' if c.get('lowtime_extrapolated') else ''}"
        sp = c["speedup_vs_lowtime"]
        print(f"{c['case']:26s} {c['planner_s']:7.2f} {lt:>10s} "
              f"{(f'{sp:.1f}x' if sp else '-'):>8s} {c['max_energy_gap_vs_lowtime']:8.2%} "
              f"{c['all_max_time_s']:9.4f} {c['all_max_replay_time_s']:9.4f} "
              f"{c['intrinsic_saving']:9.1%}")
    print("* extrapolated from Lowtime's seconds per iteration over its published iteration count")


if __name__ == "__main__":
    main()
