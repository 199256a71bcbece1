"""`sim energy frontier` and `sim energy pick`: JSON contract, errors, no overwrite."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainsim.commands.energy import app

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


def _drop(prefix: str) -> str:
    return "".join(line for line in CSV.splitlines(True) if not line.startswith(prefix))


@pytest.mark.parametrize(("text", "needles"), [
    (CSV.replace("1,backward,1000,0.006,1.4", "1,backward,1000,0.006,-1.4"),
     ("row 13", "energy")),
    ("".join(("2" + line[1:]) if line.startswith("1,") else line
             for line in CSV.splitlines(True)), ("stage 1", "forward")),
    (_drop("1,backward"), ("stage 1", "'backward'")),
    (CSV.replace("0,forward,1410,0.002,1.0", "0,forward,1410,0.009,1.0"),
     ("row 2", "time must fall")),
])
@pytest.mark.parametrize("command", [["frontier"], ["pick", "--straggler", "1.2"],
                                     ["pick", "--straggler-table"]])
def test_bad_profile_exit_2_and_nothing_written(tmp_path, text: str, needles: tuple[str, ...],
                                                command: list[str]) -> None:
    """Negative energy, a missing stage, a stage missing an instruction, non-monotone time:
    every command exits 2 with one line naming the row (or the missing stage and
    instruction); no plan is written."""
    path = tmp_path / "p.csv"
    path.write_text(text)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, [*command, "--profile", str(path), "--microbatches", "2",
                                   "--gpu", "A40", "--out", str(out)])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1
    for needle in needles:
        assert needle in res.output
    assert not out.exists()


def test_straggler_table_json_and_text(tmp_path) -> None:
    """--straggler-table alone: one row per slowdown 1.0, 1.1, …, 1.5 with T′ = factor ×
    T_allmax, each plan finishing by T′, saving = 1 − energy / all-max energy; the 1.0 row is
    the intrinsic block's saving at the all-max time. The text form prints the six rows."""
    path = _csv(tmp_path)
    base = ["pick", "--straggler-table", "--profile", str(path), "--microbatches", "3",
            "--blocking-power-w", "10"]
    res = CliRunner().invoke(app, [*base, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert "pick" not in doc
    rows = doc["straggler_table"]
    t_max = doc["all_max"]["time_s"]
    assert [round(r["slowdown"], 9) for r in rows] == [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    for r in rows:
        assert r["deadline_s"] == pytest.approx(r["slowdown"] * t_max)
        assert r["time_s"] <= r["deadline_s"] + 1e-12
        assert r["saving"] == pytest.approx(1 - r["energy_j"] / r["all_max_energy_j"])
        assert r["saving"] >= 0
    assert rows[0]["saving"] == pytest.approx(doc["intrinsic"]["saving_at_all_max_time"])
    assert doc["intrinsic_saving"] == doc["intrinsic"]["saving"]
    text = CliRunner().invoke(app, base)
    assert text.exit_code == 0, text.output
    assert sum(1 for line in text.output.splitlines() if line.endswith("%")) == 6


def test_pick_without_target_is_one_error_line(tmp_path) -> None:
    """pick with none of --straggler, --deadline-s, --straggler-table: exit 2, one line."""
    path = _csv(tmp_path)
    res = CliRunner().invoke(app, ["pick", "--profile", str(path), "--microbatches", "2",
                                   "--blocking-power-w", "10"])
    assert res.exit_code == 2
    assert "--straggler-table" in res.output
    assert len(res.output.strip().splitlines()) == 1


def _csv(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(CSV)
    return path


def test_pick_infinite_straggler_is_one_error_line(tmp_path) -> None:
    """--straggler inf / nan and --deadline-s inf exit 2 with one line naming the option
    (they used to print NaN/Infinity, which is not JSON, and "saving nan%")."""
    path = _csv(tmp_path)
    for opt, value in (("--straggler", "inf"), ("--straggler", "nan"),
                       ("--deadline-s", "inf")):
        res = CliRunner().invoke(app, ["pick", opt, value, "--profile", str(path),
                                       "--microbatches", "2", "--blocking-power-w", "10",
                                       "--json"])
        assert res.exit_code == 2, res.output
        assert opt in res.output and "finite" in res.output
        assert len(res.output.strip().splitlines()) == 1


def test_pick_json_is_strict(tmp_path) -> None:
    """The printed JSON parses under a parser that rejects NaN and Infinity."""
    path = _csv(tmp_path)
    res = CliRunner().invoke(app, ["pick", "--straggler", "1.5", "--profile", str(path),
                                   "--microbatches", "2", "--blocking-power-w", "10", "--json"])
    assert res.exit_code == 0, res.output

    def refuse(token: str) -> None:
        raise ValueError(token)

    doc = json.loads(res.output, parse_constant=refuse)
    assert 0.0 <= doc["pick"]["saving"] < 1.0


def test_out_that_is_a_file_is_one_error_line(tmp_path) -> None:
    """--out naming an existing file (not a folder) exits 2 naming --out, no traceback."""
    path = _csv(tmp_path)
    target = tmp_path / "f.txt"
    target.write_text("keep me")
    res = CliRunner().invoke(app, ["frontier", "--profile", str(path), "--microbatches", "2",
                                   "--blocking-power-w", "10", "--out", str(target)])
    assert res.exit_code == 2
    assert "--out" in res.output and "is an existing file" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert target.read_text() == "keep me"


def test_out_files_are_byte_identical_across_runs(tmp_path) -> None:
    """Two identical runs write identical plans.json and frontier.html (no wall clock in
    the files; planner_s stays in the printed JSON)."""
    path = _csv(tmp_path)
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        res = CliRunner().invoke(app, ["pick", "--straggler", "1.2", "--profile", str(path),
                                       "--microbatches", "3", "--blocking-power-w", "10",
                                       "--out", str(out), "--json"])
        assert res.exit_code == 0, res.output
        assert "planner_s" in json.loads(res.output)
        outs.append(out)
    for name in ("plans.json", "frontier.html"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    assert "planner_s" not in (outs[0] / "plans.json").read_text()


def test_large_work_prints_a_unit_hint_on_stderr(tmp_path, monkeypatch, capsys) -> None:
    """When steps × instructions exceed LARGE_WORK, one hint line on stderr suggests a larger
    --unit-s; stdout stays one JSON object."""
    from trainsim.cli import main
    from trainsim.commands import energy as energy_commands

    path = _csv(tmp_path)
    monkeypatch.setattr(energy_commands, "LARGE_WORK", 0)
    with pytest.raises(SystemExit) as info:
        main(["energy", "frontier", "--profile", str(path), "--microbatches", "2",
              "--blocking-power-w", "10", "--json"])
    assert (info.value.code or 0) == 0
    out = capsys.readouterr()
    json.loads(out.out)
    hint = [line for line in out.err.splitlines() if "--unit-s" in line]
    assert len(hint) == 1 and "crashing steps" in hint[0]


def test_hint_threshold() -> None:
    """No hint for small work; the hint names the step and instruction counts."""
    from trainsim.commands.energy import LARGE_WORK, _hint

    assert _hint(10, 10, 1e-3) is None
    line = _hint(int(LARGE_WORK), 2, 1e-3)
    assert line is not None and f"{int(LARGE_WORK):,}" in line and "2 instructions" in line


def test_an_hour_of_crashing_is_refused_before_it_is_set_up(tmp_path) -> None:
    """A --unit-s so fine that crashing would take over an hour is refused with the estimate
    and a unit that would do, before the planner prepares it (1e-11 s took minutes to)."""
    path = tmp_path / "p.csv"
    path.write_text(CSV)
    res = CliRunner().invoke(app, ["frontier", "--profile", str(path), "--microbatches", "2",
                                   "--blocking-power-w", "10", "--unit-s", "1e-12"])
    assert res.exit_code == 2
    assert "crashing steps over" in res.output and "minutes of work; give --unit-s" in res.output


def test_gpu_in_model_mode_is_refused() -> None:
    """--gpu names the blocking power of a --profile CSV; with --model it would be ignored."""
    res = CliRunner().invoke(app, ["frontier", "--model", "gpt3-125m", "--cluster",
                                   "2xA100-SXM4-80GB", "--pp", "2", "--microbatches", "2",
                                   "--gpu", "FOO"])
    assert res.exit_code == 2 and "--gpu FOO: applies to --profile mode" in res.output


def test_over_an_hour_at_a_coarse_unit_is_refused_at_the_first_tick(tmp_path, monkeypatch
                                                                    ) -> None:
    """At units coarser than the estimate's, the first progress tick refuses the work (before
    any crashing step), so the command does not prepare it twice."""
    from trainsim.commands import energy as energy_commands

    path = tmp_path / "p.csv"
    path.write_text(CSV)
    monkeypatch.setattr(energy_commands, "LARGE_WORK", 1)
    monkeypatch.setattr(energy_commands, "MAX_WORK", 1)
    res = CliRunner().invoke(app, ["frontier", "--profile", str(path), "--microbatches", "2",
                                   "--blocking-power-w", "10"])
    assert res.exit_code == 2 and "minutes of work; give --unit-s" in res.output


def test_the_frontiers_fastest_plan_is_no_worse_than_envpipes() -> None:
    """Model mode on a small model (3.4 ms forwards): with Lowtime's 1 ms quantum the fastest
    frontier plan spent 54.89 J where EnvPipe's plan at the same time spends 54.65 J (the
    planner bug hunt); the default quantum is now 5 % of the shortest instruction."""
    res = CliRunner().invoke(app, ["frontier", "--model", "gpt3-125m", "--cluster",
                                   "4xA100-SXM4-80GB", "--pp", "2", "--dp", "2",
                                   "--microbatches", "4", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    for name, base in doc["baselines"].items():
        by_then = [p["energy_j"] for p in doc["frontier"]
                   if p["time_s"] <= base["time_s"] * (1 + 1e-12)]
        assert by_then and min(by_then) <= base["energy_j"] * (1 + 1e-6), name


def test_default_quantum_resolves_the_shortest_instruction() -> None:
    from trainsim.search.energy.point import DEFAULT_UNIT_S, default_unit_s

    assert default_unit_s(0.1) == DEFAULT_UNIT_S  # Perseus's profiles: 45-115 ms stages
    assert default_unit_s(0.004) == pytest.approx(0.0002)
    assert default_unit_s(0.0) == DEFAULT_UNIT_S


@pytest.mark.parametrize("mode", [["--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB"],
                                  ["--profile", "{csv}", "--blocking-power-w", "10"]])
def test_zero_microbatches_names_the_flag(tmp_path, mode: list[str]) -> None:
    """The error names --microbatches, not the plan field behind it (bug hunt 4)."""
    path = tmp_path / "p.csv"
    path.write_text(CSV)
    args = [a.replace("{csv}", str(path)) for a in mode]
    res = CliRunner().invoke(app, ["frontier", *args, "--microbatches", "0"])
    assert res.exit_code == 2
    assert "--microbatches 0 must be an integer >= 1" in res.output
