"""`sim search` speaks plans in words, in GiB, and lists the files it wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim import api
from trainsim.cli import main
from trainsim.commands.search import plan_words


def test_plan_words_name_degrees_batches_and_recompute() -> None:
    model, hw = api.load_model("gpt3-125m"), api.load_cluster("4xV100-SXM2-32GB")
    plan = api.make_plan(model, hw, dp=2, tp=2, pp=1, micro_batch_size=4, global_batch=16,
                         recompute="selective")
    assert plan_words(plan) == "dp2 tp2 pp1 mb4×2, recompute selective"
    staged = api.make_plan(model, hw, pp=4, global_batch=8, stage_layers=[2, 4, 4, 2],
                           zero=1, dp=1)
    assert plan_words(staged) == "dp1 tp1 pp4 mb1×8, recompute none, layers 2/4/4/2, zero 1"


def test_table_shows_plans_in_gib_and_lists_written_files(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as info:
        main(["search", "--model", "gpt3-125m", "--cluster", "4xV100-SXM2-32GB",
              "--global-batch", "8", "--time-budget-s", "20", "--out", str(out)])
    assert (info.value.code or 0) == 0
    text = capsys.readouterr().out
    assert "peak mem (GiB)" in text and "dp" in text and "recompute" in text
    wrote = [line for line in text.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == 1
    for name in ("best_plan.json", "ranked.json", "search_log.json"):
        assert str(out / name) in wrote[0] and (out / name).is_file()
