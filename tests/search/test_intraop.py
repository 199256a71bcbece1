"""The intra-operator planners (issue 17): CFP's DP and Alpa's ILP, Megatron as an optimum,
Oracle evaluation counts, memory limits and the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.intraop.alpa import solve_ilp
from trainsim.search.intraop.blocks import build_blocks
from trainsim.search.intraop.cfp import CfpSolver
from trainsim.search.intraop.costs import AlphaBetaPricing, OraclePricing
from trainsim.search.intraop.megatron import megatron_plan
from trainsim.search.intraop.planner import (
    IntraopMemoryError,
    least_memory_bytes,
    run_intraop,
)
from trainsim.search.intraop.problem import build_problem, plan_cost
from trainsim.simulator.engines import run_program
from trainsim.workloads.model import build_graph
from trainsim.workloads.sharding.graph import build_spmd_graph
from trainsim.workloads.sharding.mesh import DeviceMesh
from trainsim.workloads.zoo import get_model

A100 = parse_cluster("1x8xA100-SXM4-40GB")


def _megatron_cost(problem, blocks, graph, mesh) -> float:  # type: ignore[no-untyped-def]
    """The better of Megatron's TP and TP + sequence parallelism under the problem's costs."""
    costs = []
    for sp in (False, True):
        plan = megatron_plan(graph, mesh, "fp16", sp)
        choice = [b.options.index(tuple(plan.strategies[n] for n in b.nodes)) for b in blocks]
        costs.append(plan_cost(problem, choice)[0])
    return min(costs)


@pytest.mark.parametrize("model", ["gpt3-1.3b", "gpt3-6.7b"])
@pytest.mark.parametrize("pricing_kind", ["alpha_beta", "oracle"])
def test_megatron_tp_is_an_optimum_of_a_dense_gpt_layer(model: str, pricing_kind: str) -> None:
    """One GPT layer, one sample (so no data parallelism), tp = world size = 8: both planners'
    optimum costs what Megatron's hand-written TP costs, under each cost model."""
    graph = build_spmd_graph(build_graph(get_model(model), 1), (1,))
    mesh = DeviceMesh((8,))
    blocks = build_blocks(graph, mesh)
    pricing = AlphaBetaPricing(A100, mesh, "fp16") if pricing_kind == "alpha_beta" \
        else OraclePricing(A100, mesh, "fp16")
    problem = build_problem(graph, blocks, A100, pricing, engine=pricing_kind == "oracle")
    megatron = _megatron_cost(problem, blocks, graph, mesh)
    ilp = solve_ilp(problem, None, 30.0)
    assert ilp.status == "optimal" and ilp.mip_gap == pytest.approx(0.0, abs=1e-9)
    cfp = CfpSolver(problem, pricing).solve()
    assert ilp.objective_s == pytest.approx(megatron, rel=1e-9)
    assert cfp.time_s == pytest.approx(megatron, rel=1e-9)
    heads = [b.options[k][0].roles[0] for b, k in zip(blocks, cfp.choice, strict=True)
             if graph.nodes[b.nodes[0]].op.kind == "matmul"]
    assert heads == ["col", "row", "col", "row"]


@pytest.mark.parametrize("model,shape", [("gpt3-350m", (8,)), ("gpt3-350m", (2, 4)),
                                         ("gpt-moe-1.3b-8e", (2, 4)), ("bert-large", (4,))])
def test_cfp_dp_equals_the_ilp_under_the_same_cost_model(model: str,
                                                         shape: tuple[int, ...]) -> None:
    """Given Alpa's α-β costs, the DP over segments and the ILP are both exact: same optimum."""
    graph = build_spmd_graph(build_graph(get_model(model), 8, 512))
    mesh = DeviceMesh(shape)
    blocks = build_blocks(graph, mesh)
    pricing = AlphaBetaPricing(A100, mesh, "fp16")
    problem = build_problem(graph, blocks, A100, pricing, engine=False)
    ilp = solve_ilp(problem, None, 60.0)
    assert ilp.status == "optimal"
    dp = CfpSolver(problem, pricing).solve()
    assert dp.time_s == pytest.approx(ilp.objective_s, rel=1e-7)
    assert plan_cost(problem, dp.choice)[0] == pytest.approx(dp.time_s, rel=1e-9)


def test_cfp_evaluates_ten_times_fewer_candidates_than_the_ilp_space() -> None:
    result = run_intraop("gpt3-1.3b", A100, method="intraop", global_batch=8, mesh="2x4")
    assert result.oracle_evaluations > 0
    assert result.oracle_evaluations * 10 <= result.strategy_space


@pytest.mark.parametrize("model", ["gpt3-350m", "gpt-moe-1.3b-8e"])
def test_cfp_plan_at_least_as_good_as_the_ilp_plan_on_the_engine(model: str) -> None:
    cfp = run_intraop(model, A100, method="intraop", global_batch=8)
    alpa = run_intraop(model, A100, method="alpa", global_batch=8)
    assert alpa.ilp is not None and alpa.ilp.status == "optimal"
    assert cfp.iteration_time_s <= alpa.iteration_time_s * (1 + 1e-9)


def test_cfp_beats_megatron_tp_on_moe() -> None:
    cfp = run_intraop("gpt-moe-1.3b-8e", A100, method="intraop", global_batch=8)
    hand = run_intraop("gpt-moe-1.3b-8e", A100, method="megatron", global_batch=8)
    assert cfp.iteration_time_s < hand.iteration_time_s
    assert any(s.roles == ("ep",) for s in cfp.plan.strategies)  # experts sharded


