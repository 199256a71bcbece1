"""`sim search`: --json prints best (plan, samples/s, iteration time, peak memory), evaluated
and search_s; --out writes the exports and refuses to overwrite; bad input is one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.cli import main

ARGS = ["--model", "gpt3-125m", "--cluster", "4xV100-SXM2-32GB", "--global-batch", "8",
        "--time-budget-s", "20"]


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["search", *args])
    out = capsys.readouterr()
    return info.value.code or 0, out.out, out.err


def test_grid_json_has_the_documented_keys(capsys) -> None:
    """--json: best.plan, best.samples_per_s = 8 / best.iteration_time_s, evaluated, search_s."""
    code, out, _ = _run(capsys, "--method", "grid", *ARGS, "--json")
    assert code == 0
    data = json.loads(out)
    best = data["best"]
    assert {"plan", "samples_per_s", "iteration_time_s", "peak_memory_bytes"} <= set(best)
    assert best["samples_per_s"] == pytest.approx(8 / best["iteration_time_s"])
    assert data["evaluated"] > 0 and data["search_s"] >= 0


@pytest.mark.slow
def test_out_writes_exports_and_refuses_to_overwrite(capsys, tmp_path: Path) -> None:
    """--out writes best_plan.json (a plan), aceso_config.json, megatron_flags.txt; a second
    run without --force exits 2 with one line."""
    out = tmp_path / "o"
    code, _, _ = _run(capsys, "--method", "aceso", *ARGS[:-1], "2", "--out", str(out),
                      "--json", "--memory-limit-gb", "8")
    assert code == 0
    plan = json.loads((out / "best_plan.json").read_text())
    assert "pp" in plan and json.loads((out / "aceso_config.json").read_text())["num_stages"]
    assert (out / "megatron_flags.txt").read_text().strip()
    code, _, err = _run(capsys, "--method", "grid", *ARGS, "--out", str(out))
    assert code == 2 and "--force" in err and "Traceback" not in err


def test_unknown_method_is_one_error_line(capsys) -> None:
    """An unknown --method exits 2 naming the valid ones."""
    code, _, err = _run(capsys, "--method", "annealing", *ARGS)
    assert code == 2 and "grid" in err and "aceso" in err
    assert all(m in err for m in ("intraop", "intraop-pp", "alpa", "megatron"))


def test_mesh_without_an_intraop_method_is_refused(capsys) -> None:
    """--mesh shapes the intra-op searches only; with grid it would be ignored."""
    code, _, err = _run(capsys, "--mesh", "2x2", *ARGS)
    assert code == 2 and "--mesh applies to the intra-op methods" in err


def test_out_that_is_a_file_is_one_error_line(capsys, tmp_path: Path) -> None:
    """--out naming an existing file exits 2 with one line naming --out (it used to be a
    FileExistsError traceback after the whole search); the file is untouched."""
    target = tmp_path / "f.txt"
    target.write_text("keep me")
    code, _, err = _run(capsys, *ARGS, "--out", str(target))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--out" in lines[0] and "Traceback" not in err
    assert target.read_text() == "keep me"


@pytest.mark.slow
def test_out_files_are_byte_identical_across_runs(capsys, tmp_path: Path) -> None:
    """The same search twice writes the same bytes: search_log.json and ranked.json hold no
    wall-clock field (elapsed_s stays in the printed JSON's improvements)."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    for out in dirs:
        code, stdout, _ = _run(capsys, "--method", "grid", *ARGS, "--out", str(out), "--json")
        assert code == 0
        assert all("elapsed_s" in r for r in json.loads(stdout)["improvements"])
    names = sorted(p.name for p in dirs[0].iterdir())
    assert "search_log.json" in names and "ranked.json" in names
    for name in names:
        assert (dirs[0] / name).read_bytes() == (dirs[1] / name).read_bytes(), name
    log = json.loads((dirs[0] / "search_log.json").read_text())
    assert log and all("elapsed_s" not in r for r in log)


NO_FIT = ["--model", "gpt3-175b", "--cluster", "1x8xA100-SXM4-80GB", "--global-batch", "8",
          "--time-budget-s", "20"]


@pytest.mark.slow
def test_no_feasible_plan_exits_1_with_a_reason(capsys) -> None:
    """GPT-3 175B on 8 × 80 GB: 175e9 parameters × 16 B of mixed-precision Adam state is
    2.8 TB > 8 × 80 GiB, so nothing fits. Exit 1 (not 2: the input is valid) with one line
    giving the count evaluated and the smallest peak against the limit; no table."""
    code, out, err = _run(capsys, *NO_FIT)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: no candidate fits")
    assert "evaluated" in lines[0] and "smallest peak" in lines[0] and "GB" in lines[0]
    assert "samples/s" not in out


@pytest.mark.slow
def test_no_feasible_plan_json_has_null_best(capsys) -> None:
    """Under --json the object is still printed, with best null and an empty ranking."""
    code, out, err = _run(capsys, *NO_FIT, "--json")
    assert code == 1
    data = json.loads(out)
    assert data["best"] is None and data["ranked"] == [] and data["evaluated"] > 0
    assert "no candidate fits" in err
