"""`sim energy frontier` and `sim energy pick`: JSON contract, errors, no overwrite."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from trainsim.search.energy_commands import app

HEADER = "stage,instruction,frequency,time,energy\n"
CSV = HEADER + "".join(
    f"{s},{inst},{f},{t},{e}\n"
    for s in (0, 1)
    for inst, base, ebase in (("forward", 0.002, 1.0), ("backward", 0.004, 2.0))
    for f, t, e in ((1410, base, ebase), (1200, base + 0.001, ebase * 0.8),
                    (1000, base + 0.002, ebase * 0.7)))


def test_frontier_json(tmp_path) -> None:
    """--json prints all_max, frontier (slowest first) and planner_s."""
    path = tmp_path / "p.csv"
    path.write_text(CSV)
    res = CliRunner().invoke(app, ["frontier", "--profile", str(path), "--microbatches", "2",
                                   "--blocking-power-w", "10", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc["all_max"]) == {"time_s", "energy_j"}
    times = [p["time_s"] for p in doc["frontier"]]
    assert times == sorted(times, reverse=True)
    assert doc["planner_s"] >= 0
    assert doc["all_max"]["time_s"] == min(times)


def test_pick_and_outputs_not_overwritten(tmp_path) -> None:
    """pick writes plans.json and frontier.html; a second run without --force exits 2."""
    path = tmp_path / "p.csv"
    path.write_text(CSV)
    out = tmp_path / "out"
    args = ["pick", "--straggler", "1.2", "--profile", str(path), "--microbatches", "2",
            "--blocking-power-w", "10", "--out", str(out), "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["pick"]["time_s"] <= doc["pick"]["deadline_s"]
    plans = json.loads((out / "plans.json").read_text())
    assert plans["plans"][0]["ranks"][0]["instructions"][0] == "0F0"
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2
    assert "--force" in again.output


def test_bad_profile_exit_2_and_nothing_written(tmp_path) -> None:
    """Negative energy: exit 2 with a one-line error naming the row; no plan written."""
    path = tmp_path / "p.csv"
    path.write_text(CSV.replace("1,backward,1000,0.006,1.4", "1,backward,1000,0.006,-1.4"))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["frontier", "--profile", str(path), "--microbatches", "2",
                                   "--gpu", "A40", "--out", str(out)])
    assert res.exit_code == 2
    assert "row 13" in res.output and "energy" in res.output
    assert not out.exists()
