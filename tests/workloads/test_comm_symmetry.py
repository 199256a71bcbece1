"""Collectives planned once per group shape and renamed onto the other groups of that shape
(workloads/lowering/comm.py, `MemoTopology.shape`) are what planning each group gives, bit for
bit: phases, link loads and whole lowered Programs, on homogeneous clusters of more than ten
nodes (node ids that sort differently as strings), NVLink-mesh nodes (not every GPU alike), a
mixed cluster and a CPU cluster (its own links: planned per group)."""

from __future__ import annotations

import importlib.util
import random
from collections import Counter
from pathlib import Path

import pytest

from trainsim.hwmodels.cluster import Cluster, parse_cluster
from trainsim.simulator.task_table import TaskTableBuilder
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.lowering.cache import LoweringCache
from trainsim.workloads.lowering.comm import CommLowering, MemoTopology, plan_measured
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

_SPEC = importlib.util.spec_from_file_location(
    "lowering_cache_test", Path(__file__).with_name("test_lowering_cache.py"))
assert _SPEC is not None and _SPEC.loader is not None
_cache_test = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_cache_test)
assert_same_program = _cache_test.assert_same_program

CLUSTERS = ["12x8xA100-SXM4-80GB", "3x8xV100-SXM2-32GB", "1x8xA100-SXM4-40GB+11x4xA10",
            "2x4xA40"]
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]


def _shared(cluster: Cluster, algorithm: str = "auto") -> CommLowering:
    """A CommLowering with shared caches, as lower.py sets one up from a LoweringCache."""
    comm = CommLowering(cluster, algorithm, TaskTableBuilder())
    cache = LoweringCache()
    comm._phase_cache, comm._load_cache = cache.comm_phases, cache.comm_loads
    return comm


