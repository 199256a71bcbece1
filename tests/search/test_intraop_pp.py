"""Intra-op sharding inside pipeline stages ("intraop-pp", search/intraop/pipeline.py): the
stage split, FLOPs across stages, pp = 1 as today's plan, memory as the engine's peak, 1F1B
order, the memory-bound case and the CLI."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.intraop.pipeline import (
    PipelineResult,
    one_f_one_b,
    run_intraop_pp,
    split_layers,
    submesh_shape,
)
from trainsim.search.intraop.planner import IntraopMemoryError, run_intraop
from trainsim.simulator.engines import run_program
from trainsim.workloads.model import build_graph
from trainsim.workloads.sharding.mesh import DeviceMesh
from trainsim.workloads.zoo import get_model

A100_2X4 = parse_cluster("2x4xA100-SXM4-40GB")


@pytest.fixture(scope="module")
def pipelined() -> list[PipelineResult]:
    """gpt3-350m on 2 × 4 A100, forced to pp = 2 and pp = 4 (several micro-batch counts)."""
    return [run_intraop_pp("gpt3-350m", A100_2X4, global_batch=8, mesh="2x4",
                           pp_choices=(pp,), mb_factors=(1, 2)) for pp in (2, 4)]


def test_submesh_and_stage_split() -> None:
    assert submesh_shape(DeviceMesh((2, 4)), 2) == (4,)  # one node per stage
    assert submesh_shape(DeviceMesh((2, 4)), 4) == (2,)
    assert submesh_shape(DeviceMesh((2, 4)), 8) == (1,)
    assert submesh_shape(DeviceMesh((8,)), 3) is None
    assert submesh_shape(DeviceMesh((4,)), 8) is None
    parts = split_layers([1.0, 1.0, 1.0, 5.0, 1.0, 1.0], 3)
    assert [list(p) for p in parts] == [[0, 1, 2], [3], [4, 5]]


def test_flops_conserved_across_stages(pipelined: list[PipelineResult]) -> None:
    """Every op of the model runs in exactly one stage, M times; what the GPUs run is that
    plus only the work the plans replicate."""
    for r in pipelined:
        assert r.pp > 1 and len(r.stages) == r.pp
        full = build_graph(get_model("gpt3-350m"), r.global_batch)
        model_flops = sum(op.fwd_flops + op.bwd_flops for la in full.layers for op in la.ops)
        seen = [f for st in r.stages for f in st.full_nodes if f >= 0]
        assert sorted(seen) == list(range(len(seen)))
        staged = sum((n.op.fwd_flops + n.op.bwd_flops) * r.micro_batches
                     for st in r.stages for n in st.graph.nodes)
        assert staged == pytest.approx(model_flops, rel=1e-12)
        run = sum(st.plan.device_flops() * st.plan.mesh.size * r.micro_batches
                  for st in r.stages)
        replicas = sum((n.op.fwd_flops + n.op.bwd_flops) * st.plan.mesh.size / s.work_div
                       * r.micro_batches for st in r.stages
                       for n, s in zip(st.graph.nodes, st.plan.strategies, strict=True))
        assert run == pytest.approx(replicas, rel=1e-12)
        assert run >= model_flops * (1 - 1e-12)


def test_pp1_is_todays_intraop_plan() -> None:
    one = run_intraop_pp("gpt3-350m", A100_2X4, global_batch=8, mesh="2x4", pp_choices=(1,),
                         mb_factors=(1,))
    today = run_intraop("gpt3-350m", A100_2X4, method="intraop", global_batch=8, mesh="2x4")
    assert (one.pp, one.micro_batches) == (1, 1)
    assert one.stages[0].plan.strategies == today.plan.strategies
    assert one.iteration_time_s == today.iteration_time_s
    assert one.memory_bytes == today.memory_bytes


def test_plan_memory_is_the_engine_peak(pipelined: list[PipelineResult]) -> None:
    for r in pipelined:
        assert r.program is not None
        result = run_program(r.program)
        assert result.peak_memory_bytes == pytest.approx(r.memory_bytes, rel=1e-9)
        assert result.iteration_time_s == pytest.approx(r.iteration_time_s, rel=1e-9)
        per_stage = [st.memory_bytes() for st in r.stages]
        assert r.memory_bytes == max(per_stage)
        assert per_stage[0] > per_stage[-1]  # 1F1B: the first stage holds the most


def test_each_micro_batch_runs_forward_and_backward_once_per_stage_in_1f1b_order(
        pipelined: list[PipelineResult]) -> None:
    for r in pipelined:
        assert r.program is not None
        fp = r.program.freeze()
        kinds = np.asarray(fp.kind_names)[fp.kind_code]
        count: defaultdict[tuple[str, int, int, int], int] = defaultdict(int)
        order: defaultdict[int, list[tuple[str, int]]] = defaultdict(list)
        for t in range(fp.num_tasks):
            if kinds[t] not in ("forward", "backward"):
                continue
            kind = "F" if kinds[t] == "forward" else "B"
            for rank in fp.member_rank[fp.member_ptr[t]:fp.member_ptr[t + 1]]:
                count[(kind, int(fp.stage[t]), int(fp.micro_batch[t]), int(rank))] += 1
                if not order[int(rank)] or order[int(rank)][-1] != (kind, int(fp.micro_batch[t])):
                    order[int(rank)].append((kind, int(fp.micro_batch[t])))
        for st in r.stages:
            ops = sum(1 for f in st.full_nodes if f >= 0)
            for m in range(r.micro_batches):
                for rank in st.ranks:
                    assert count[("F", st.index, m, rank)] == ops
                    assert count[("B", st.index, m, rank)] == ops
                    assert order[rank] == one_f_one_b(st.index, r.pp, r.micro_batches)
        assert len(count) == 2 * r.micro_batches * sum(len(st.ranks) for st in r.stages)


def test_pipelined_plan_fits_where_no_single_mesh_plan_does() -> None:
    """Below the least memory any single-mesh sharding of a GPT-1.3B needs on 4 V100s, the
    grid (micro-batches, stages) still finds a plan, and the engine's peak stays within."""
    v100 = parse_cluster("1x4xV100-SXM2-16GB")
    with pytest.raises(IntraopMemoryError) as info:
        run_intraop("gpt3-1.3b", v100, method="intraop", global_batch=8, mesh="4",
                    memory_limit_gb=1.0)
    assert info.value.least_bytes is not None
    limit_gb = info.value.least_bytes * 0.9 / 1e9
    r = run_intraop_pp("gpt3-1.3b", v100, global_batch=8, mesh="4", memory_limit_gb=limit_gb)
    assert r.micro_batches > 1
    assert r.program is not None
    assert run_program(r.program).peak_memory_bytes <= limit_gb * 1e9


