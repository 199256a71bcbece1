"""End to end on 2 processes: sim profile → sim trace → sim validate (micro-gpt, few repeats).

Runs the real torch workers (gloo on 127.0.0.1), so it takes tens of seconds; the model is
the smallest validation model and every count is minimal. No timing is asserted — only that
each step produces well-formed output and that the prediction uses the measured profile.
"""

from __future__ import annotations

import json
import math

import pytest

from trainsim.cli import main
from trainsim.validate.trace_record import MeasuredTrace

# Every test here reads the session's end-to-end run (tests/conftest.py::e2e_run, ~20 s):
# profile.csv and the dp2.json / tp2.json traces of micro-gpt.
pytestmark = pytest.mark.slow


def main_ok(argv: list[str]) -> None:
    """Run the CLI and require exit code 0."""
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None), f"sim {' '.join(argv)} exited {exc.code}"


def test_profile_has_ops_and_collectives(e2e_run):
    """The profile holds forward and backward rows of the zoo kinds and 2-process
    collectives, with the machine's metadata."""
    from trainsim.validate.profile_db import ProfileDB

    db = ProfileDB.load(e2e_run / "profile.csv")
    assert {"matmul", "layernorm", "softmax", "gelu", "cross_entropy", "embedding",
            "optimizer"} <= set(db.kinds())
    assert {r.kind for r in db.collectives()} >= {"all_reduce", "p2p"}
    assert all(r.group_size == 2 for r in db.collectives())
    assert db.meta["processes"] == 2 and db.meta["threads_per_process"] == 1
    whole = db.whole_model("micro-gpt")
    assert whole is not None and whole.shape == (db.meta["micro_batch_size"],)
    assert whole.time_s > 0 and whole.solo_s > 0 and "model:micro-gpt" not in db.kinds()


def test_profile_has_solo_timings_after_compute_rows_and_a_reference(e2e_run):
    """With 2 processes on CPU every op row also has a solo timing, the all-reduces are also
    timed after GEMMs, and the reference GEMM's time is in the metadata (as in each trace)."""
    from trainsim.validate.profile_db import ProfileDB

    db = ProfileDB.load(e2e_run / "profile.csv")
    ops = db.op_rows() + [db.whole_model("micro-gpt")]
    assert ops and all(r is not None and r.solo_s > 0 for r in ops)
    # the ops inside the whole model, forwards and backwards, by clocks (op_clock.py)
    b = db.meta["micro_batch_size"]
    assert {"matmul", "layernorm"} <= set(db.in_model("micro-gpt", "fwd_in_model", b))
    assert {"matmul", "layernorm"} <= set(db.in_model("micro-gpt", "bwd_in_model", b))
    assert not db.in_model("micro-gpt", "fwd_in_model", b + 1)
    assert any(r.kind == "all_reduce_after_compute" for r in db.collectives())
    assert db.meta["reference_gemm_s"] > 0
    trace = MeasuredTrace.load(e2e_run / "dp2.json")
    assert trace.machine["reference_gemm"] == db.meta["reference_gemm"]
    assert trace.machine["reference_gemm_s"] > 0


def test_trace_records_iterations_events_and_memory(e2e_run):
    """A DP2 trace has 2 measured iterations, 2 ranks with peak memory above the
    parameters' and Adam states' bytes, and op spans of the profiled iteration."""
    trace = MeasuredTrace.load(e2e_run / "dp2.json")
    assert len(trace.iteration_times_s) == 2
    assert len(trace.ranks) == 2
    for r in trace.ranks:
        assert r["peak_memory_bytes"] > r["state_bytes"] > 0
    assert {e["kind"] for e in trace.events} >= {"matmul", "layernorm"}
    # the per-kind breakdown is read by clocks in the extra iterations, not by the profiler
    assert trace.machine["breakdown"].startswith("median of clocked iterations")
    # each rank ran on a core of its own where the machine has one per rank
    from trainsim.validate.devices import cpu_binding, worker_cores

    assert trace.machine["cpu_binding"] == cpu_binding(worker_cores("cpu", 2))
    for r in trace.ranks:
        assert {"matmul", "layernorm", "comm", "optimizer"} <= set(r["kind_s"])


@pytest.mark.parametrize("plan", ["dp2", "tp2"])
def test_validate_json_reports_errors(e2e_run, plan, capsys, tmp_path):
    """`sim validate --json` prints measured and predicted iteration times, the signed
    relative error (= (pred - meas) / meas) and the peak-memory error; an HTML overlay is
    written."""
    html = tmp_path / f"{plan}.html"
    main_ok(["validate", str(e2e_run / f"{plan}.json"), "--profile",
             str(e2e_run / "profile.csv"), "--json", "--html", str(html), "--force"])
    out = json.loads(capsys.readouterr().out)
    meas, pred = out["iteration_time_measured_s"], out["iteration_time_predicted_s"]
    assert meas > 0 and pred > 0
    assert out["iteration_time_error"] == pytest.approx((pred - meas) / meas)
    assert math.isfinite(out["peak_memory_error"])
    assert out["cost_sources"].get("exact", 0) > 0
    assert "trainsim-overlay" in html.read_text()


def test_max_error_exit_code(e2e_run, capsys):
    """`--max-error 0` cannot be met (a prediction is never exact): exit code 1; a huge
    bound passes."""
    args = ["validate", str(e2e_run / "dp2.json"), "--profile", str(e2e_run / "profile.csv")]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--max-error", "0"])
    assert exc.value.code == 1
    main_ok([*args, "--max-error", "1000"])
    assert "iteration time" in capsys.readouterr().out
