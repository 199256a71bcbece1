"""Benchmark of the fast engine (issue 4): every figure measured in this one run.

Prints one table:

* tasks/s of the SimPy reference and the numba engine on the same Programs of growing size
  (random programs, and GPT-3 175B lowered folded), and their ratios. Each engine's time is
  split the same way:

  - *loop*: the event loop alone on prepared data. SimPy: `run_simpy` minus the parts it shares
    with no simulation, each timed separately on the same program — `validate()`,
    `stream_queues()` and the `build_result()` it ends with (which freezes the program itself);
    numba: `event_times(frozen)` (best of 3, compiled code already loaded).
    `speedup_vs_simpy` = min over programs of SimPy loop / numba loop;
  - *+freeze*: numba's loop plus `Program.freeze()` (its preparation, validation included),
    against SimPy's loop plus `validate()` + `stream_queues()` (its preparation);
  - *end to end*: `run_simpy(program)` against `run_numba(program)` (freeze + loop +
    build_result), everything a caller waits for: `speedup_vs_simpy_end_to_end`;
* GPT-3 175B, one iteration on 1024 A100-SXM4-80GB (tp 8, pp 16, dp 8, global batch 1536,
  micro-batch 1, 1F1B) folded and unfolded, and the same on 10,240 GPUs (dp 80): wall time per
  phase (lower, freeze, engine, build_result) and peak RSS, each case in its own subprocess;
* engine time against micro-batches and against pipeline stages (linear in tasks: µs/task flat);
* cold vs warm `sim simulate` wall time (subprocess; cold = a fresh, empty NUMBA_CACHE_DIR).

Usage: `python bench/engine.py [--quick] [--json]`. `--quick` (under a minute on 2 cores)
uses smaller programs for the SimPy comparison and skips the 10,240-GPU and scaling cases;
`--json` prints one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GPT3 = "gpt3-175b"
CLUSTER_1024 = "128x8xA100-SXM4-80GB"
CLUSTER_10240 = "1280x8xA100-SXM4-80GB"
PLAN_1024 = {"dp": 8, "tp": 8, "pp": 16, "global_batch": 1536, "micro_batch_size": 1,
             "schedule": "1f1b"}
PLAN_10240 = {**PLAN_1024, "dp": 80, "global_batch": 15360}
#: Address-space cap of each one-iteration subprocess, so a huge case fails instead of swapping.
MEMORY_LIMIT_BYTES = 16 * 2**30


def _peak_rss_bytes() -> int:
    """Peak resident set of this process (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _warm_up() -> None:
    """Compile (or load from cache) the numba loop so timings exclude compilation."""
    from trainsim.simulator.engine_numba import event_times
    from trainsim.simulator.engine_simpy import run_simpy
    from trainsim.simulator.random_program import random_program

    event_times(random_program(0, 2, 20).freeze())
    run_simpy(random_program(0, 2, 20))  # imports pandas for build_result


def _best_of(repeats: int, fn: Any) -> tuple[float, Any]:
    """Shortest wall time of `repeats` calls of `fn` and the last call's value."""
    best, value = math.inf, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def compare_engines(sizes: list[tuple[int, int]], with_gpt3: bool) -> list[dict[str, Any]]:
    """SimPy vs numba tasks/s on the same programs (definitions in the module docstring)."""
    from trainsim.simulator.engine_numba import event_times, run_numba
    from trainsim.simulator.engine_simpy import run_simpy, stream_queues
    from trainsim.simulator.random_program import random_program
    from trainsim.simulator.result import build_result

    programs = [(f"random {n} tasks/{r} ranks", random_program(7, r, n, num_links=4))
                for r, n in sizes]
    if with_gpt3:
        programs.append(("gpt3-175b 1024 GPU folded", _lower(GPT3, CLUSTER_1024, PLAN_1024, True)))
    rows = []
    for label, program in programs:
        k = 3 if program.num_tasks < 10_000 else 1  # small programs: best of 3 against noise
        simpy_total, ref = _best_of(k, lambda p=program: run_simpy(p))
        validate_s, _ = _best_of(k, lambda p=program: p.validate(check_cycles=False))
        queues_s, _ = _best_of(k, lambda p=program: stream_queues(p))
        simpy_result_s, _ = _best_of(
            k, lambda p=program, r=ref: build_result(p, r.start_s, r.end_s, engine="simpy"))
        freeze_s, frozen = _best_of(3, program.freeze)
        loop_s, (start, end) = _best_of(3, lambda f=frozen: event_times(f))
        numba_total, _ = _best_of(3, lambda p=program: run_numba(p))
        if not ((abs(start - ref.start_s) <= 1e-9 * abs(ref.start_s)).all()
                and (abs(end - ref.end_s) <= 1e-9 * abs(ref.end_s)).all()):
            raise SystemExit(f"engines disagree on {label}")
        simpy_prep_s = validate_s + queues_s
        remainder = simpy_total - simpy_prep_s - simpy_result_s
        # parts timed one at a time can add up to more than the whole on small programs: the
        # loop alone is then not resolved (None, printed n/a) rather than a made-up rate
        simpy_loop_s = remainder if remainder > 0.05 * simpy_total else None
        n = program.num_tasks
        rows.append({"program": label, "tasks": n,
                     "simpy_tasks_per_s": None if simpy_loop_s is None else n / simpy_loop_s,
                     "numba_tasks_per_s": n / loop_s,
                     "ratio": None if simpy_loop_s is None else simpy_loop_s / loop_s,
                     "numba_with_freeze_tasks_per_s": n / (loop_s + freeze_s),
                     "ratio_with_freeze": (simpy_total - simpy_result_s) / (loop_s + freeze_s),
                     "end_to_end_ratio": simpy_total / numba_total,
                     "simpy_run_s": simpy_total, "numba_run_s": numba_total,
                     "freeze_s": freeze_s})
    return rows


def _lower(model: str, cluster: str, plan: dict[str, Any], fold: bool) -> Any:
    from trainsim import api
    from trainsim.workloads.lowering import lower

    spec, hw = api.load_model(model), api.load_cluster(cluster)
    return lower(spec, hw, api.make_plan(spec, hw, plan),
                 api.LoweringOptions(fold=fold))


def run_case(model: str, cluster: str, plan: dict[str, Any], fold: bool) -> dict[str, Any]:
    """One iteration, timed per phase (run in a subprocess so peak RSS is its own)."""
    from trainsim import api
    from trainsim.simulator.engine_numba import event_times
    from trainsim.simulator.result import build_result
    from trainsim.workloads.lowering import lower

    _warm_up()
    rss_before = _peak_rss_bytes()
    t0 = time.perf_counter()
    spec, hw = api.load_model(model), api.load_cluster(cluster)
    checked = api.make_plan(spec, hw, plan)
    program = lower(spec, hw, checked, api.LoweringOptions(fold=fold))
    t1 = time.perf_counter()
    frozen = program.freeze()
    t2 = time.perf_counter()
    start, end = event_times(frozen)
    t3 = time.perf_counter()
    result = build_result(program, start, end, engine="numba", frozen=frozen)
    t4 = time.perf_counter()
    return {"tasks": program.num_tasks, "ranks": program.num_ranks, "lower_s": t1 - t0,
            "freeze_s": t2 - t1, "engine_s": t3 - t2, "build_result_s": t4 - t3,
            "total_s": t4 - t0, "iteration_time_s": result.iteration_time_s,
            "peak_rss_bytes": _peak_rss_bytes(), "rss_before_bytes": rss_before}


def case_subprocess(name: str, model: str, cluster: str, plan: dict[str, Any], fold: bool,
                    timeout_s: float) -> dict[str, Any]:
    """run_case in a fresh interpreter; a timeout, a crash or running past MEMORY_LIMIT_BYTES
    of address space becomes a row with the reason."""
    arg = json.dumps({"model": model, "cluster": cluster, "plan": plan, "fold": fold})

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))

    try:
        out = subprocess.run([sys.executable, __file__, "--case", arg], capture_output=True,
                             text=True, timeout=timeout_s, check=False, preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        return {"case": name, "error": f"not measured: over the bench's {timeout_s:.0f} s limit"}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"case": name, "error": f"exit {out.returncode}: {tail}"}
    return {"case": name, **json.loads(out.stdout.strip().splitlines()[-1])}


