"""Saved plans describe their run: `sim simulate --plan FILE` alone reproduces it, flags beside
it override (each override printed), and search and energy write the same schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import trainsim
from trainsim.cli import main
from trainsim.workloads.plan import RUN_KEYS, ParallelPlan
from trainsim.workloads.plan_file import TRAINSIM_VERSION

RUN = ["--model", "gpt3-125m", "--cluster", "2xA100-SXM4-80GB"]


def _sim(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict, str]:
    with pytest.raises(SystemExit) as info:
        main(["simulate", *args, "--json"])
    out = capsys.readouterr()
    assert (info.value.code or 0) == 0, out.err
    return json.loads(out.out), out.err


def test_a_saved_plan_alone_reproduces_the_run(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    first, _ = _sim(capsys, *RUN, "--pp", "2", "--global-batch", "16", "--seq-len", "512",
                    "--save-plan", str(path))
    saved = json.loads(path.read_text())
    assert {k: saved[k] for k in RUN_KEYS if k in saved} == {
        "model": "gpt3-125m", "cluster": "2xA100-SXM4-80GB",
        "trainsim_version": TRAINSIM_VERSION}  # no --framework: none written
    assert (saved["global_batch"], saved["seq_len"], saved["dtype"]) == (16, 512, "fp16")
    again, err = _sim(capsys, "--plan", str(path))
    assert again == first and err == ""
    assert ParallelPlan.load(path).pp == 2  # the Python API reads the same file


def test_flags_beside_a_plan_override_it_and_say_so(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    _sim(capsys, *RUN, "--pp", "2", "--global-batch", "16", "--save-plan", str(path))
    doc, err = _sim(capsys, "--plan", str(path), "--global-batch", "32")
    assert doc["plan"]["global_batch"] == 32 and doc["plan"]["num_micro_batches"] == 32
    assert err.strip() == "override: --global-batch 32 (plan file: 16)"


def test_search_writes_the_same_schema(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    out = tmp_path / "o"
    with pytest.raises(SystemExit):
        main(["search", *RUN, "--global-batch", "8", "--time-budget-s", "20", "--out", str(out),
              "--json"])
    best = json.loads(capsys.readouterr().out)["best"]
    doc, _ = _sim(capsys, "--plan", str(out / "best_plan.json"))
    assert doc["model"] == "gpt3-125m" and doc["cluster"] == "2xA100-SXM4-80GB"
    assert doc["iteration_time_s"] == pytest.approx(best["iteration_time_s"], rel=1e-12)


def test_the_version_written_is_trainsims() -> None:
    assert TRAINSIM_VERSION == trainsim.__version__


HETERO = ["--model", "gpt3-125m", "--cluster", "1x4xA100-SXM4-40GB+1x4xA10"]


def test_a_searched_plan_keeps_the_prices_it_was_priced_with(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`sim search --price` priced the best plan at the given USD per GPU-hour, but
    best_plan.json dropped them and `sim simulate --plan` gave the catalog's cost (the bug
    hunt: 0.001166 instead of 0.000476 $/iteration). The file records them; simulate uses
    them, --price overrides (printed), --save-plan keeps them."""
    out = tmp_path / "o"
    with pytest.raises(SystemExit):
        main(["search", "--method", "hetero", *HETERO, "--global-batch", "32", "--max-evals",
              "20", "--price", "A100-SXM4-40GB=1", "--price", "A10=0.5", "--out", str(out),
              "--json"])
    best = json.loads(capsys.readouterr().out)["best"]
    path = out / "best_plan.json"
    assert json.loads(path.read_text())["prices"] == {"A10": 0.5, "A100-SXM4-40GB": 1.0}
    doc, err = _sim(capsys, "--plan", str(path))
    assert doc["cost_usd"] == pytest.approx(best["cost_usd"], rel=1e-12) and err == ""
    explicit, _ = _sim(capsys, *HETERO, "--plan", str(path), "--price", "A10=0.5",
                      "--price", "A100-SXM4-40GB=1", "--save-plan", str(tmp_path / "again.json"))
    assert explicit["cost_usd"] == pytest.approx(doc["cost_usd"])
    dearer, err = _sim(capsys, "--plan", str(tmp_path / "again.json"), "--price", "A10=1")
    assert dearer["cost_usd"] > doc["cost_usd"]
    assert err.strip() == "override: --price A10=1 (plan file: 0.5)"


def test_plan_files_without_prices_load_as_before(tmp_path: Path) -> None:
    """Older files (no "prices") read with prices None and price at the catalog; a file
    without --price writes none; a malformed "prices" is one PlanError naming it."""
    from trainsim.errors import PlanError
    from trainsim.workloads.plan_file import plan_file_text, read_plan_file

    plan = ParallelPlan(dp=2, global_batch=8)
    text = plan_file_text(plan, model="gpt3-125m", cluster="2xA100-SXM4-80GB")
    assert "prices" not in json.loads(text)
    old = tmp_path / "old.json"
    old.write_text(text)
    assert read_plan_file(old).prices is None and ParallelPlan.load(old) == plan
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(text), "prices": {"A10": "cheap"}}))
    with pytest.raises(PlanError, match="prices="):
        read_plan_file(bad)
    priced = tmp_path / "priced.json"
    priced.write_text(plan_file_text(plan, model="gpt3-125m", cluster="2xA100-SXM4-80GB",
                                     prices={"A100-SXM4-80GB": 2}))
    assert read_plan_file(priced).prices == {"A100-SXM4-80GB": 2.0}
    assert ParallelPlan.load(priced) == plan
