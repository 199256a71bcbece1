"""Expert parameters under expert parallelism (workloads/lowering/gradient_sync.py,
`GradientSync.param_groups`; layout.py, `LoweringLayout.expert_dp_groups`): with ep > 1 each
rank holds 1/ep of the experts, so their gradients are reduced -- and ZeRO shards their states
and gathers them -- only over the ranks holding the same experts (the expert-data-parallel
group: dp/ep ranks for tp = 1; Megatron-Core's expert_data_parallel group, DeepSpeed-MoE's
expert_data_parallel_group), not over the whole dp group."""

from __future__ import annotations

import dataclasses

import pytest

from trainsim import api
from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.workloads.lowering.layout import LoweringLayout
from trainsim.workloads.lowering.options import DEFAULT_OPTIONS
from trainsim.workloads.plan import ParallelPlan

CLUSTER = "1x4xA100-SXM4-80GB"
MB = 1e6


def _model():
    """gpt-moe-1.3b-8e cut to 2 layers: one MoE block of 8 experts (bias-free experts)."""
    return dataclasses.replace(api.load_model("gpt-moe-1.3b-8e"), num_layers=2)


def _params(m):
    """(dense parameters, parameters of all experts) of the model."""
    experts = m.num_experts * 2 * m.hidden * m.ffn_hidden
    experts += m.num_experts * (m.ffn_hidden + m.hidden) if m.bias else 0
    return api.describe_model(m)["parameters"] - experts, experts


def _run(ep: int, zero: int, **extra):
    m = _model()
    r = api.simulate(m, CLUSTER, dict(dp=4, ep=ep, zero=zero, micro_batch_size=1,
                                      global_batch=4, seq_len=64, **extra))
    t = r.tasks
    static = r.memory_timeline[r.memory_timeline.time_s == 0].bytes.iloc[0]
    return t[t.stream == "dp"], static


def _layout(cluster: str, **plan):
    m, hw = api.load_model("gpt-moe-1.3b-8e"), parse_cluster_spec(cluster)
    return LoweringLayout(m, hw, ParallelPlan.build(m, hw, micro_batch_size=1, **plan),
                          DEFAULT_OPTIONS)


def test_expert_data_parallel_groups() -> None:
    """The ranks holding the same experts: rank i of every ep group (inside one tp index when
    ep divides dp, DeepSpeed-MoE's layout; across the stage otherwise)."""
    lay = _layout("1x4xA100-SXM4-80GB", dp=4, ep=2, global_batch=4)
    assert lay.ep_groups(0) == [(0, 1), (2, 3)]
    assert lay.expert_dp_groups(0) == [(0, 2), (1, 3)]
    assert lay.expert_dp(0) == 2
    lay = _layout("1x4xA100-SXM4-80GB", dp=4, ep=4, global_batch=4)
    assert lay.expert_dp_groups(0) == [(0,), (1,), (2,), (3,)]
    lay = _layout("1x4xA100-SXM4-80GB", dp=4, ep=1, global_batch=4)
    assert lay.expert_dp_groups(0) == lay.dp_groups(0)
    lay = _layout("1x8xA100-SXM4-80GB", dp=4, tp=2, ep=2, global_batch=4)
    assert lay.dp_groups(0) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert lay.expert_dp_groups(0) == [(0, 4), (2, 6), (1, 5), (3, 7)]
    lay = _layout("1x8xA100-SXM4-80GB", dp=2, tp=4, ep=8, global_batch=2)  # ep spans tp
    assert lay.ep_groups(0) == [tuple(range(8))]
    assert lay.expert_dp(0) == 1
    lay = _layout("1x8xA100-SXM4-80GB", dp=2, tp=4, ep=4, global_batch=2)
    assert lay.ep_groups(0) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert lay.expert_dp_groups(0) == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_experts_held_once_are_not_reduced() -> None:
    """ep = dp = 4: every rank holds 2 experts no other rank holds, so only the dense
    parameters' gradients are all-reduced over the 4 ranks (2(n-1)/n = 1.5 times their fp16
    bytes). Before: 724.3 MB, the local experts (67.1M) reduced over all 4 ranks with the
    dense 174.3M; ep = 1 reduces all 442.8M (1328.4 MB)."""
    dense, experts = _params(_model())
    dp1, _ = _run(1, 0)
    dp4, _ = _run(4, 0)
    assert dp1.comm_bytes.sum() == pytest.approx(1.5 * 2 * (dense + experts), rel=1e-6)
    assert dp4.comm_bytes.sum() == pytest.approx(1.5 * 2 * dense, rel=1e-6)  # 522.9 MB


