"""The heterogeneous planners (search/hetero): partitions, bound, space and search properties.

- the exact partition is the brute-force optimum of its objective under memory caps;
- block costs summed over a stage equal what the lowering charges that stage;
- the lower bound never exceeds the engine's iteration time (random plans);
- `hetero` is never worse than `fasop` or `uniform` on small cases;
- writing the cluster's node groups in another order gives the same best plan and time, and a
  homogeneous cluster written as two identical groups plans like one group;
- `node_order` is checked like every plan field.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from trainsim.errors import PlanError, SpecError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.hetero.block_costs import BlockCostTable
from trainsim.search.hetero.candidates import CandidateBuilder, Degrees
from trainsim.search.hetero.objectives import limit_miss, parse_prices, run_totals, with_prices
from trainsim.search.hetero.partition import (
    exact_partition,
    minmax_partition,
    stage_times,
    uniform_counts,
)
from trainsim.search.hetero.planner import HeteroPlanner
from trainsim.search.hetero.space import cyclic_orders, distinct_orders, node_kinds
from trainsim.search.oracle import Oracle
from trainsim.search.planner import SearchSpec, SearchState, run_search
from trainsim.workloads.lowering.layout import stage_layout
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

SMALL = get_model("gpt3-125m")
FAST = {"recompute": ("none",), "schedules": ("1f1b",), "refine_rounds": 0}
"""A smaller `hetero` space for the order-property tests (each runs a dozen searches)."""


# ---------------------------------------------------------------- partitions
def _all_counts(blocks: int, stages: int):
    for cuts in itertools.combinations(range(1, blocks), stages - 1):
        bounds = (0, *cuts, blocks)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(stages))


@pytest.mark.parametrize("seed", range(12))
def test_exact_partition_is_the_brute_force_optimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    blocks, stages, m = int(rng.integers(4, 10)), int(rng.integers(2, 4)), int(rng.integers(1, 9))
    speed = rng.uniform(0.3, 3.0, size=stages)  # per-stage GPU speed
    cost = rng.uniform(0.5, 2.0, size=blocks)
    prefix = [np.concatenate(([0.0], np.cumsum(cost / s))) for s in speed]
    cap = rng.uniform(0.3, 1.0) * blocks  # memory: at most `cap` blocks on the slower stages
    fits = []
    for k in range(stages):
        i, j = np.meshgrid(np.arange(blocks + 1), np.arange(blocks + 1), indexing="ij")
        fits.append((j - i <= cap) | (speed[k] > 1.5))
    best = None
    for counts in _all_counts(blocks, stages):
        first, ok = 0, True
        for k, c in enumerate(counts):
            ok = ok and bool(fits[k][first, first + c])
            first += c
        if not ok:
            continue
        t = stage_times(prefix, counts)
        score = sum(t) + (m - 1) * max(t)
        best = score if best is None else min(best, score)
    got = exact_partition(prefix, blocks, m, fits)
    if best is None:
        assert got is None
        return
    assert got is not None and sum(got) == blocks and min(got) >= 1
    t = stage_times(prefix, got)
    assert sum(t) + (m - 1) * max(t) == pytest.approx(best, rel=1e-12)


def test_minmax_partition_never_raises_the_slowest_stage() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        speed = rng.uniform(0.3, 3.0, size=4)
        prefix = [np.arange(25, dtype=float) / s for s in speed]  # 24 equal blocks
        uniform = max(stage_times(prefix, uniform_counts(24, 4)))
        counts = minmax_partition(prefix, 24)
        assert sum(counts) == 24 and min(counts) >= 1
        assert max(stage_times(prefix, counts)) <= uniform


# ---------------------------------------------------------------- costs and bound
def test_block_costs_sum_to_the_lowerings_stage_costs() -> None:
    cluster = parse_cluster("1x2xA100-SXM4-40GB+1x2xA10")
    plan = ParallelPlan.build(SMALL, cluster, dp=1, tp=1, pp=4, micro_batch_size=2,
                              global_batch=8, stage_layers=(5, 2, 3, 2), node_order=(1, 0))
    layout = stage_layout(SMALL, cluster, plan)
    table = BlockCostTable(SMALL, cluster)
    first = 0
    for k, count in enumerate((5, 2, 3, 2)):
        gpu = cluster.gpu(layout.stage_gpu_ranks[k][0]).name
        c = table.costs(gpu, 1, 2, "none")
        got = float(c.compute_s[first:first + count].sum())
        lowered = layout.costs[(k, None)]
        want = lowered.forward.time_s + lowered.backward.time_s + lowered.recompute.time_s
        assert got == pytest.approx(want, rel=1e-9), (k, gpu)
        first += count


def test_bound_never_exceeds_the_engine_time() -> None:
    cluster = parse_cluster("1x4xA100-SXM4-40GB+2x4xA10")
    table = BlockCostTable(SMALL, cluster)
    builder = CandidateBuilder(table, cluster, 24, memory_limit_bytes=None)
    oracle = Oracle(SMALL, cluster)
    rng = random.Random(3)
    orders = cyclic_orders(cluster)
    checked = 0
    ratios = []
    for _ in range(14):
        tp = rng.choice([1, 2, 4])
        dp = rng.choice([d for d in (1, 2, 3, 4, 6, 12) if (12 // tp) % d == 0 and 24 % d == 0])
        pp = 12 // (tp * dp)
        mbs = rng.choice([b for b in (1, 2, 4) if (24 // dp) % b == 0])
        deg = Degrees(dp=dp, tp=tp, pp=pp, micro_batch_size=mbs,
                      recompute=rng.choice(["none", "full"]),
                      schedule=rng.choice(["1f1b", "zb-h1"]) if pp > 1 else "1f1b")
        for cand in builder.build(deg, rng.choice(orders), "exact", "test"):
            summary = oracle.evaluate(cand.fields)
            assert cand.bound_s <= summary.iteration_time_s, cand.note
            # not vacuous: the bound counts compute alone, so it is held to the busiest
            # stage's work; plans whose time is mostly exposed communication (tensor
            # parallelism over the A10s' PCIe) are far above it, as they should be
            assert cand.bound_s > 0.3 * max(summary.stage_busy_s), cand.note
            ratios.append(cand.bound_s / summary.iteration_time_s)
            checked += 1
    assert checked >= 14
    assert sorted(ratios)[len(ratios) // 2] > 0.4  # the typical plan's bound is tight-ish


# ---------------------------------------------------------------- search properties
def _best(model, spec: str, batch: int, name: str, **options):
    cluster = parse_cluster(spec)
    planner = HeteroPlanner(name=name, **options)
    result = run_search(planner, SearchSpec(model=model, cluster=cluster, global_batch=batch,
                                            time_budget_s=300),
                        oracle=Oracle(model, cluster))
    assert result.best is not None, result.no_fit_reason()
    return result.best, planner, cluster


@pytest.mark.parametrize(("model", "spec", "batch"), [
    ("gpt3-125m", "1x4xA100-SXM4-40GB+2x4xA10", 16),
    ("bert-345m", "1x4xA100-SXM4-40GB+3x4xA10", 64),
])
def test_hetero_is_never_worse_than_fasop_or_uniform(model: str, spec: str, batch: int) -> None:
    m = get_model(model)
    times = {}
    for name in ("uniform", "fasop", "hetero"):
        best, planner, _ = _best(m, spec, batch, name)
        assert planner.stats["complete"], name
        times[name] = best.summary.iteration_time_s
    assert times["hetero"] <= times["fasop"] * (1 + 1e-12)
    assert times["hetero"] <= times["uniform"] * (1 + 1e-12)
    assert times["hetero"] < times["uniform"]  # heterogeneity pays on these cases


def _shape(best, cluster) -> tuple:
    """The best plan without node indices: its fields and each node's GPU kind in order."""
    plan = best.plan.to_dict()
    kinds = node_kinds(cluster)
    order = tuple(kinds[n] for n in plan.pop("node_order"))
    return plan, order


