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
    code, _, err = _run(capsys, "--method", "alpa", *ARGS)
    assert code == 2 and "grid" in err and "aceso" in err
