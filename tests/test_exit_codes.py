"""Exit codes (`sim --help`, README): 2 bad input, 3 a plan that does not fit in memory, and
output paths refused before any work starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.cli import main
from trainsim.hwmodels.cluster import Cluster
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan

REPO = Path(__file__).resolve().parents[1]

OOM_RUN = ["simulate", "--model", "gpt3-13b", "--cluster", "2xV100-SXM2-32GB", "--dp", "2",
           "--global-batch", "8"]
"""GPT-3 13B replicated on two 32 GB V100s: 16 bytes/parameter of weights, gradients and Adam
states alone are ~190 GiB per GPU."""


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def test_a_plan_that_does_not_fit_exits_3_with_one_line(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    code, out, err = _run(capsys, *OOM_RUN, "--json")
    assert code == 3 and '"oom": true' in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "rank 0 needs" in lines[0] and "capacity 32.00 GiB" in lines[0]


def test_allow_oom_reports_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, *OOM_RUN, "--json", "--allow-oom")
    assert code == 0 and '"oom": true' in out and err == ""


@pytest.mark.parametrize("flag", ["--timeline", "--trace", "--save-plan"])
def test_an_output_in_a_missing_folder_gets_the_folder(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str) -> None:
    """File outputs make their missing folders, as `sim trace --out` and every `--out`
    folder do (one rule for every command)."""
    target = tmp_path / "runs" / "a" / "out.file"
    code, _, err = _run(capsys, "simulate", "--model", "gpt3-125m", "--global-batch", "4",
                        flag, str(target))
    assert code == 0, err
    assert target.is_file()


def test_a_refused_run_leaves_no_folder_behind(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    """Output folders are made when written: a run refused after the timeline's check (here
    on the trace, which exists) makes none."""
    (tmp_path / "existing.json").write_text("{}")
    code, _, err = _run(capsys, "simulate", "--model", "gpt3-125m", "--global-batch", "4",
                        "--timeline", str(tmp_path / "new" / "t.html"),
                        "--trace", str(tmp_path / "existing.json"))
    assert code == 2 and "exists" in err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("flag", ["--timeline", "--trace", "--save-plan"])
def test_an_output_whose_folder_cannot_be_made_is_refused_before_the_run(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str) -> None:
    (tmp_path / "a-file").write_text("x")
    code, out, err = _run(capsys, "simulate", "--model", "gpt3-125m", "--global-batch", "4",
                          flag, str(tmp_path / "a-file" / "sub" / "out.file"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "is not a folder" in err and flag.lstrip("-") in err
    assert not (tmp_path / "a-file").is_dir()


def test_an_output_that_is_a_folder_is_refused(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    code, _, err = _run(capsys, "simulate", "--model", "gpt3-125m", "--global-batch", "4",
                        "--timeline", str(tmp_path))
    assert code == 2 and "is a folder" in err


@pytest.mark.parametrize("kw", [
    {"model": "gpt3-1.3b", "cluster": "4xV100-SXM2-32GB", "global_batch": 512},
    {"model": "gpt3-125m", "cluster": "2x4xA100-SXM4-40GB", "pp": 2, "tp": 2, "dp": 2,
     "global_batch": 64, "schedule": "interleaved", "virtual_stages": 2},
    {"model": "gpt3-125m", "cluster": "4xV100-SXM2-32GB", "pp": 4, "global_batch": 60,
     "schedule": "zb-h1"},
])
def test_the_work_estimate_counts_the_tasks_lowering_makes(kw: dict[str, object]) -> None:
    from trainsim import api
    from trainsim.workloads.lowering import lower

    fields = dict(kw)
    model, hw = api.load_model(str(fields.pop("model"))), api.load_cluster(str(fields.pop("cluster")))
    plan = api.make_plan(model, hw, **fields)
    for unfold in (False, True):
        options = api.lowering_options(unfold=unfold)
        assert api.estimate_tasks(model, hw, plan, options) == lower(model, hw, plan,
                                                                     options).num_tasks


def test_a_run_too_big_to_finish_is_refused_before_it_starts(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--global-batch 10^12` used to run forever; now one line with the estimate."""
    code, out, err = _run(capsys, "simulate", "--global-batch", str(10**12))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--max-tasks" in err and "1,000,000,000,000 micro" in err