def scaling(kind: str) -> list[dict[str, Any]]:
    """Engine time vs micro-batches (pp 16) or vs pipeline stages (m = 64), folded 175B."""
    from trainsim.simulator.engine_numba import event_times

    rows = []
    points = [128, 256, 512, 1024, 2048] if kind == "micro-batches" else [4, 8, 16, 32]
    for x in points:
        if kind == "micro-batches":
            cluster, plan = CLUSTER_1024, {**PLAN_1024, "global_batch": x}  # m = x / dp
        else:
            cluster = f"{8 * x}x8xA100-SXM4-80GB"
            plan = {**PLAN_1024, "pp": x, "global_batch": 8 * 64}
        t0 = time.perf_counter()
        program = _lower(GPT3, cluster, plan, True)
        t1 = time.perf_counter()
        frozen = program.freeze()
        t2 = time.perf_counter()
        event_times(frozen)
        t3 = time.perf_counter()
        rows.append({kind: x if kind == "stages" else x // 8, "tasks": program.num_tasks,
                     "lower_s": t1 - t0, "engine_s": t3 - t2,
                     "engine_us_per_task": 1e6 * (t3 - t2) / program.num_tasks})
    return rows


def cold_warm_cli() -> dict[str, Any]:
    """Wall time of `sim simulate --json` with an empty numba cache, then with it filled."""
    sim = Path(sys.executable).with_name("sim")
    cmd = [str(sim)] if sim.exists() else [sys.executable, "-c",
                                          "from trainsim.cli import app; app()"]
    cmd += ["simulate", "--json", "--engine", "numba"]
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, capture_output=True, check=True)
            times.append(time.perf_counter() - t0)
    return {"cold_s": times[0], "warm_s": times[1]}


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def render(report: dict[str, Any]) -> str:
    """The one table, as text."""
    lines = ["trainsim engine benchmark (" + report["mode"] + ")", ""]
    lines.append(f"{'program':34} {'tasks':>9} {'simpy tasks/s':>14} {'numba tasks/s':>14} "
                 f"{'ratio':>7} {'+freeze tasks/s':>15} {'ratio':>7} {'end-to-end':>10}")
    for r in report["engines"]:
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.0f}x"
        simpy_rate = "n/a" if r["simpy_tasks_per_s"] is None else _fmt_rate(r["simpy_tasks_per_s"])
        lines.append(f"{r['program']:34} {r['tasks']:>9,} {simpy_rate:>14}"
                     f" {_fmt_rate(r['numba_tasks_per_s']):>14} {ratio:>7}"
                     f" {_fmt_rate(r['numba_with_freeze_tasks_per_s']):>15}"
                     f" {r['ratio_with_freeze']:>6.1f}x {r['end_to_end_ratio']:>9.1f}x")
    lines.append("(loop: event loop alone, SimPy minus validate/queues/build_result, numba on "
                 "frozen arrays; +freeze: each engine's preparation added; end-to-end: "
                 "run_simpy vs run_numba)")
    lines += ["", (f"{'one iteration (numba)':34} {'tasks':>9} {'lower s':>8} {'freeze s':>8} "
                   f"{'engine s':>8} {'result s':>8} {'total s':>8} {'peak RSS':>9}")]
    for r in report["cases"]:
        if "error" in r:
            lines.append(f"{r['case']:34} {r['error']}")
            continue
        lines.append(f"{r['case']:34} {r['tasks']:>9,} {r['lower_s']:>8.2f} {r['freeze_s']:>8.2f} "
                     f"{r['engine_s']:>8.3f} {r['build_result_s']:>8.2f} {r['total_s']:>8.2f} "
                     f"{r['peak_rss_bytes'] / 2**30:>7.2f}G")
    for kind in ("micro-batches", "stages"):
        rows = report.get(f"scaling_{kind}")
        if not rows:
            continue
        label = "micro-batches/replica" if kind == "micro-batches" else "pipeline stages"
        lines += ["", (f"{label + ' (175B folded)':34} {'tasks':>9} {'lower s':>8} "
                       f"{'engine s':>8} {'µs/task':>8}")]
        for r in rows:
            lines.append(f"{r[kind]:<34} {r['tasks']:>9,} {r['lower_s']:>8.2f} "
                         f"{r['engine_s']:>8.4f} {r['engine_us_per_task']:>8.3f}")
    cli = report["sim_simulate"]
    lines += ["", (f"sim simulate --json (gpt3-1.3b, 4xV100): cold {cli['cold_s']:.2f} s "
                   f"(fresh NUMBA_CACHE_DIR), warm {cli['warm_s']:.2f} s")]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="under a minute on 2 cores")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        spec = json.loads(args.case)
        print(json.dumps(run_case(spec["model"], spec["cluster"], spec["plan"], spec["fold"])))
        return
    _warm_up()
    quick = args.quick
    sizes = [(8, 1000), (16, 5000)] if quick else [(8, 1000), (16, 10000), (64, 50000)]
    report: dict[str, Any] = {"mode": "quick" if quick else "full"}
    report["engines"] = compare_engines(sizes, with_gpt3=True)
    cases = [("175B 1024 GPU folded", CLUSTER_1024, PLAN_1024, True, 120),
             ("175B 1024 GPU unfolded", CLUSTER_1024, PLAN_1024, False, 300)]
    if not quick:
        cases += [("175B 10240 GPU folded", CLUSTER_10240, PLAN_10240, True, 300),
                  ("175B 10240 GPU unfolded", CLUSTER_10240, PLAN_10240, False, 420)]
    report["cases"] = [case_subprocess(name, GPT3, cl, plan, fold, timeout)
                       for name, cl, plan, fold, timeout in cases]
    if not quick:
        report["scaling_micro-batches"] = scaling("micro-batches")
        report["scaling_stages"] = scaling("stages")
    report["sim_simulate"] = cold_warm_cli()
    by_case = {r["case"]: r for r in report["cases"]}

    def total(name: str) -> float | None:
        return by_case.get(name, {}).get("total_s")

    ratios = [r["ratio"] for r in report["engines"] if r["ratio"] is not None]
    summary = {
        "speedup_vs_simpy": min(ratios, default=None),
        "speedup_vs_simpy_by_program": {r["program"]: r["ratio"] for r in report["engines"]},
        "speedup_vs_simpy_with_freeze": min(r["ratio_with_freeze"] for r in report["engines"]),
        "speedup_vs_simpy_end_to_end": min(r["end_to_end_ratio"] for r in report["engines"]),
        "gpt3_175b_1024gpu_folded_s": total("175B 1024 GPU folded"),
        "gpt3_175b_1024gpu_unfolded_s": total("175B 1024 GPU unfolded"),
        "peak_rss_bytes": max((r.get("peak_rss_bytes", 0) for r in report["cases"]),
                              default=_peak_rss_bytes()),
        "sim_simulate_cold_s": report["sim_simulate"]["cold_s"],
        "sim_simulate_warm_s": report["sim_simulate"]["warm_s"],
        **report,
    }
    for key, name in (("gpt3_175b_1024gpu_folded_s", "175B 1024 GPU folded"),
                      ("gpt3_175b_1024gpu_unfolded_s", "175B 1024 GPU unfolded")):
        if summary[key] is None:
            summary[key + "_reason"] = by_case.get(name, {}).get("error", "not run")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(render(report))


if __name__ == "__main__":
    main()