@pytest.mark.parametrize("groups", [
    ("1x4xA100-SXM4-40GB", "1x4xA10", "1x4xV100-SXM2-16GB"),
    ("2x4xA10", "1x4xA100-SXM4-40GB"),
])
def test_group_order_does_not_change_the_best_plan(groups: tuple[str, ...]) -> None:
    results = []
    for perm in itertools.permutations(groups):
        best, _, cluster = _best(SMALL, "+".join(perm), 16, "hetero", **FAST)
        results.append((best.summary.iteration_time_s, _shape(best, cluster)))
    t0, shape0 = results[0]
    for t, shape in results[1:]:
        assert t == pytest.approx(t0, rel=1e-9)
        assert shape == shape0


def test_two_identical_groups_plan_like_one() -> None:
    one, _, c1 = _best(SMALL, "2x4xA10", 16, "hetero", **FAST)
    two, _, c2 = _best(SMALL, "1x4xA10+1x4xA10", 16, "hetero", **FAST)
    assert two.summary.iteration_time_s == pytest.approx(one.summary.iteration_time_s, rel=1e-9)
    assert _shape(two, c2) == _shape(one, c1)


def test_orders_cover_the_rotations_and_ignore_the_writing_order() -> None:
    a = parse_cluster("1x4xA100-SXM4-40GB+3x4xA10")
    b = parse_cluster("3x4xA10+1x4xA100-SXM4-40GB")
    assert len(cyclic_orders(a)) == 4
    seq = lambda c, orders: [tuple(node_kinds(c)[n] for n in o) for o in orders]
    got_a, complete = distinct_orders(a)
    assert complete and seq(a, got_a) == seq(b, distinct_orders(b)[0])
    assert set(seq(a, cyclic_orders(a))) <= set(seq(a, got_a))


