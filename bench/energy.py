"""Energy planner benchmark: our frontier vs Lowtime 0.3.0 on the Perseus reference profiles.

For each reference case (GPT-3 175B on A100-SXM, 8 stages, 12/24/48/96 micro-batches; `--all`
adds BLOOM) it prints: our planner time, Lowtime's time on the same input run in this process
(`pip install lowtime==0.3.0`; capped by `--lowtime-budget-s` per case, then extrapolated from
its measured seconds per iteration × the iteration count of its published frontier, flagged),
`speedup_vs_lowtime`, `max_energy_gap_vs_lowtime` (relative, ≤ 0 = never worse) of our frontier
against Lowtime's published frontier CSV in its own convention (model energy at quantised time),
the all-max iteration time vs the 1F1B replay, the intrinsic saving vs the Perseus paper
(Table 6, `PUBLISHED_INTRINSIC_PCT`) and the straggler savings vs all-max at slowdowns 1.0–1.5
(no published figures for these profiles in shared/data/perseus: none shown beside them).

Intrinsic saving, as Perseus computes it (search/energy/straggler.py): the frontier's fastest
plan at T_min vs all-max with its energy counted over T_min. The published figures are exactly
that formula on Lowtime's fastest frontier row (A100: shared/data/perseus; A40:
`LOWTIME_A40_FASTEST_ROW`), shown as `lowtime_pct`. Ours is shown in real time and energy
(`ours_pct`), at the all-max time for comparison (`ours_at_all_max_time_pct`, the straggler
factor 1.0), and in the paper's own convention (the crashing model's energy at Lowtime's
quantised T_q; A100, where Lowtime's 1 ms frontier is at hand). `--intrinsic` adds every
published case (GPT-3 175B and BLOOM 176B, A100-SXM and A40, 12/24/48/96 micro-batches).
Timing: our planner after a warm-up (numba kernels compiled or loaded), the median of
`--repeats` runs (3: a run of tens of milliseconds is thrown off by one pause of the process
on a busy machine); Lowtime once (seconds to a minute, its figure spread over its iterations),
from the same CSV in the same process, right after ours. On a shared machine the ratio moves
with the load: run it alone for figures to quote.
Usage: ``python bench/energy.py [--json] [--all] [--intrinsic] [--lowtime-budget-s 60]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

from trainsim.search.energy.straggler import STRAGGLER_FACTORS

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "perseus"
P_BLOCK_A100_W = 83.64  # Perseus-measured blocking power, shared/data/perseus/SOURCES.md
P_BLOCK_W = {"a100_sxm": P_BLOCK_A100_W, "a40": 70.38}  # same source
MAX_FREQ_MHZ = {"a100_sxm": 1410, "a40": 1740}  # top clock of each profile (SOURCES.md)
#: Issue 15's goal for the planner against Lowtime 0.3.0 (12 and 96 micro-batches).
SPEEDUP_GOAL = 80.0

#: Published reference figures (Perseus Table 6; Lowtime's A40 fastest frontier rows), with their
#: sources, in bench/data/perseus_published.json.
_PUBLISHED = json.loads((Path(__file__).resolve().parent / "data" / "perseus_published.json")
                        .read_text())
PUBLISHED_INTRINSIC_PCT: dict[tuple[str, str, int], float] = {
    (r["model"], r["device"], r["microbatches"]): r["pct"]
    for r in _PUBLISHED["intrinsic_saving_pct"]["rows"]}
PUBLISHED_SOURCE = ("Perseus SOSP'24 Table 6 via github.com/ml-energy/zeus evaluation.ipynb "
                    "@38cb3f90")
LOWTIME_A40_FASTEST_ROW: dict[tuple[str, int], tuple[float, float]] = {
    (r["model"], r["microbatches"]): (r["time_s"], r["energy_j"])
    for r in _PUBLISHED["lowtime_a40_fastest_row"]["rows"]}


def lowtime_fastest_row(model: str, device: str, m: int) -> tuple[float, float] | None:
    """Lowtime's fastest frontier row (time s, energy J) as Perseus published it, or None."""
    path = DATA / "lowtime_frontier_emulation" / device / f"{model}_bf16_mb{m}.csv"
    if path.is_file():
        ref = np.loadtxt(path, delimiter=",", skiprows=1)
        k = int(ref[:, 0].argmin())
        return float(ref[k, 0]), float(ref[k, 1])
    if device == "a40":
        return LOWTIME_A40_FASTEST_ROW.get((model, m))
    return None