@pytest.mark.slow
def test_llama_on_v100_pipeline_stages_fit_where_one_mesh_does_not() -> None:
    """llama2-7b on 2 × 4 V100-32GB (memory binds): at 0.9 × the least memory of any
    single-mesh plan, a plan with pipeline stages fits; print it."""
    v100 = parse_cluster("2x4xV100-SXM2-32GB")
    with pytest.raises(IntraopMemoryError) as info:
        run_intraop("llama2-7b", v100, method="intraop", global_batch=4, mesh="2x4",
                    memory_limit_gb=1.0, dtype="fp16")
    assert info.value.least_bytes is not None
    limit_gb = info.value.least_bytes * 0.9 / 1e9
    r = run_intraop_pp("llama2-7b", v100, global_batch=4, mesh="2x4", memory_limit_gb=limit_gb,
                       dtype="fp16", pp_choices=(2, 4, 8))
    print(f"llama2-7b 2x4 V100 at {limit_gb:.2f} GB: pp {r.pp} × {r.micro_batches}, "
          f"{r.samples_per_s:.3f} samples/s, {r.memory_bytes / 1e9:.2f} GB/GPU")
    assert r.pp > 1 and r.memory_bytes <= limit_gb * 1e9
    unlimited = run_intraop_pp("llama2-7b", v100, global_batch=4, mesh="2x4", dtype="fp16")
    single = run_intraop("llama2-7b", v100, method="intraop", global_batch=4, mesh="2x4",
                         dtype="fp16")
    print(f"unlimited: intraop-pp pp {unlimited.pp} × {unlimited.micro_batches} "
          f"{unlimited.samples_per_s:.3f} samples/s vs intraop {single.samples_per_s:.3f}")
    assert unlimited.iteration_time_s <= single.iteration_time_s


def test_cli_intraop_pp(sim: Callable[[list[str]], tuple[int, str, str]],
                       tmp_path: Path) -> None:
    code, out, err = sim(["search", "--method", "intraop-pp", "--model", "gpt3-350m",
                          "--cluster", "2x4xA100-SXM4-40GB", "--global-batch", "8",
                          "--mesh", "2x4", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["pp"] * len(doc["stages"][0]["gpus"]) == 8
    assert {(c["pp"], c["micro_batches"]) for c in doc["grid"]} >= {(1, 1), (2, 2), (4, 4)}
    code, out, err = sim(["search", "--method", "intraop-pp", "--model", "gpt3-350m",
                          "--cluster", "2x4xA100-SXM4-40GB", "--global-batch", "8",
                          "--mesh", "2x4", "--out", str(tmp_path)])
    assert code == 0, err
    assert "grid (pp × micro-batches" in out
    assert (tmp_path / "intraop_timeline.html").stat().st_size > 0
    code, _out, err = sim(["search", "--method", "intraop-pp", "--model", "gpt3-350m",
                           "--cluster", "2x4xA100-SXM4-40GB", "--global-batch", "8",
                           "--memory-limit-gb", "0.5"])
    assert code == 3
    assert len(err.strip().splitlines()) == 1 and "smallest limit any plan meets" in err


def test_last_stage_keeps_and_all_reduces_a_copy_of_the_tied_embedding(
        pipelined: list[PipelineResult]) -> None:
    """gpt3-350m's LM head reads the word embedding: with the head on another stage than the
    embedding, that stage holds a copy (weights, gradients, optimizer states) and GPU i of
    the first stage all-reduces the copies' gradients with GPU i of the last."""
    from trainsim.workloads.sharding.plan import holds_tied_copy, static_bytes
    from trainsim.workloads.stage_costs import optimizer_bytes_per_param

    spec = get_model("gpt3-350m")
    for r in pipelined:
        first, last = r.stages[0], r.stages[-1]
        assert not any(holds_tied_copy(first.graph, i) for i in range(len(first.graph.nodes)))
        (head,) = [i for i in range(len(last.graph.nodes)) if holds_tied_copy(last.graph, i)]
        node, st = last.graph.nodes[head], last.plan.strategies[head]
        assert node.tied_params == spec.vocab_size * spec.hidden
        dtype = last.plan.dtype
        assert static_bytes(last.graph, st, head, dtype) == \
            -(-node.tied_params // st.param_div) * sum(optimizer_bytes_per_param(dtype))
        assert r.program is not None
        fp = r.program.tasks
        names = np.asarray(fp.name_templates)[fp.name_code]
        syncs = np.flatnonzero(names == "embedding.all_reduce")
        pairs = {tuple(fp.member_rank[fp.member_ptr[t]:fp.member_ptr[t + 1]].tolist())
                 for t in syncs}
        assert pairs == set(zip(first.ranks, last.ranks, strict=True))