# ---------------------------------------------------------------- plan field and money
def test_node_order_is_checked() -> None:
    cluster = parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    ok = ParallelPlan.build(SMALL, cluster, dp=2, tp=2, pp=2, global_batch=8,
                            node_order=(1, 0))
    assert ok.to_dict()["node_order"] == [1, 0]
    assert "node_order" not in ParallelPlan.build(SMALL, cluster, dp=2, tp=2, pp=2,
                                                  global_batch=8).to_dict()
    for bad, word in [((0, 0), "once"), ((0,), "once"), ((0, 1, 2), "once"),
                      (("a", 1), r"node_order\[0\]"), ((-1, 0), r"node_order\[0\]")]:
        with pytest.raises(PlanError, match=word):
            ParallelPlan.build(SMALL, cluster, dp=2, tp=2, pp=2, global_batch=8,
                               node_order=bad)
    with pytest.raises(PlanError, match="placement"):
        ParallelPlan.build(SMALL, cluster, dp=2, tp=2, pp=2, global_batch=8,
                           node_order=(1, 0), placement=(0, 1))


def test_node_order_moves_the_fast_gpus() -> None:
    cluster = parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    oracle = Oracle(SMALL, cluster)
    base = {"dp": 4, "pp": 2, "global_batch": 16, "stage_layers": [9, 3]}
    fast_first = oracle.evaluate({**base, "node_order": [0, 1]}).iteration_time_s
    slow_first = oracle.evaluate({**base, "node_order": [1, 0]}).iteration_time_s
    assert fast_first < slow_first  # the 9-layer stage belongs on the A100s


