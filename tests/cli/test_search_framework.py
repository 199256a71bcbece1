"""`sim search --framework`: every candidate is planned for that stack (its model and its plan
defaults), as `sim simulate --framework` runs one plan."""

from __future__ import annotations

import json

import pytest

from trainsim import api
from trainsim.cli import main
from trainsim.search.oracle import Oracle


def _search(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    with pytest.raises(SystemExit) as info:
        main(["search", "--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB",
              "--global-batch", "16", "--time-budget-s", "30", "--json", *extra])
    assert (info.value.code or 0) == 0
    return json.loads(capsys.readouterr().out)


def test_each_candidate_gets_the_stacks_plan_defaults(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Under NeMo every candidate with dp > 1 runs its distributed optimizer (ZeRO-1) with
    overlapped gradient reduction and parameter gather, and sequence parallelism with tp > 1;
    without a framework none of them does."""
    nemo = _search(capsys, "--framework", "nemo")
    plain = _search(capsys)
    plans = [r["plan"] for r in nemo["ranked"]]
    assert plans and all(
        p["zero"] == (1 if p["dp"] > 1 else 0)
        and p.get("overlap_grad_reduce", True) is True  # the plan's default: not written
        and p.get("overlap_param_gather", False) is (p["dp"] > 1)
        and p["sp"] is (p["tp"] > 1) for p in plans)
    assert all(r["plan"]["zero"] == 0 and not r["plan"].get("overlap_param_gather")
               for r in plain["ranked"])


def test_the_oracle_scores_a_plan_as_simulate_does_for_that_stack() -> None:
    """An Oracle given a framework answers fields with the Summary of `make_plan` +
    `simulate` under the same framework (Megatron-LM: no overlap, fp32 gradient reduction)."""
    model, hw = api.load_model("gpt3-125m"), api.load_cluster("4xA100-SXM4-80GB")
    fields = {"dp": 4, "tp": 1, "pp": 1, "micro_batch_size": 2, "global_batch": 16}
    from trainsim.workloads.framework import apply_framework

    oracle = Oracle(apply_framework(model, "megatron"), hw, framework="megatron")
    got = oracle.evaluate(fields)
    want = api.simulate(model, hw, framework="megatron", **fields)
    assert got.iteration_time_s == pytest.approx(want.iteration_time_s, rel=1e-12)
    assert oracle.plan(fields).overlap_grad_reduce is False
    assert Oracle(model, hw).plan(fields).overlap_grad_reduce is True


def test_intra_op_methods_refuse_a_framework(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["search", "--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB",
              "--global-batch", "16", "--method", "intraop", "--framework", "megatron"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--framework" in err[0] and "intraop" in err[0]


def test_an_unknown_framework_is_one_line_before_any_search(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["search", "--model", "gpt3-125m", "--cluster", "4xA100-SXM4-80GB",
              "--global-batch", "16", "--framework", "megatrn"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "megatron" in err[0]


def test_aceso_stages_get_the_distributed_optimizer() -> None:
    """Aceso's fields say dp 1 and give each stage its GPUs and tp: a NeMo stage of 8 GPUs at
    tp 2 is data-parallel 4, so it runs NeMo's ZeRO-1 with the parameter gather overlapped;
    per-op degrees (which ParallelPlan keeps apart from ZeRO) get no ZeRO."""
    from trainsim.workloads.framework import get_framework

    nemo = get_framework("nemo")
    fields = {"pp": 1, "dp": 1, "tp": 1, "stage_gpus": [8], "stage_tp": [2],
              "stage_layers": [24], "micro_batch_size": 8, "global_batch": 32}
    got = nemo.plan_defaults(fields)
    assert got["zero"] == 1 and got["overlap_param_gather"] is True and got["sp"] is True
    assert "zero" not in nemo.plan_defaults({**fields, "stage_gpus": [2]})  # dp 1 everywhere
    mixed = nemo.plan_defaults({**fields, "pp": 2, "stage_gpus": [4, 4], "stage_tp": [2, 1]})
    assert "sp" not in mixed and mixed["zero"] == 1  # sp needs one degree on every stage
    per_op = nemo.plan_defaults({**fields, "stage_op_tp": [{"attn.qkv": 2}]})
    assert "zero" not in per_op and "sp" not in per_op
    assert per_op["overlap_param_gather"] is False
    model, hw = api.load_model("gpt3-350m"), api.load_cluster("8xA100-SXM4-40GB")
    from trainsim.workloads.framework import apply_framework

    oracle = Oracle(apply_framework(model, "nemo"), hw, framework="nemo")
    plan = oracle.plan(fields)
    assert plan.zero == 1 and plan.overlap_param_gather and plan.sp
    assert oracle.evaluate(fields).error is None


def test_a_convolutional_model_gets_no_sequence_parallelism() -> None:
    from trainsim.workloads.framework import get_framework

    fields = {"dp": 1, "tp": 2, "pp": 4, "micro_batch_size": 4, "global_batch": 16}
    assert "sp" not in get_framework("nemo").plan_defaults(fields, "wresnet")
    assert get_framework("nemo").plan_defaults(fields, "gpt")["sp"] is True


def test_the_best_plan_file_names_its_framework(capsys: pytest.CaptureFixture[str],
                                                tmp_path) -> None:
    """`sim search --framework F --out DIR` writes F into best_plan.json, so `sim simulate
    --plan DIR/best_plan.json` alone reproduces the search's figure for that plan."""
    out = tmp_path / "o"
    searched = _search(capsys, "--framework", "torchtitan", "--out", str(out))
    saved = json.loads((out / "best_plan.json").read_text())
    assert saved["framework"] == "torchtitan"
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--plan", str(out / "best_plan.json"), "--json"])
    assert (info.value.code or 0) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["iteration_time_s"] == searched["best"]["iteration_time_s"]
