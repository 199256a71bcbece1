"""The Oracle's fast path (shared lowering cache, instruction tapes, lean result) answers every
plan with the same Summary as the old path (fast=False: each plan from scratch, full SimResult),
over a planner-like stream that shares one Oracle per side."""

from __future__ import annotations

from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.oracle import Oracle
from trainsim.simulator.engine_numba import event_times, run_numba
from trainsim.simulator.result import lean_result
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

MODEL = get_model("gpt3-350m")
CLUSTER = parse_cluster("2x4xA100-SXM4-80GB")
STREAM = [
    {"dp": 8, "micro_batch_size": 2, "global_batch": 64, "seq_len": 512},
    {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 2, "global_batch": 32, "seq_len": 512},
    {"dp": 2, "tp": 2, "pp": 2, "micro_batch_size": 4, "global_batch": 32, "seq_len": 512,
     "recompute": "full"},
    {"dp": 1, "tp": 2, "pp": 4, "micro_batch_size": 1, "global_batch": 16, "seq_len": 512,
     "stage_layers": [4, 8, 6, 6]},
    {"dp": 2, "pp": 4, "micro_batch_size": 1, "global_batch": 16, "seq_len": 512,
     "schedule": "interleaved", "virtual_stages": 2},
    {"dp": 2, "pp": 4, "micro_batch_size": 1, "global_batch": 16, "seq_len": 512,
     "schedule": "zb-h1"},
    {"dp": 4, "tp": 2, "zero": 3, "micro_batch_size": 1, "global_batch": 8, "seq_len": 512},
    {"dp": 8, "micro_batch_size": 64, "global_batch": 512, "seq_len": 2048},  # OOM
]


def test_fast_and_old_oracles_agree_on_a_stream() -> None:
    fast = Oracle(MODEL, CLUSTER)
    old = Oracle(MODEL, CLUSTER, fast=False)
    unfolded = [Oracle(MODEL, CLUSTER, options=LoweringOptions(fold=False), fast=f)
                for f in (True, False)]
    for fields in STREAM:
        assert fast.evaluate(fields).to_dict() == old.evaluate(fields).to_dict(), fields
        a, b = (o.evaluate(fields).to_dict() for o in unfolded)
        assert a == b, fields
    assert any(fast.evaluate(f).oom for f in STREAM)


def test_the_lean_result_has_the_full_results_figures() -> None:
    plan = ParallelPlan.build(MODEL, CLUSTER, **STREAM[1])
    program = lower(MODEL, CLUSTER, plan)
    full = run_numba(program)
    start, end = event_times(program.freeze())
    lean = lean_result(program, start, end, engine="numba")
    assert lean.ranks == full.ranks
    for name in ("iteration_time_s", "samples_per_s", "tokens_per_s", "mfu", "bubble_fraction",
                 "peak_memory_bytes", "oom", "energy_j", "cost_usd"):
        assert getattr(lean, name) == getattr(full, name), name