def test_max_tasks_lets_a_user_choose(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "simulate", "--model", "gpt3-125m", "--global-batch", "64",
                        "--max-tasks", "100", "--json")
    assert code == 2 and "over --max-tasks 100" in err
    code, _, _ = _run(capsys, "simulate", "--model", "gpt3-125m", "--global-batch", "64",
                      "--max-tasks", "100000", "--json")
    assert code == 0


@pytest.mark.parametrize("args, field", [
    (["validate", str(REPO / "traces/tiny-gpt-dp2.json"), "--max-error", "-1"], "--max-error"),
    (["simulate", "--global-batch", "abc"], "--global-batch"),
    (["simulate", "--max-tasks", "0"], "--max-tasks"),
    (["nosuch"], "nosuch"),
])
def test_usage_errors_are_one_line_naming_the_field(capsys: pytest.CaptureFixture[str],
                                                    args: list[str], field: str) -> None:
    code, out, err = _run(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and field in err


def test_a_cpu_profile_is_refused_for_a_gpu_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    """It used to give MFU 0.000 without a word."""
    code, out, err = _run(capsys, "simulate", "--model", "tiny-gpt", "--cluster",
                          "2xV100-SXM2-32GB", "--dp", "2", "--profile", str(REPO / "traces/profile.csv"))
    assert code == 2 and out == "" and "measured on this CPU" in err


def test_zero_micro_batch_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (found by tests/test_fuzz_cli.py): `--micro-batch 0` without --global-batch
    divided by zero while choosing the default global batch."""
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--micro-batch", "0"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "micro_batch_size=0" in err and len(err.splitlines()) == 1


def test_version_prints_and_exits_0(sim) -> None:
    from trainsim.workloads.plan_file import TRAINSIM_VERSION

    code, out, _ = sim(["--version"])
    assert code == 0 and out.strip() == f"trainsim {TRAINSIM_VERSION}"


def _replica_list_plan() -> tuple[ModelSpec, Cluster, ParallelPlan]:
    """dp 2 pp 2 with each replica's own variable micro-batches (what `sim microbatch` saves):
    9 and 8 micro-batches, more than the estimate's 2·k = 8, so it used to extrapolate."""
    from trainsim import api
    from trainsim.workloads.plan import MicroBatch

    model, hw = api.load_model("gpt3-125m"), api.load_cluster("1x4xA100-SXM4-40GB")
    lists = (tuple(MicroBatch(batch_size=1 + i % 3, seq_len=256 * (1 + i % 4)) for i in range(9)),
             tuple(MicroBatch(batch_size=2, seq_len=512) for _ in range(8)))
    return model, hw, ParallelPlan.build(model, hw, dp=2, pp=2, replica_micro_batches=lists)


def test_the_work_estimate_lowers_replica_micro_batch_lists() -> None:
    """estimate_tasks rebuilt the plan at another global_batch but kept the lists: PlanError
    'plan.global_batch=8 but plan.replica_micro_batches hold 34 samples'."""
    from trainsim import api
    from trainsim.workloads.lowering import lower

    model, hw, plan = _replica_list_plan()
    assert api.estimate_tasks(model, hw, plan) == lower(model, hw, plan).num_tasks


def test_a_saved_variable_micro_batch_plan_simulates_again(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The bug hunt's F5: a plan saved from `sim microbatch` exited 2 under
    `sim simulate --plan`; now it runs and gives the iteration time api.simulate gives."""
    import json

    from trainsim import api

    model, hw, plan = _replica_list_plan()
    path = api.save_plan(plan, tmp_path / "mb_plan.json", model="gpt3-125m",
                         cluster="1x4xA100-SXM4-40GB")
    code, out, err = _run(capsys, "simulate", "--plan", str(path), "--json")
    assert code == 0, err
    expected = api.simulate(model, hw, plan).iteration_time_s
    assert json.loads(out)["iteration_time_s"] == pytest.approx(expected)