def intrinsic_case(model: str, device: str, m: int) -> dict:
    """Our intrinsic saving vs the published one (module docstring: the conventions)."""
    from trainsim.search.energy.baselines import all_max
    from trainsim.search.energy.dag import build_dag
    from trainsim.search.energy.frontier import compute_frontier, energy_at
    from trainsim.search.energy.profile import load_perseus_csv
    from trainsim.search.energy.straggler import intrinsic_saving

    p_block = P_BLOCK_W[device]
    prof = load_perseus_csv(DATA / "stage_profile" / f"{model}+{device}_bf16.csv",
                            blocking_power_w=p_block)
    dag = build_dag(prof, m)
    fr = compute_frontier(dag)
    top = all_max(dag)
    intr = intrinsic_saving(fr.points, top, blocking_power_w=p_block, num_stages=dag.num_stages)
    ours = 100.0 * intr.saving
    published = PUBLISHED_INTRINSIC_PCT[(model, device, m)]
    out = {"case": f"{model} {device} mb{m}", "published_pct": published,
           "lowtime_pct": None, "lowtime_fastest_time_s": None,
           "ours_pct": round(ours, 3), "delta_pp": round(ours - published, 3),
           "ours_fastest_time_s": round(intr.time_s, 6), "all_max_time_s": round(top.time_s, 6),
           "ours_at_all_max_time_pct": round(100.0 * intr.saving_at_all_max_time, 3),
           "ours_paper_convention_pct": None, "delta_pp_paper_convention": None}
    row = lowtime_fastest_row(model, device, m)
    if row is not None:
        t_q, e_q_lowtime = row
        base = _all_max_energy_at(prof, m, t_q, p_block, MAX_FREQ_MHZ[device])
        out["lowtime_pct"] = round(100.0 * (1.0 - e_q_lowtime / base), 6)
        out["lowtime_fastest_time_s"] = t_q
        if device == "a100_sxm":  # Lowtime's unit there is ours (1 ms): same quantisation
            e_q = energy_at(fr.steps, t_q, p_block, dag.num_stages, quantised="model")
            paper = 100.0 * (1.0 - e_q / base)
            out["ours_paper_convention_pct"] = round(paper, 3)
            out["delta_pp_paper_convention"] = round(paper - published, 3)
    return out


def _all_max_energy_at(prof, m: int, time_s: float, p_block: float, f_max: float) -> float:
    """All-max energy of one pipeline stretched to `time_s` (the artifact's baseline):
    Σ_s m·(E_F + E_B) + P_block · (time_s − m·(t_F + t_B)) per stage."""
    total = 0.0
    for s in range(prof.num_stages):
        tf, ef = prof.options[(s, "forward")].at(f_max)
        tb, eb = prof.options[(s, "backward")].at(f_max)
        total += m * (ef + eb) + p_block * (time_s - m * (tf + tb))
    return total


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