def test_prices_budgets_and_deadlines() -> None:
    cluster = with_prices(parse_cluster("1x4xA100-SXM4-40GB+1x4xA10"), {"A10": 1.0})
    assert cluster.price_per_hour_usd == pytest.approx(4 * 4.0966 + 4 * 1.0, rel=1e-3)
    with pytest.raises(SpecError, match="A100"):
        with_prices(cluster, {"A100": 1.0})
    assert parse_prices(["A10=2.5"]) == {"A10": 2.5}
    for bad in ("A10", "A10=-1", "=3", "A10=nan", "A10=1e308", "A10=inf"):
        with pytest.raises(SpecError, match="--price"):
            parse_prices([bad])
    totals = run_totals(1e9, 1e4, 36.0)  # 1e5 s = 1.157 days, 1000 $
    assert totals.days == pytest.approx(1e5 / 86400) and totals.usd == pytest.approx(1000.0)
    assert limit_miss(totals, 2000.0, 2.0) is None
    assert "2x the budget" in (limit_miss(totals, 500.0, None) or "")
    assert "days" in (limit_miss(totals, None, 0.5) or "")


def test_unequal_replicas_get_a_speed_proportional_batch_split() -> None:
    cluster = parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    builder = CandidateBuilder(BlockCostTable(SMALL, cluster), cluster, 64,
                               memory_limit_bytes=None)
    deg = Degrees(dp=8, tp=1, pp=1, micro_batch_size=2, recompute="none")
    cands = builder.build(deg, (0, 1), "exact", "test")
    split = next(c.fields["dp_batch_split"] for c in cands if "dp_batch_split" in c.fields)
    assert sum(split) == 64 and min(split[:4]) > max(split[4:])  # A100 replicas take more
    oracle = Oracle(SMALL, cluster)
    times = {("split" if "dp_batch_split" in c.fields else "even"):
             oracle.evaluate(c.fields).iteration_time_s for c in cands}
    assert times["split"] < 0.9 * times["even"]


def test_links_between_node_kinds_run_at_the_slower_side() -> None:
    cluster = parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    between = cluster.bottleneck_bytes_per_s(0, 4)
    nics = [g.nic.bandwidth_bytes_per_s * g.nics_per_node for g in cluster.node_groups]
    assert nics[0] != nics[1]
    assert between == pytest.approx(min(nics))  # the A10 node's 50 Gb/s, not the A100's IB


def test_orders_past_the_limit_keep_fasops_rotations() -> None:
    cluster = parse_cluster("2x1xV100-SXM2-32GB+3x1xA100-SXM4-40GB+3x1xH100-SXM5-80GB")
    ours, complete = distinct_orders(cluster, limit=64)
    assert not complete and len(ours) >= 8
    kinds = node_kinds(cluster)
    seq = {tuple(kinds[n] for n in o) for o in ours}
    assert {tuple(kinds[n] for n in o) for o in cyclic_orders(cluster)} <= seq


def test_bound_holds_without_embedding_and_head() -> None:
    from trainsim.workloads.lowering import LoweringOptions

    cluster = parse_cluster("1x4xA100-SXM4-40GB+2x4xA10")
    options = LoweringOptions(embedding_and_head=False)
    table = BlockCostTable(SMALL, cluster, embedding_and_head=False)
    builder = CandidateBuilder(table, cluster, 24, memory_limit_bytes=None)
    oracle = Oracle(SMALL, cluster, options=options)
    deg = Degrees(dp=1, tp=1, pp=12, micro_batch_size=1, recompute="none")
    for cand in builder.build(deg, cyclic_orders(cluster)[0], "exact", "test"):
        assert cand.bound_s <= oracle.evaluate(cand.fields).iteration_time_s


def test_partitions_checked_against_memory_fit_under_zero_bubble_schedules() -> None:
    """The exact partition is sized against each stage's memory; under ZB-H1 every rank keeps
    p micro-batches' activations until their W pass (simulator/schedules.py `zb_h1`), not
    1F1B's p - s, so none of its partitions may come back out of memory from the Oracle
    (six did when the check counted 1F1B's)."""
    from trainsim import api

    result = api.search("gpt3-1.3b", "1x4xA100-SXM4-40GB+1x4xA10", global_batch=64,
                        method="hetero", time_budget_s=60)  # done in ~1 s
    checked = [r for r in result.log if "exact partition" in r.note]
    assert any("zb-h1" in r.note for r in checked)
    assert not [r.note for r in checked if r.summary.oom]


