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


@pytest.fixture(scope="module")
def cycle(tmp_path_factory):
    """Profile micro-gpt on 2 processes and record a DP2 and a TP2 trace."""
    d = tmp_path_factory.mktemp("cycle")
    prof = d / "profile.csv"
    main_ok(["profile", "--device", "cpu", "--model", "micro-gpt", "--out", str(prof),
             "--warmup", "1", "--repeats", "2"])
    for plan in ("dp2", "tp2"):
        main_ok(["trace", "--model", "micro-gpt", "--plan", plan, "--iterations", "2",
                 "--warmup", "1", "--out", str(d / f"{plan}.json")])
    return d


def main_ok(argv: list[str]) -> None:
    """Run the CLI and require exit code 0."""
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None), f"sim {' '.join(argv)} exited {exc.code}"


def test_profile_has_ops_and_collectives(cycle):
    """The profile holds forward and backward rows of the zoo kinds and 2-process
    collectives, with the machine's metadata."""
    from trainsim.validate.profile_db import ProfileDB

    db = ProfileDB.load(cycle / "profile.csv")
    assert {"matmul", "layernorm", "softmax", "gelu", "cross_entropy", "embedding",
            "optimizer"} <= set(db.kinds())
    assert {r.kind for r in db.collectives()} >= {"all_reduce", "p2p"}
    assert all(r.group_size == 2 for r in db.collectives())
    assert db.meta["processes"] == 2 and db.meta["threads_per_process"] == 1


def test_profile_has_solo_timings_after_compute_rows_and_a_reference(cycle):
    """With 2 processes on CPU every op row also has a solo timing, the all-reduces are also
    timed after a GEMM, and the reference GEMM's time is in the metadata (as in each trace)."""
    from trainsim.validate.profile_db import ProfileDB

    db = ProfileDB.load(cycle / "profile.csv")
    ops = [r for r in db.rows if r.pass_ != "comm"]
    assert ops and all(r.solo_s > 0 for r in ops)
    assert any(r.kind == "all_reduce_after_compute" for r in db.collectives())
    assert db.meta["reference_gemm_s"] > 0
    trace = MeasuredTrace.load(cycle / "dp2.json")
    assert trace.machine["reference_gemm"] == db.meta["reference_gemm"]
    assert trace.machine["reference_gemm_s"] > 0


def test_trace_records_iterations_events_and_memory(cycle):
    """A DP2 trace has 2 measured iterations, 2 ranks with peak memory above the
    parameters' and Adam states' bytes, and op spans of the profiled iteration."""
    trace = MeasuredTrace.load(cycle / "dp2.json")
    assert len(trace.iteration_times_s) == 2
    assert len(trace.ranks) == 2
    for r in trace.ranks:
        assert r["peak_memory_bytes"] > r["state_bytes"] > 0
    assert {e["kind"] for e in trace.events} >= {"matmul", "layernorm"}


@pytest.mark.parametrize("plan", ["dp2", "tp2"])
def test_validate_json_reports_errors(cycle, plan, capsys):
    """`sim validate --json` prints measured and predicted iteration times, the signed
    relative error (= (pred - meas) / meas) and the peak-memory error; an HTML overlay is
    written."""
    html = cycle / f"{plan}.html"
    main_ok(["validate", str(cycle / f"{plan}.json"), "--profile", str(cycle / "profile.csv"),
             "--json", "--html", str(html), "--force"])
    out = json.loads(capsys.readouterr().out)
    meas, pred = out["iteration_time_measured_s"], out["iteration_time_predicted_s"]
    assert meas > 0 and pred > 0
    assert out["iteration_time_error"] == pytest.approx((pred - meas) / meas)
    assert math.isfinite(out["peak_memory_error"])
    assert out["cost_sources"].get("exact", 0) > 0
    assert "trainsim-overlay" in html.read_text()


def test_max_error_exit_code(cycle, capsys):
    """`--max-error 0` cannot be met (a prediction is never exact): exit code 1; a huge
    bound passes."""
    args = ["validate", str(cycle / "dp2.json"), "--profile", str(cycle / "profile.csv")]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--max-error", "0"])
    assert exc.value.code == 1
    main_ok([*args, "--max-error", "1000"])
    assert "iteration time" in capsys.readouterr().out
