"""`sim simulate`: JSON summary, output files that are never overwritten silently, plan files
with flag overrides, torch-imported schedules, and one-line errors for impossible plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.cli import main

SMALL = ["--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB", "--seq-len", "128",
         "--global-batch", "8"]


def _sim_json(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", *args, "--json"])
    assert exit_info.value.code in (0, None)
    return json.loads(capsys.readouterr().out)


def _sim_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err and "Traceback" not in err
    return err


def test_json_summary_has_the_documented_keys(capsys) -> None:
    """--json prints one object with time, throughput, MFU, bubble, memory, OOM, energy and a
    per-rank list; samples/s is the global batch over the iteration time."""
    out = _sim_json(capsys, *SMALL, "--pp", "4")
    for key in ("iteration_time_s", "samples_per_s", "tokens_per_s", "mfu", "bubble_fraction",
                "peak_memory_bytes", "oom", "energy_j", "per_rank"):
        assert key in out
    assert isinstance(out["per_rank"], list) and len(out["per_rank"]) == 4
    assert out["samples_per_s"] == pytest.approx(8 / out["iteration_time_s"])
    assert out["tokens_per_s"] == pytest.approx(8 * 128 / out["iteration_time_s"])
    assert 0 < out["mfu"] < 1 and out["oom"] is False


def test_timeline_and_trace_files_are_not_overwritten_without_force(capsys, tmp_path) -> None:
    """--timeline and --trace write files; a second run refuses to overwrite them (exit 2,
    one line naming the file) unless --force is given."""
    html, trace = tmp_path / "t.html", tmp_path / "t.json"
    _sim_json(capsys, *SMALL, "--pp", "2", "--dp", "2", "--timeline", str(html),
              "--trace", str(trace))
    assert html.read_text().lstrip().lower().startswith("<html") or "plotly" in html.read_text()
    events = json.loads(trace.read_text())
    assert events
    trace.write_text("mine")
    err = _sim_error(capsys, *SMALL, "--pp", "2", "--dp", "2", "--trace", str(trace))
    assert str(trace) in err and "--force" in err and len(err.splitlines()) == 1
    assert trace.read_text() == "mine"
    _sim_json(capsys, *SMALL, "--pp", "2", "--dp", "2", "--trace", str(trace), "--force")
    assert trace.read_text() != "mine"


def test_plan_file_with_flag_overrides(capsys, tmp_path: Path) -> None:
    """--plan loads a plan; flags given on the command line override its fields."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"dp": 1, "tp": 1, "pp": 4, "global_batch": 8, "seq_len": 128,
                                "schedule": "gpipe"}))
    base = _sim_json(capsys, "--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB",
                     "--plan", str(plan))
    assert base["plan"]["schedule"] == "gpipe" and base["plan"]["pp"] == 4
    over = _sim_json(capsys, "--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB",
                     "--plan", str(plan), "--schedule", "1f1b", "--global-batch", "16")
    assert over["plan"]["schedule"] == "1f1b" and over["plan"]["num_micro_batches"] == 16
    assert over["plan"]["pp"] == 4


@pytest.mark.slow  # imports torch.distributed.pipelining
def test_torch_schedule_matches_builtin_1f1b(capsys) -> None:
    """torch:Schedule1F1B imports the same per-rank order as the built-in 1f1b, so the
    simulated iteration is identical."""
    pytest.importorskip("torch")
    ours = _sim_json(capsys, *SMALL, "--pp", "4", "--schedule", "1f1b")
    torch = _sim_json(capsys, *SMALL, "--pp", "4", "--schedule", "torch:Schedule1F1B")
    assert torch["iteration_time_s"] == ours["iteration_time_s"]
    assert torch["peak_memory_bytes"] == ours["peak_memory_bytes"]


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "bert-base", "--cluster", "8xA100-SXM4-80GB", "--tp", "8"],
     "plan.tp=8 does not divide model.num_heads=12"),
    (["--model", "gpt3-125m", "--cluster", "2x8xA100-SXM4-80GB", "--pp", "16"],
     "exceeds the model's 12 layers"),
    (["--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB", "--dp", "2", "--pp", "1"],
     "but the cluster has 4 GPUs"),
    (["--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB", "--dp", "4",
      "--micro-batch", "2", "--global-batch", "12"],
     "global_batch=12 is not divisible by micro_batch_size×dp=2×4=8"),
    (["--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB", "--pp", "4", "--schedule", "2f2b"],
     "schedule"),
    (["--model", "gpt3-125m", "--cluster", "4xV100-SXM2-32GB", "--pp", "4", "--freq-mhz", "3000"],
     "outside V100-SXM2-32GB's SM clock range"),
])
def test_invalid_plans_exit_2_with_one_line(capsys, args, message) -> None:
    """An impossible plan ends with exit code 2 and one line saying what is wrong."""
    err = _sim_error(capsys, *args)
    assert message in err
    assert len(err.splitlines()) == 1


def test_a_rounded_default_global_batch_is_noted(sim) -> None:
    """The default global batch (512) rounded to dp × micro-batch is said on stderr, not
    changed silently; a batch the user gives is not noted."""
    args = ["simulate", "--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB", "--seq-len",
            "128", "--pp", "4", "--json"]
    code, out, err = sim([*args, "--micro-batch", "3"])
    assert code == 0 and json.loads(out)["plan"]["global_batch"] == 513
    assert "note: global batch 513: the default 512 rounded to a multiple of dp × " \
           "micro-batch = 1 × 3" in err
    code, out, err = sim([*args, "--micro-batch", "3", "--global-batch", "96"])
    assert code == 0 and "note" not in err


def test_degrees_the_cluster_cannot_hold_are_named_before_the_batch(sim) -> None:
    """--dp 3 on 4 GPUs names the GPU count, not a global batch that would not help."""
    code, _, err = sim(["simulate", "--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB",
                        "--dp", "3", "--global-batch", "32"])
    assert code == 2 and "dp×tp×pp = 3×1×1 = 3 but the cluster has 4 GPUs" in err