def test_partitions_are_sized_for_the_frameworks_plan() -> None:
    """Under NeMo the Oracle runs each candidate with ZeRO-1 and sequence parallelism (its
    plan defaults), so the partitioner sizes stages for that: with a 19 GB limit the 20/4
    split of GPT-3 1.3B over an A100 and an A10 stage fits (15.9 GiB on the Oracle) and is
    the exact partition; sized without ZeRO and SP it looked like 22.1 GiB and the exact
    partition was 15/9, 1.6x slower. No exact partition comes back out of memory."""
    from trainsim import api
    from trainsim.search.hetero.planner import HeteroPlanner
    from trainsim.search.oracle import Oracle
    from trainsim.search.planner import SearchSpec, SearchState
    from trainsim.workloads.framework import apply_framework

    model = apply_framework(api.load_model("gpt3-1.3b"), "nemo")
    hw = api.load_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    oracle = Oracle(model, hw, framework="nemo")
    limit = 19e9
    state = SearchState(SearchSpec(model=model, cluster=hw, global_batch=32,
                                   memory_limit_bytes=limit), oracle)
    cands = HeteroPlanner(name="hetero").candidates(state)
    exact = [c for c in cands if "exact partition" in c.note]
    case = [c for c in exact if c.note.startswith("dp=2 tp=2 pp=2 mbs=4 rc=none 1f1b")
            and c.fields["node_order"] == [0, 1]]
    assert case and case[0].fields["stage_layers"] == [20, 4]
    for c in exact[:40]:
        assert oracle.evaluate(c.fields).peak_memory_bytes <= limit, c.note


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_partition_memory_estimate_is_the_oracles_stage_peak(schedule: str,
                                                              recompute: str) -> None:
    """The memory check `_fits` applies to a partition gives each stage the Oracle's peak
    (to 0.1 %), on an A100 + A10 cluster: under ZB-H1 with recompute, rank s holds s + 1
    micro-batches' recomputed activations (allocated at I, freed at W), which the check
    used to count once -- stages after the first were estimated up to 0.25 GB low."""
    from trainsim.search.hetero.candidates import Layout, _fits, held_micro_batches

    model, cluster = get_model("gpt3-350m"), parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    table = BlockCostTable(model, cluster)
    builder = CandidateBuilder(table, cluster, 32, memory_limit_bytes=None)
    deg = Degrees(dp=1, tp=2, pp=4, micro_batch_size=2, recompute=recompute,
                  schedule=schedule)
    order = cyclic_orders(cluster)[0]
    cand = builder.build(deg, order, "exact", "test")[0]
    peaks = Oracle(model, cluster).evaluate(cand.fields).peak_memory_bytes_per_rank
    assert len(peaks) == deg.pp  # one folded rank per stage
    lay = Layout(cluster, order, deg)
    costs = [table.costs(builder._slowest(lay.types[s], deg), deg.tp, 2, recompute)
             for s in range(deg.pp)]
    inflight, working = held_micro_batches(schedule, deg.pp, 32 // deg.micro_batch_size)
    starts = np.cumsum((0, *cand.fields["stage_layers"]))
    for tolerance, fit in ((1.001, True), (0.999, False)):
        fits = _fits(costs, [p * tolerance for p in peaks], inflight, 1.0, working,
                     schedule == "zb-h1")
        assert [bool(f[starts[s], starts[s + 1]]) for s, f in enumerate(fits)] == \
            [fit] * deg.pp


@pytest.mark.parametrize("limit_gb", [2.4, 2.5, 2.7])
def test_zero_bubble_exact_partitions_fit_under_recompute(limit_gb: float) -> None:
    """Through the candidate builder: under ZB-H1 with full recompute the exact partition the
    builder proposes (if any) fits the limit on the Oracle. Sized with one working set per
    stage, it proposed 10/10/3/1 at 2.4 GB (2.596 GB on the Oracle) and 10/10/2/2 at
    2.5-2.7 GB (2.73 GB)."""
    model, cluster = get_model("gpt3-350m"), parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    builder = CandidateBuilder(BlockCostTable(model, cluster), cluster, 32,
                               memory_limit_bytes=limit_gb * 1e9)
    deg = Degrees(dp=1, tp=2, pp=4, micro_batch_size=2, recompute="full", schedule="zb-h1")
    oracle = Oracle(model, cluster)
    for cand in builder.build(deg, cyclic_orders(cluster)[0], "exact", "test"):
        if "exact" in cand.note:
            assert max(oracle.evaluate(cand.fields).peak_memory_bytes_per_rank) \
                <= limit_gb * 1e9


def test_schedules_are_normalised_and_limited_to_the_sized_ones() -> None:
    """`schedules` takes the plan's aliases ("ZB-H1" is zb-h1, sized as such: it used to be
    sized as 1F1B, the test being `startswith("zb")`), and refuses in one line a schedule
    the partitions are not sized for (GPipe holds every micro-batch)."""
    model, cluster = get_model("gpt3-350m"), parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    state = SearchState(SearchSpec(model=model, cluster=cluster, global_batch=32),
                        Oracle(model, cluster))
    notes = {s: [c.note for c in HeteroPlanner(name="hetero", schedules=(s,)).candidates(state)]
             for s in ("zb-h1", "ZB-H1")}
    assert notes["ZB-H1"] == notes["zb-h1"] and notes["zb-h1"]
    with pytest.raises(SpecError, match=r"schedule 'gpipe': the heterogeneous planners size"):
        HeteroPlanner(name="hetero", schedules=("gpipe",)).candidates(state)


@pytest.mark.parametrize("name", ["uniform", "fasop"])
def test_top_k_equals_the_top_k_of_every_candidate(name: str) -> None:
    """The bound prunes against the k-th fastest fitting plan, so `--top k` lists the k fastest
    of the planner's own candidates (against the fastest alone, the bug hunt's `--top 4` of
    uniform gpt3-350m listed 0.6703 s second while a 0.6663 s candidate fitted, and the result
    said 0 pruned where 39 were)."""
    model, hw = get_model("gpt3-350m"), parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    spec = SearchSpec(model=model, cluster=hw, global_batch=32, time_budget_s=600.0, top_k=4)
    oracle = Oracle(model, hw)
    result = run_search(HeteroPlanner(name=name), spec, oracle=oracle)
    times = []
    candidates = HeteroPlanner(name=name).candidates(SearchState(spec, oracle))
    for cand in candidates:
        summary = oracle.evaluate(oracle.plan(cand.fields))
        if not summary.oom:
            times.append(summary.iteration_time_s)
    assert [r.summary.iteration_time_s for r in result.ranked] == sorted(times)[:4]
    assert result.pruned > 0 and result.capped == 0
    assert result.evaluated + result.pruned == len(candidates)


def test_a_capped_search_says_so() -> None:
    model, hw = get_model("gpt3-350m"), parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    spec = SearchSpec(model=model, cluster=hw, global_batch=32, time_budget_s=600.0)
    result = run_search(HeteroPlanner(name="uniform", max_evals=2), spec)
    assert result.evaluated == 2 and result.capped > 0
    assert result.to_dict()["capped"] == result.capped


def test_a_looser_memory_limit_never_returns_a_slower_plan() -> None:
    """The refinement climbs from the fastest plan of each shape, not from the best alone:
    climbing from the best made the bug hunt's 4 GB search return 0.4275 s where its 3 GB
    search's 0.4177 s plan (which fits 4 GB) was found from another shape's seed."""
    model, hw = get_model("gpt3-350m"), parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    oracle = Oracle(model, hw)
    best = {}
    for limit_gb in (3.0, 4.0):
        spec = SearchSpec(model=model, cluster=hw, global_batch=32, time_budget_s=600.0,
                          memory_limit_bytes=limit_gb * 1e9)
        result = run_search(HeteroPlanner(name="hetero"), spec, oracle=oracle)
        assert result.capped == 0
        best[limit_gb] = result.best.summary.iteration_time_s
    assert best[4.0] <= best[3.0]
