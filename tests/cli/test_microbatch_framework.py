"""`sim microbatch --framework`: every plan a micro-batching method replays is planned for that
stack (its model and its plan defaults), as `sim search --framework` plans its candidates."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from trainsim import api
from trainsim.search.microbatch.planner import IterationResult, MicroBatchPlanner
from trainsim.workloads.framework import apply_framework
from trainsim.workloads.lengths import Sample

Sim = Callable[[list[str]], tuple[int, str, str]]
CLUSTER = "4xA100-SXM4-40GB"
BASE = ["microbatch", "--model", "gpt3-125m", "--cluster", CLUSTER, "--dp", "2", "--pp", "2",
        "--tokens-per-batch", "16384", "--iterations", "2", "--max-len", "1024",
        "--synthetic", "flan", "--methods", "packing,fixed,ours", "--json"]


def _json(sim: Sim, *extra: str) -> dict:
    code, out, err = sim([*BASE, *extra])
    assert code == 0, err
    return json.loads(out)


def test_megatron_reduces_gradients_after_the_backward(sim: Sim) -> None:
    """Megatron-LM's --overlap-grad-reduce is opt-in, so under its profile every plan
    all-reduces the gradients after the backward instead of behind it: each method forms the
    same micro-batches (same padding, same peak memory) and is slower. Both runs use eager
    attention, so the reduction is the only difference."""
    plain = {r["method"]: r for r in _json(sim, "--attention", "eager")["methods"]}
    megatron = {r["method"]: r for r in _json(sim, "--attention", "eager", "--framework",
                                              "megatron")["methods"]}
    assert set(plain) == set(megatron) == {"packing", "fixed", "ours"}
    for method, row in megatron.items():
        assert row["error"] is None
        assert row["padding eff."] == plain[method]["padding eff."]
        assert row["peak GiB"] == plain[method]["peak GiB"]
        assert row["real tokens/s"] < plain[method]["real tokens/s"], method


def _ours(framework: str | None, limit: float | None) -> IterationResult:
    model = apply_framework(api.load_model("gpt3-125m"), framework, "eager")
    planner = MicroBatchPlanner(model, api.load_cluster(CLUSTER), dp=2, pp=2, max_len=1024,
                                memory_limit_bytes=limit, framework=framework)
    batch = [Sample(n, 0) for n in (1000, 800, 600, 400, 300, 200, 120, 60) * 4]
    result = planner.run("ours", [batch])
    assert result.error is None
    return result.iterations[0]


def test_nemos_distributed_optimizer_frees_memory_for_a_faster_schedule() -> None:
    """NeMo shards the Adam states over the two replicas (ZeRO-1), so its plans peak lower.
    With the memory limit between the two peaks of each stack's own best iteration, NeMo keeps
    its choice while the plain stack must fall back to a slower one (fewer micro-batches in
    flight or recompute): NeMo is the faster there."""
    free = {fw: _ours(fw, None) for fw in (None, "nemo")}
    assert free["nemo"].plan is not None and free["nemo"].plan.zero == 1
    assert free[None].plan is not None and free[None].plan.zero == 0
    assert free["nemo"].peak_bytes < free[None].peak_bytes
    limit = (free["nemo"].peak_bytes + free[None].peak_bytes) / 2
    tight = {fw: _ours(fw, limit) for fw in (None, "nemo")}
    assert all(it.fits and it.peak_bytes <= limit for it in tight.values())
    assert tight["nemo"].time_s == free["nemo"].time_s
    assert tight[None].time_s > free[None].time_s
    assert tight["nemo"].time_s < tight[None].time_s


def test_every_plan_gets_the_stacks_defaults_and_simulates_alike() -> None:
    """Under NeMo at dp 2, tp 2 every replayed plan runs its distributed optimizer (ZeRO-1) with
    the parameter gather overlapped and sequence parallelism, and `simulate` under the same
    framework gives each iteration's time for its plan; without a framework none of them."""
    data = api.length_dataset(synthetic="flan", samples=2_000, seed=0)
    runs = {fw: api.microbatch("gpt3-125m", CLUSTER, data, dp=2, tp=2, tokens_per_batch=8_192,
                               iterations=1, methods=["packing", "ours"], max_len=1024,
                               framework=fw)[0] for fw in (None, "nemo")}
    for fw, results in runs.items():
        for r in results:
            assert r.error is None
            it = r.iterations[0]
            assert it.plan is not None
            stack = fw == "nemo"
            assert (it.plan.zero, it.plan.sp, it.plan.overlap_param_gather) == (
                (1, True, True) if stack else (0, False, False))
            again = api.simulate("gpt3-125m", CLUSTER, it.plan, framework=fw)
            assert again.iteration_time_s == pytest.approx(it.time_s, rel=1e-9)


def test_an_unknown_framework_is_one_line_before_any_work(sim: Sim) -> None:
    """The name is checked before the lengths are read: a missing file is not what is said."""
    code, _, err = sim(["microbatch", "--model", "gpt3-125m", "--cluster", CLUSTER, "--dp", "4",
                        "--lengths", "/nonexistent/lengths.txt", "--framework", "megatrn"])
    assert code == 2
    line, = err.strip().splitlines()
    assert "megatrn" in line and "nemo" in line and "lengths" not in line


def test_the_json_and_title_name_the_framework(sim: Sim) -> None:
    """The result names the stack it was planned for (its profile's name), so the run can be
    repeated as it was; without one it says none."""
    nemo = _json(sim, "--framework", "NeMo", "--iterations", "1")
    assert nemo["framework"] == "nemo" and "under nemo" in nemo["title"]
    plain = _json(sim, "--iterations", "1")
    assert plain["framework"] is None and "under" not in plain["title"]