@pytest.mark.parametrize("method", ["intraop", "alpa"])
def test_unsolvable_memory_limit_names_the_smallest_limit(method: str) -> None:
    with pytest.raises(IntraopMemoryError, match="smallest limit any plan meets is") as info:
        run_intraop("gpt3-1.3b", A100, method=method, global_batch=8, memory_limit_gb=1.0)
    least_gb = float(str(info.value).split("meets is ")[1].split(" GB")[0])
    # at that limit (rounded up) a plan exists and fits
    ok = run_intraop("gpt3-1.3b", A100, method=method, global_batch=8,
                     memory_limit_gb=least_gb + 0.01)
    assert ok.memory_bytes <= (least_gb + 0.01) * 1e9


def test_memory_limit_is_respected_by_both_planners() -> None:
    free = run_intraop("gpt3-1.3b", A100, method="alpa", global_batch=8)
    limit_gb = free.memory_bytes / 1e9 * 0.6
    for method in ("intraop", "alpa"):
        r = run_intraop("gpt3-1.3b", A100, method=method, global_batch=8,
                        memory_limit_gb=limit_gb)
        assert r.memory_bytes <= limit_gb * 1e9


def test_least_memory_is_what_the_dp_finds_with_memory_only() -> None:
    graph = build_spmd_graph(build_graph(get_model("gpt3-350m"), 8, 512))
    mesh = DeviceMesh((8,))
    pricing = OraclePricing(A100, mesh, "fp16")
    problem = build_problem(graph, build_blocks(graph, mesh), A100, pricing, engine=False)
    _best, least = CfpSolver(problem, pricing).solve_with_limit(None)
    assert least.memory_bytes == pytest.approx(least_memory_bytes(problem), rel=1e-12)


def test_cli_writes_plan_summary_and_timeline(sim: Callable[[list[str]], tuple[int, str, str]],
                                              tmp_path: Path) -> None:
    code, out, err = sim(["search", "--method", "intraop", "--model", "gpt3-350m",
                          "--cluster", "2x4xA100-SXM4-40GB", "--global-batch", "8",
                          "--mesh", "2x4", "--out", str(tmp_path)])
    assert code == 0, err
    assert "Oracle evaluations" in out
    doc = json.loads((tmp_path / "intraop_plan.json").read_text())
    assert doc["plan"]["mesh"] == [2, 4]
    assert {"op", "strategy", "inputs", "output"} <= set(doc["plan"]["ops"][0])
    assert (tmp_path / "intraop_timeline.html").stat().st_size > 0
    code, out, err = sim(["search", "--method", "alpa", "--model", "gpt3-350m", "--cluster",
                          "1x8xA100-SXM4-40GB", "--global-batch", "8", "--json"])
    assert code == 0, err
    assert json.loads(out)["ilp"]["mip_gap"] == pytest.approx(0.0, abs=1e-9)


def test_cli_exit_codes(sim: Callable[[list[str]], tuple[int, str, str]]) -> None:
    code, _out, err = sim(["search", "--method", "alpa", "--model", "gpt3-1.3b", "--cluster",
                           "1x8xA100-SXM4-40GB", "--global-batch", "8",
                           "--memory-limit-gb", "1"])
    assert code == 3
    assert len(err.strip().splitlines()) == 1 and "smallest limit any plan meets" in err
    code, _out, err = sim(["search", "--method", "intraop", "--model", "gpt3-350m",
                           "--cluster", "1x8xA100-SXM4-40GB", "--global-batch", "8",
                           "--mesh", "3x3"])
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "mesh" in err


def test_recompute_fits_where_no_sharding_alone_does() -> None:
    """Beyond CFP: below the least memory of any sharding, per-block recompute still finds a
    plan, and the engine's peak stays within the limit."""
    v100 = parse_cluster("1x4xV100-SXM2-16GB")
    with pytest.raises(IntraopMemoryError) as info:
        run_intraop("gpt3-1.3b", v100, method="intraop", global_batch=8, mesh="4",
                    memory_limit_gb=1.0)
    least_gb = float(str(info.value).split("meets is ")[1].split(" GB")[0])
    limit_gb = least_gb * 0.97
    r = run_intraop("gpt3-1.3b", v100, method="intraop", global_batch=8, mesh="4",
                    memory_limit_gb=limit_gb, recompute=True)
    assert r.plan.recompute_group and max(r.plan.recompute_group) >= 0
    assert r.program is not None
    peak = run_program(r.program).peak_memory_bytes
    assert peak == pytest.approx(r.memory_bytes, rel=1e-9)
    assert peak <= limit_gb * 1e9


def test_same_inputs_give_the_same_plan() -> None:
    first = run_intraop("gpt3-350m", A100, method="intraop", global_batch=8, mesh="2x4")
    again = run_intraop("gpt3-350m", A100, method="intraop", global_batch=8, mesh="2x4")
    assert json.dumps(first.to_dict(), sort_keys=True) == \
        json.dumps(again.to_dict(), sort_keys=True)


@pytest.mark.parametrize("method", ["intraop", "alpa"])
def test_a_limit_megatron_meets_is_met_and_not_beaten(method: str) -> None:
    """Megatron-LM's plan is in the searches' space: CFP's blocks lacked its vocabulary-
    parallel embedding and head, so a 3.2 GB limit was refused ("the smallest limit any plan
    meets is 3.56 GB") while the Megatron baseline ran in 3.10 GB (the planner bug hunt)."""
    kw = {"global_batch": 8, "memory_limit_gb": 3.2}
    four = parse_cluster("1x4xA100-SXM4-40GB")
    baseline = run_intraop("gpt3-125m", four, method="megatron", **kw)
    found = run_intraop("gpt3-125m", four, method=method, **kw)
    assert found.memory_bytes <= 3.2e9
    assert found.iteration_time_s <= baseline.iteration_time_s * (1 + 1e-9)
