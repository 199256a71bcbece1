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