def bench_case(model: str, m: int, budget_s: float, with_lowtime: bool, repeats: int = 3
               ) -> dict:
    from trainsim.search.energy.baselines import all_baselines
    from trainsim.search.energy.dag import build_dag
    from trainsim.search.energy.frontier import compute_frontier, energy_at
    from trainsim.search.energy.profile import load_perseus_csv
    from trainsim.search.energy.replay import replay
    from trainsim.search.energy.straggler import intrinsic_saving, savings_table

    csv_path = DATA / "stage_profile" / f"{model}+a100_sxm_bf16.csv"
    prof = load_perseus_csv(csv_path, blocking_power_w=P_BLOCK_A100_W)
    dag = build_dag(prof, m)
    runs = [compute_frontier(dag) for _ in range(repeats)]
    fr = runs[0]
    planner_s = float(np.median([r.planner_s for r in runs]))
    base = {b.name: b.point for b in all_baselines(dag)}
    top = base["all-max"]
    check, _ = replay(dag, top.freq_mhz)
    kw = {"blocking_power_w": P_BLOCK_A100_W, "num_stages": dag.num_stages}
    intr = intrinsic_saving(fr.points, top, **kw)
    ref = np.loadtxt(DATA / "lowtime_frontier_emulation" / "a100_sxm" / f"{model}_bf16_mb{m}.csv",
                     delimiter=",", skiprows=1)
    gaps = [(energy_at(fr.steps, t, P_BLOCK_A100_W, dag.num_stages, quantised="model") - e) / e
            for t, e in ref]
    out = {
        "case": f"{model} a100_sxm mb{m}", "planner_s": round(planner_s, 3),
        "planner_runs_s": [round(r.planner_s, 3) for r in runs],
        "frontier_plans": len(fr.points), "crash_steps": len(fr.steps) - 1,
        "max_energy_gap_vs_lowtime": float(max(gaps)),
        "lowtime_time_range_s": [float(ref[-1, 0]), float(ref[0, 0])],
        "all_max_time_s": top.time_s, "all_max_replay_time_s": check.replayed_time_s,
        "all_max_energy_j": top.energy_j,
        "intrinsic_saving": intr.saving,
        "published_intrinsic_saving": PUBLISHED_INTRINSIC_PCT[(model, "a100_sxm", m)] / 100.0,
        "intrinsic_saving_at_all_max_time": intr.saving_at_all_max_time,
        "straggler_savings": [{"slowdown": round(c.slowdown, 6), "saving": c.saving}
                              for c in savings_table(fr.points, top, **kw)],
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
        out["speedup_vs_lowtime"] = round(est / planner_s, 2)
    else:
        out["speedup_vs_lowtime"] = None
    return out


def _warm_up() -> None:
    """Compile the numba kernels (or load them from the cache) before anything is timed."""
    from trainsim.search.energy.dag import build_dag
    from trainsim.search.energy.frontier import compute_frontier
    from trainsim.search.energy.profile import load_perseus_csv
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
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of our planner per case; its time is their median")
    ap.add_argument("--intrinsic", action="store_true",
                    help="every published intrinsic-saving case (A100 and A40), ours vs paper")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print(f"--repeats {args.repeats}: must be at least 1", file=sys.stderr)
        raise SystemExit(2)
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
    cases = [bench_case(model, m, args.lowtime_budget_s, with_lowtime, args.repeats)
             for model in models for m in args.micro_batches]
    doc = {"note": note, "cases": cases,
           "max_energy_gap_vs_lowtime": max(c["max_energy_gap_vs_lowtime"] for c in cases),
           "min_speedup_vs_lowtime": (min(c["speedup_vs_lowtime"] for c in cases)
                                      if with_lowtime else None)}
    if args.intrinsic:
        doc["intrinsic"] = {"source": PUBLISHED_SOURCE, "cases": [
            intrinsic_case(model, device, m) for model in ("gpt3-175b", "bloom")
            for device in ("a100_sxm", "a40") for m in args.micro_batches]}
    if args.json:
        print(json.dumps(doc))
        return
    print(note)
    print(f"{'case':26s} {'ours s':>7s} {'lowtime s':>10s} {'speedup':>8s} {'gap':>8s} "
          f"{'T_allmax':>9s} {'replay':>9s} {'intrinsic':>9s} {'published':>9s}  "
          f"straggler saving at x{'/'.join(f'{f:g}' for f in STRAGGLER_FACTORS)}")
    for c in cases:
        lt = f"{c.get('lowtime_s', float('nan')):.1f}{'*' if c.get('lowtime_extrapolated') else ''}"
        sp = c["speedup_vs_lowtime"]
        print(f"{c['case']:26s} {c['planner_s']:7.2f} {lt:>10s} "
              f"{(f'{sp:.1f}x' if sp else '-'):>8s} {c['max_energy_gap_vs_lowtime']:8.2%} "
              f"{c['all_max_time_s']:9.4f} {c['all_max_replay_time_s']:9.4f} "
              f"{c['intrinsic_saving']:9.1%} {c['published_intrinsic_saving']:9.1%}  "
              + " ".join(f"{r['saving']:.1%}" for r in c["straggler_savings"]))
    print("* extrapolated from Lowtime's seconds per iteration over its published iteration count")
    if doc["min_speedup_vs_lowtime"] is not None:
        print(f"min speedup vs lowtime: {doc['min_speedup_vs_lowtime']:.1f}x "
              f"(goal: >= {SPEEDUP_GOAL:g}x, issue 15)")
    print("straggler savings: no published figures for these profiles in shared/data/perseus")
    if args.intrinsic:
        print(f"\nintrinsic saving, % (fastest plan vs all-max over its time; published: "
              f"{PUBLISHED_SOURCE}; lowtime: the same formula on its fastest frontier row)")
        print(f"{'case':26s} {'published':>9s} {'lowtime':>8s} {'ours':>7s} {'Δ pp':>7s} "
              f"{'T_min':>8s} {'T_allmax':>8s} {'@T_allmax':>9s} {'paper conv.':>11s} "
              f"{'Δ pp':>7s}")
        for c in doc["intrinsic"]["cases"]:
            pc = c["ours_paper_convention_pct"]
            pc_s = "-" if pc is None else f"{pc:.2f}"
            dpc = "-" if pc is None else f"{c['delta_pp_paper_convention']:+.2f}"
            lt = "-" if c["lowtime_pct"] is None else f"{c['lowtime_pct']:.2f}"
            print(f"{c['case']:26s} {c['published_pct']:9.2f} {lt:>8s} {c['ours_pct']:7.2f} "
                  f"{c['delta_pp']:+7.2f} {c['ours_fastest_time_s']:8.4f} "
                  f"{c['all_max_time_s']:8.4f} {c['ours_at_all_max_time_pct']:9.2f} "
                  f"{pc_s:>11s} {dpc:>7s}")


if __name__ == "__main__":
    main()