def _groups(cluster: Cluster, rng: random.Random) -> list[tuple[int, ...]]:
    """Strided (data-parallel-like), per-node, p2p and random groups."""
    n, k = cluster.num_gpus, cluster.node_groups[0].gpus_per_node
    out: list[tuple[int, ...]] = []
    for stride in (1, 2, k):
        for start in range(min(stride, 4)):
            for size in (2, 4, 8):
                g = tuple(range(start, n, stride))[:size]
                if len(g) >= 2:
                    out.append(g)
                    out.append(tuple(r + n // 2 for r in g if r + n // 2 < n))
    for _ in range(40):
        out.append(tuple(rng.sample(range(n), rng.choice((2, 2, 3, 4, 8)))))
    return [g for g in out if len(g) >= 2]


@pytest.mark.parametrize("spec", CLUSTERS)
def test_renamed_phases_equal_planned_phases(spec: str) -> None:
    cluster = parse_cluster(spec)
    rng = random.Random(spec)
    comm = _shared(cluster)
    plain = MemoTopology(cluster)
    groups = _groups(cluster, rng)
    for kind in KINDS:
        for size in (4096.0, 3e6, 7.5e8):
            for g in groups:
                g = g[:2] if kind == "p2p" else g
                assert comm.phases(kind, g, size) == tuple(plan_measured(kind, g, size, plain)), \
                    (kind, g, size)
    planned = sum(1 for key in comm._phase_cache if key[0] == "shape")
    assert planned > 0
    assert planned < len(comm._phase_cache) / 2  # most groups were renamed, not planned


@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical"])
def test_renamed_phases_follow_a_fixed_algorithm(algorithm: str) -> None:
    cluster = parse_cluster("12x8xA100-SXM4-80GB")
    comm = _shared(cluster, algorithm)
    plain = MemoTopology(cluster)
    for start in range(8):
        for g in (tuple(range(start, 96, 8)), tuple(range(start % 4, 96, 4)),
                  tuple(range(8 * start, 8 * start + 32))):
            assert comm.phases("all_reduce", g, 2e8) == \
                tuple(plan_measured("all_reduce", g, 2e8, plain, algorithm))


@pytest.mark.parametrize("spec", CLUSTERS)
def test_link_load_counts_each_copy_once_per_link(spec: str) -> None:
    cluster = parse_cluster(spec)
    plain = MemoTopology(cluster)
    comm = _shared(cluster)
    n, k = cluster.num_gpus, cluster.node_groups[0].gpus_per_node
    needs = [("all_reduce", 3e7), ("all_gather", 1e6)]
    for copies in ([tuple(range(t, n, k)) for t in range(k)],
                   [tuple(range(s, s + k)) for s in range(0, n - k + 1, k)],
                   [(r, r + k) for r in range(n - k)]):
        want: Counter[str] = Counter()
        for g in copies:
            want.update({lid for kind, size in needs
                         for ph in plan_measured(kind, g, size, plain) for lid in ph.links})
        assert comm.link_load(needs, copies) == dict(want)


STREAMS = {
    "12x8xA100-SXM4-80GB": [{"dp": 12, "tp": 4, "pp": 2}, {"dp": 6, "tp": 8, "pp": 2, "zero": 1},
                            {"dp": 4, "tp": 2, "pp": 12}, {"dp": 48, "pp": 2, "zero": 3}],
    "3x8xV100-SXM2-32GB": [{"dp": 3, "tp": 4, "pp": 2}, {"dp": 6, "tp": 2, "pp": 2, "zero": 1},
                           {"dp": 12, "pp": 2, "zero": 3}],
    "2x8xA100-SXM4-40GB+4x4xA10": [
        {"dp": 4, "pp": 8, "placement": (1, 1, 1, 1, 0, 0, 0, 0)},
        {"dp": 2, "tp": 2, "pp": 8, "placement": (0, 1, 0, 1, 0, 1, 0, 1)},
        {"dp": 16, "pp": 2}],
}
"""Plans per cluster, as a planner would try them one after another."""


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("spec", sorted(STREAMS))
def test_lowering_with_renamed_collectives_is_unchanged(spec: str, fold: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache shared by a stream of plans, with renaming, emits each plan's Program as
    planning every group afresh does."""
    model, cluster = get_model("gpt3-350m"), parse_cluster(spec)
    opt, cache = LoweringOptions(fold=fold), LoweringCache()
    for fields in STREAMS[spec]:
        plan = ParallelPlan.build(model, cluster, seq_len=256, num_micro_batches=4, **fields)
        renamed = lower(model, cluster, plan, opt, cache=cache)
        monkeypatch.setattr(CommLowering, "translate", False)
        plain = lower(model, parse_cluster(spec), plan, opt)
        monkeypatch.setattr(CommLowering, "translate", True)
        assert_same_program(renamed, plain)


def test_cpu_cluster_is_planned_per_group() -> None:
    """A CPU cluster names its own loopback links: no renaming, the same phases and loads."""
    from trainsim.validate.cpu_hardware import cpu_cluster
    from trainsim.validate.profile_db import ProfileDB

    profile = Path(__file__).resolve().parents[2] / "traces" / "profile.csv"
    cluster = cpu_cluster(ProfileDB.load(profile), 4)
    comm = _shared(cluster)
    assert not comm._renaming()
    plain = MemoTopology(cluster)
    for g in ((0, 1), (2, 3), (0, 1, 2, 3)):
        assert comm.phases("all_reduce", g, 3e6) == \
            tuple(plan_measured("all_reduce", g, 3e6, plain))
    load = comm.link_load([("all_reduce", 3e6)], [(0, 1), (2, 3)])
    assert load == {f"cpu.r{r}.{d}": 1 for r in range(4) for d in ("in", "out")}


def test_copies_alike_reads_the_placement() -> None:
    """`CommLowering.copies_alike` (which lets the folded lowering skip timing every pair):
    pairs all within a node, or all between two nodes with one pair per NIC direction, are
    alike; a mix of NVLink and cross-node pairs is not, nor are DGX-1 pairs on different GPUs
    (the cube mesh wires GPU pairs with one or two NVLinks)."""
    from trainsim.hwmodels.cluster import parse_cluster
    from trainsim.simulator.task_table import TaskTableBuilder
    from trainsim.workloads.lowering.comm import CommLowering

    a100 = CommLowering(parse_cluster("2x8xA100-SXM4-80GB"), "auto", TaskTableBuilder())
    assert a100.copies_alike([(0, 4), (1, 5), (2, 6), (3, 7)])
    assert a100.copies_alike([(0, 8), (1, 9)])
    assert not a100.copies_alike([(6, 10), (7, 11), (4, 8), (5, 9)][:2] + [(0, 4)])
    assert not a100.copies_alike([(0, 8), (1, 9), (2, 3)])
    v100 = CommLowering(parse_cluster("8xV100-SXM2-32GB"), "auto", TaskTableBuilder())
    assert not v100.copies_alike([(0, 4), (1, 5)])
