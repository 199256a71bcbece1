"""The committed T5 trace (tiny-t5, data parallel 2) validates end to end against the committed
profile: `sim validate --json` simulates the encoder-decoder plan with the profiled op times.

No torch workers run (the trace and profile are files in traces/), so it takes about a second.
It asserts what must hold whatever the machine's speed: the profile covers every T5 op shape
(no roofline fallback), the prediction's error is (pred − meas)/meas, and the per-stage busy
time is the simulated compute of the one stage.
"""

from __future__ import annotations

import json

import pytest

from trainsim.cli import main


def test_t5_trace_validates_against_the_committed_profile(capsys, traces_dir) -> None:
    """tiny-t5 dp2: every op estimate comes from the profile (exact or interpolated, none
    from the roofline), the iteration-time error is the signed relative difference, and the
    report covers the decoder's cross attention (attention kind measured and predicted)."""
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(traces_dir / "tiny-t5-dp2.json"), "--profile",
              str(traces_dir / "profile.csv"), "--json"])
    assert exc.value.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "tiny-t5" and out["plan"]["dp"] == 2
    assert out["cost_sources"].get("roofline", 0) == 0
    assert out["cost_sources"]["exact"] > 0
    meas, pred = out["iteration_time_measured_s"], out["iteration_time_predicted_s"]
    assert out["iteration_time_error"] == pytest.approx((pred - meas) / meas)
    kinds = {k["kind"]: k for k in out["op_kinds"]}
    assert kinds["attention"]["measured_s"] > 0 and kinds["attention"]["predicted_s"] > 0
    assert len(out["stages"]) == 1 and out["stages"][0]["busy_predicted_s"] > 0


def test_t5_trace_is_small_and_records_both_ranks(traces_dir) -> None:
    """The committed T5 trace stays well under 1 MB and holds both data-parallel ranks."""
    path = traces_dir / "tiny-t5-dp2.json"
    assert path.stat().st_size < 1_000_000
    data = json.loads(path.read_text())
    assert [r["replica"] for r in data["ranks"]] == [0, 1]