def test_experts_reduced_over_ranks_holding_them() -> None:
    """ep = 2, dp = 4: the local experts (4 of 8) are all-reduced over the 2 ranks holding
    them (2(n-1)/n = 1), the dense parameters over all 4."""
    dense, experts = _params(_model())
    dp, _ = _run(2, 0)
    assert dp.comm_bytes.sum() == pytest.approx(1.5 * 2 * dense + 1.0 * 2 * experts / 2,
                                                rel=1e-6)


def test_zero1_shards_expert_states_over_expert_data_parallel_group() -> None:
    """ZeRO-1 with ep = dp = 4: the experts' Adam states cannot be sharded (each rank holds its
    own experts), so static memory is 2294.1 MB, not 1690.0 MB (the states sharded over dp as
    if every rank held the same experts); the parameter all-gather after the step carries the
    dense parameters only."""
    dense, experts = _params(_model())
    local = experts / 4
    dp, static = _run(4, 1)
    assert static == pytest.approx((dense + local) * (2 + 2) + dense * 12 / 4 + local * 12,
                                   rel=1e-9)
    assert static / MB == pytest.approx(2294.1, abs=0.1)
    gather = dp[dp.kind == "all_gather"].comm_bytes.sum()
    assert gather == pytest.approx(0.75 * 2 * dense, rel=1e-6)


@pytest.mark.parametrize("zero", [2, 3])
def test_zero2_zero3_shard_experts_over_expert_data_parallel_group(zero: int) -> None:
    """ZeRO-2/3 with ep = 2 of dp = 4: expert gradients (and under ZeRO-3 weights) are
    sharded over the 2 ranks holding them; under ZeRO-3 their gathers run over those 2."""
    dense, experts = _params(_model())
    local = experts / 2
    dp, static = _run(2, zero)
    w, g, o = 2, 2, 12
    expected = dense * (w / (4 if zero >= 3 else 1) + g / 4 + o / 4) \
        + local * (w / (2 if zero >= 3 else 1) + g / 2 + o / 2)
    assert static == pytest.approx(expected, rel=1e-9)
    scatter = dp[dp.kind == "reduce_scatter"].comm_bytes.sum()
    assert scatter == pytest.approx(0.75 * 2 * dense + 0.5 * 2 * local, rel=1e-6)
    if zero == 3:
        experts_gathered = dp[dp.name.str.endswith(".gather.experts")]
        assert len(experts_gathered) > 0
        assert set(experts_gathered.comm_bytes.round()) == {round(0.5 * 2 * local)}


@pytest.mark.parametrize("zero", [0, 1, 3])
@pytest.mark.parametrize("ep", [2, 4])
def test_folded_and_unfolded_agree(ep: int, zero: int) -> None:
    """The expert-data-parallel reductions and gathers fold like the dp ones: folded and
    unfolded programs give the same figures on a cluster of two GPU types."""
    plan = {"dp": 8, "ep": ep, "zero": zero, "global_batch": 16, "seq_len": 256}
    cluster = "1x4xA100-SXM4-40GB+1x4xA10"
    m = _model()
    folded = api.simulate(m, cluster, **plan)
    unfolded = api.simulate(m, cluster, unfold=True, **plan)
    assert folded.iteration_time_s == pytest.approx(unfolded.iteration_time_s, rel=1e-9)
    assert folded.energy_j == pytest.approx(unfolded.energy_j, rel=1e-9)
    assert folded.peak_memory_bytes == pytest.approx(unfolded.peak_memory_bytes, rel=1e-12)
