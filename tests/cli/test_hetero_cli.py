"""`sim pareto` and `sim search --method hetero|fasop|uniform` from the command line: outputs,
money limits and one-line errors."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import pytest

Sim = Callable[[list[str]], tuple[int, str, str]]
"""The `sim` fixture (conftest.py): run `sim argv`, get (exit code, stdout, stderr)."""

SWEEP = ["pareto", "--model", "gpt3-125m", "--gpus", "A100-SXM4-40GB:0..1x4", "A10:0..1x4",
         "--global-batch", "16", "--workers", "1"]




def test_pareto_writes_the_front(tmp_path: Path, sim: Sim) -> None:
    code, out, err = sim([*SWEEP, "--out", str(tmp_path), "--tokens", "1e9"])
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "pareto.csv").open()))
    assert [r["composition"] for r in rows] == [
        "1x4xA10", "1x4xA100-SXM4-40GB", "1x4xA100-SXM4-40GB+1x4xA10"]
    assert all(float(r["tokens_per_s"]) > 0 for r in rows)
    assert any(r["on_front"] == "true" for r in rows)
    mixed = next(r for r in rows if r["mixed"] == "true")
    assert "node" not in mixed["error"] and mixed["plan"]
    assert (tmp_path / "pareto.html").read_text().count("<html") == 1
    assert "cheapest:" in out and "tokens in" in out
    code, _, err = sim([*SWEEP, "--out", str(tmp_path)])  # rerun: the CSV is ours
    assert code == 2 and "--force" in err  # ... but it carries no marker, so --force it
    code, _, err = sim([*SWEEP, "--out", str(tmp_path), "--force"])
    assert code == 0, err


def test_pareto_deadline_nobody_meets_says_how_close(sim: Sim
                                                     ) -> None:
    code, _, err = sim([*SWEEP, "--tokens", "1e12", "--deadline-days", "0.001"])
    assert code == 1
    line, = err.strip().splitlines()
    assert "no composition meets" in line and "x the deadline" in line


def test_pareto_with_no_plan_anywhere_exits_1(sim: Sim) -> None:
    """A sweep in which no composition can train the model says so and exits 1."""
    code, _, err = sim(["pareto", "--model", "gpt3-175b", "--global-batch", "64", "--gpus",
                        "A10:1..1x4", "--time-budget-s", "5"])
    assert code == 1
    assert "none of the 1 compositions has a plan that fits" in err.strip().splitlines()[-1]


@pytest.mark.parametrize(("args", "word"), [
    (["--gpus", "H900:0..2x8"], "H900"),
    (["--gpus", "A10:3..1x4"], "empty"),
    (["--gpus", "A10:0..0x4"], "no cluster"),
    (["--gpus", "A10 0..2"], "GPU:LO..HIxG"),
    (["--gpus", "A10:0..2x4", "--price", "A100-SXM4-40GB=3"], "--price"),
    (["--gpus", "A10:0..2x4", "--deadline-days", "3"], "--tokens"),
    (["--gpus", "A10:0..2x4", "--workers", "100000"], "--workers"),
    (["--gpus", "A10:0..2x4", "--global-batch", "1000000000000"], "global-batch"),
])
def test_pareto_bad_input_is_one_line(args: list[str], word: str,
                                      sim: Sim) -> None:
    base = ["pareto", "--model", "gpt3-125m", "--global-batch", "16"]
    if "--global-batch" in args:
        base = base[:-2]
    code, _, err = sim([*base, *args])
    assert code == 2
    line, = err.strip().splitlines()
    assert word in line


def test_search_hetero_prices_and_budget(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # the plan column unwrapped, whatever the plan
    base = ["search", "--method", "hetero", "--model", "gpt3-125m", "--cluster",
            "1x4xA100-SXM4-40GB+1x4xA10", "--global-batch", "16", "--tokens", "1e9"]
    code, out, err = sim(base)
    assert code == 0, err
    assert "node order" in out and "tokens in" in out
    dollars = float(out.split(" for $")[1].split()[0].replace(",", ""))
    code, out, _ = sim([*base, "--price", "A10=0", "--price", "A100-SXM4-40GB=0"])
    assert code == 0 and " for $0" in out
    code, _, err = sim([*base, "--budget-usd", f"{dollars / 2:.2f}"])
    assert code == 1
    line, = err.strip().splitlines()
    assert "no plan meets" in line and "x the budget" in line


@pytest.mark.parametrize("method", ["fasop", "uniform"])
def test_search_baselines_run(method: str, sim: Sim) -> None:
    code, out, err = sim(["search", "--method", method, "--model", "gpt3-125m", "--cluster",
                           "1x4xA100-SXM4-40GB+1x4xA10", "--global-batch", "16", "--top", "1"])
    assert code == 0, err
    assert method in out


def test_search_max_evals_counts_evaluations(sim: Sim) -> None:
    """`--max-evals N` stops a hetero-family search after N plans whatever the wall clock (the
    README test's budget: 5 s of wall clock ran out at different plans on a loaded machine),
    and the same search then runs the same plans."""
    import json

    base = ["search", "--method", "fasop", "--model", "gpt3-125m", "--cluster",
            "1x4xA100-SXM4-40GB+1x4xA10", "--global-batch", "16", "--max-evals", "3",
            "--time-budget-s", "3600", "--json"]
    runs = []
    for _ in range(2):
        code, out, err = sim(base)
        assert code == 0, err
        runs.append(json.loads(out))
    assert runs[0]["evaluated"] == 3
    assert runs[0]["best"] is not None
    for key in ("ranked", "improvements"):
        assert [(r["note"], r["step"]) for r in runs[0][key]] == \
            [(r["note"], r["step"]) for r in runs[1][key]]


@pytest.mark.parametrize(("args", "word"), [
    (["--method", "grid", "--max-evals", "3"], "--max-evals applies to hetero"),
    (["--method", "hetero", "--max-evals", "0"], "must be >= 1"),
])
def test_search_max_evals_bad_input_is_one_line(args: list[str], word: str, sim: Sim) -> None:
    code, _, err = sim(["search", "--model", "gpt3-125m", "--cluster",
                        "1x4xA100-SXM4-40GB+1x4xA10", "--global-batch", "16", *args])
    assert code == 2
    line, = err.strip().splitlines()
    assert word in line
