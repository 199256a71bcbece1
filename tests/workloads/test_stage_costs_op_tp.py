"""Per-op tensor-parallel degrees on the cost side (workloads/op_parallel.py): a stage whose
ops all run at the stage's degree costs what today's one-degree stage does, and a block with
the MLP at tp 2 and everything else at tp 1 on 2 GPUs costs what a hand computation says."""

from __future__ import annotations

from collections import Counter

import pytest

from trainsim.hwmodels.gpus import get_gpu
from trainsim.hwmodels.opcost import OpEstimate, RooflineCostModel
from trainsim.workloads.model import build_graph
from trainsim.workloads.op_parallel import OpDegrees, op_parallel_costs, reshard
from trainsim.workloads.ops import CommNeed
from trainsim.workloads.stage_costs import instruction_costs
from trainsim.workloads.zoo import get_model

SEQ = 256
MODEL = get_model("gpt3-125m")  # hidden 768, 12 heads
H = MODEL.hidden


class LinearCost:
    """A cost model a hand computation can follow: 1 s per TFLOP plus 1 s per 100 GB, 100 W."""

    def estimate(self, kind, flops, bytes_moved, gpu, freq_mhz=None, dtype="fp16", shape=None):
        t = flops / 1e12 + bytes_moved / 1e11
        return OpEstimate(time_s=t, compute_s=flops / 1e12, memory_s=bytes_moved / 1e11,
                          overhead_s=0.0, power_w=100.0)


def _layers(batch: int, idx: list[int]):
    graph = build_graph(MODEL, batch, SEQ)
    return [graph.layers[i] for i in idx]


def _costs(idx, *, tp, batch, degrees=None, recompute="none", model=None, direct=False):
    kw = {"recompute": recompute, "cost_model": model or RooflineCostModel(),
          "gpu": get_gpu("V100-SXM2-32GB"), "freq_mhz": None, "dtype": "fp16"}
    layers = _layers(batch, idx)
    deg = None if degrees is None else OpDegrees(
        degrees=tuple(degrees.items()), batch_size=batch, layers_at=lambda b: _layers(b, idx))
    if direct:
        return op_parallel_costs(layers, tp=tp, degrees=deg, **kw)
    return instruction_costs(layers, tp=tp, sp=False, ep=1, op_degrees=deg, **kw)


def _needs(needs) -> Counter:
    return Counter((c.phase, c.collective, c.size_bytes) for c in needs)


@pytest.mark.parametrize("recompute", ["none", "selective", "full", ("attn.qkv", "mlp.gelu")])
@pytest.mark.parametrize("tp", [1, 2])
def test_ops_at_the_stage_degree_cost_what_one_degree_stages_cost(tp, recompute) -> None:
    """Embedding + 3 blocks: the per-op path with every op named at the stage's tp gives the
    same work, activations, parameters and collectives (group size t = the stage's group) as
    instruction_costs without per-op degrees; with op_degrees it short-circuits exactly."""
    idx = [0, 1, 2, 3]
    degrees = {"attn.qkv": tp, "mlp.fc1": tp, "mlp.fc2": tp}
    base = _costs(idx, tp=tp, batch=2, recompute=recompute)
    same = _costs(idx, tp=tp, batch=2, recompute=recompute, degrees=degrees)
    assert same == base and base.params_by_tp == ()
    new = _costs(idx, tp=tp, batch=2, recompute=recompute, degrees=degrees, direct=True)
    for name in ("forward", "backward", "backward_input", "backward_weight", "recompute"):
        assert getattr(new, name).time_s == pytest.approx(getattr(base, name).time_s, rel=1e-12)
        assert getattr(new, name).energy_j == pytest.approx(getattr(base, name).energy_j,
                                                            rel=1e-12)
    assert new.kept_activation_bytes == pytest.approx(base.kept_activation_bytes, rel=1e-12)
    assert new.recompute_activation_bytes == pytest.approx(base.recompute_activation_bytes,
                                                           rel=1e-12)
    assert new.params == base.params and new.params_by_tp == ((tp, base.params),)
    assert new.output_bytes == base.output_bytes
    for name in ("fwd_comm", "bwd_comm", "recompute_comm"):
        assert _needs(getattr(new, name)) == _needs(getattr(base, name))
        assert all(c.group_size == tp for c in getattr(new, name))


def test_mlp_at_tp2_on_two_gpus_matches_a_hand_computation() -> None:
    """One GPT block on 2 GPUs, stage tp 1 (dp 2), micro-batch 4: attention ops run 2 samples
    per GPU unsharded, the MLP (fc1, gelu, fc2) runs all 4 samples split over both GPUs.

    Hand computation (s = 256, h = 768, fp16): forward all-gather of mlp.norm's output for the
    4 samples (2·4·s·h bytes) over 2 ranks, fc2's forward all-reduce (2·4·s·h); backward fc1's
    input all-reduce (2·4·s·h) and the all-gather of fc2's output gradient back to 4 samples
    (2·4·s·h). Work = attention-side ops at batch 2 + MLP ops at batch 4 halved. Saved
    activations: the block's non-MLP ops at batch 2 plus fc1's replicated input 2·4·s·h and
    gelu's and fc2's split inputs 2·4·s·4h/2 each. Parameters per GPU: fc1 and fc2 halved."""
    mlp = ("mlp.fc1", "mlp.gelu", "mlp.fc2")
    c = _costs([1], tp=1, batch=2, degrees=dict.fromkeys(mlp, 2), model=LinearCost())
    act = 2 * 4 * SEQ * H
    assert _needs(c.fwd_comm) == Counter({("fwd", "all_gather", act): 1,
                                          ("fwd", "all_reduce", act): 1})
    assert _needs(c.bwd_comm) == Counter({("bwd", "all_reduce", act): 1,
                                          ("bwd", "all_gather", act): 1})
    assert {n.group_size for n in (*c.fwd_comm, *c.bwd_comm)} == {2}
    assert c.recompute_comm == () and c.recompute.time_s == 0

    two, four = _layers(2, [1])[0], _layers(4, [1])[0]
    others = [op for op in two.ops if op.name not in mlp]
    halves = [op for op in four.ops if op.name in mlp]
    fwd = sum(op.fwd_flops / 1e12 + op.fwd_bytes / 1e11 for op in others) \
        + sum(op.fwd_flops / 2e12 + op.fwd_bytes / 2e11 for op in halves)
    bwd = sum(op.bwd_flops / 1e12 + op.bwd_bytes / 1e11 for op in others) \
        + sum(op.bwd_flops / 2e12 + op.bwd_bytes / 2e11 for op in halves)
    assert c.forward.time_s == pytest.approx(fwd, rel=1e-12)
    assert c.backward.time_s == pytest.approx(bwd, rel=1e-12)
    assert c.forward.power_w == pytest.approx(100.0)

    kept = sum(op.activation_bytes for op in others) + act + 2 * (2 * 4 * SEQ * 4 * H) / 2
    assert c.kept_activation_bytes == pytest.approx(kept)
    fc1 = H * 4 * H + 4 * H
    fc2 = 4 * H * H + H
    assert c.params_by_tp == ((1, two.params - fc1 - fc2), (2, fc1 // 2 + fc2 // 2))
    assert c.params == two.params - (fc1 + fc2) // 2
    assert c.output_bytes == two.output_bytes  # the stage's layout: 2 samples, replicated


def test_attention_at_tp2_from_a_tp2_stage_gathers_in_the_backward() -> None:
    """Stage tp 2 on 2 GPUs (dp 1, 4 samples), layernorms and residual dropouts at tp 1 (2
    samples each): entering a tp-1 op from the stage's tp-2 layout is a local slice forward;
    its backward all-gathers the 4-sample gradient over 2 ranks. Back to tp 2 all-gathers the
    4 samples forward."""
    c = _costs([1], tp=2, batch=4, model=LinearCost(),
               degrees={"attn.norm": 1, "attn.residual": 1, "mlp.norm": 1, "mlp.residual": 1})
    act = 2 * 4 * SEQ * H
    fwd, bwd = _needs(c.fwd_comm), _needs(c.bwd_comm)
    # own collectives: qkv and fc1 backward all-reduces, proj and fc2 forward all-reduces
    assert fwd[("fwd", "all_reduce", act)] == 2 and bwd[("bwd", "all_reduce", act)] == 2
    # norm -> qkv and norm -> fc1 gather 4 samples; residual -> exit gathers too
    assert fwd[("fwd", "all_gather", act)] == 3
    # stage entry -> attn.norm, proj -> attn.residual, fc2 -> mlp.residual: gradient gathers
    # in the backward (attn.residual -> mlp.norm, both tp 1, needs nothing)
    assert bwd[("bwd", "all_gather", act)] == 3


def test_reshard_collectives_follow_the_layout_rules() -> None:
    """Equal degrees: nothing. A column output (split) to a tp-1 op: all-gather over the
    producer's group forward, nothing else forward; the larger producer group gathers the
    gradient backward."""
    assert reshard(2, True, 100.0, 2, True) == ([], [])
    fwd, bwd = reshard(2, True, 100.0, 1, False)
    assert fwd == [CommNeed(phase="fwd", collective="all_gather", size_bytes=100.0,
                            group_size=2)]
    assert bwd == [CommNeed(phase="bwd", collective="all_gather", size_bytes=100.0,
                            group_size=2)]
    fwd, bwd = reshard(1, False, 100.0, 4, True)
    assert fwd == [CommNeed(phase="fwd", collective="all_gather", size_bytes=400.0,
                            group_size=4)]
    assert bwd == [CommNeed(phase="bwd", collective="all_gather", size_bytes=400.0,
                            group_size=4)]


def test_full_recompute_keeps_each_layer_input_at_its_first_ops_layout() -> None:
    """Full recompute with the MLP at tp 2: the kept bytes are the block input at the first
    op's batch (2 samples, 2·2·s·h), the recompute repeats the forward work and the
    collectives inside the block (the MLP's gather and all-reduce), not the reshard into it."""
    mlp = dict.fromkeys(("mlp.fc1", "mlp.gelu", "mlp.fc2"), 2)
    c = _costs([1], tp=1, batch=2, degrees=mlp, recompute="full", model=LinearCost())
    assert c.kept_activation_bytes == pytest.approx(2 * 2 * SEQ * H)
    assert c.recompute.time_s == pytest.approx(c.forward.time_s)
    assert _needs(c.recompute_comm) == _needs(c.fwd_comm)
    none = _costs([1], tp=1, batch=2, degrees=mlp, model=LinearCost())
    assert c.kept_activation_bytes + c.recompute_activation_bytes == pytest.approx(
        none.kept_activation_bytes)


def test_comm_need_group_size_is_checked() -> None:
    """group_size defaults to 0 (the stage's tp group) and refuses negatives and bools."""
    assert CommNeed(phase="fwd", collective="all_reduce", size_bytes=1.0).group_size == 0
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match="group_size"):
            CommNeed(phase="fwd", collective="all_reduce", size_bytes=1.0, group_size=bad)


def test_every_op_at_tp2_on_a_tp1_stage_is_a_tp2_stage_plus_boundary_gathers() -> None:
    """Two blocks on a 2-GPU stage of tp 1 (2 samples per GPU) with every op at tp 2 (4
    samples over both GPUs) cost what a tp-2 stage of 4 samples costs — work, activations,
    parameters, its own collectives — plus the reshards at the stage's boundaries: the input
    all-gathered to 4 samples forward and the output gradient all-gathered backward."""
    idx = [1, 2]
    names = {op.name for op in _layers(1, idx)[0].ops}
    per_op = _costs(idx, tp=1, batch=2, degrees=dict.fromkeys(names, 2), model=LinearCost())
    tp2 = _costs(idx, tp=2, batch=4, model=LinearCost())
    for name in ("forward", "backward", "backward_input", "backward_weight"):
        assert getattr(per_op, name).time_s == pytest.approx(getattr(tp2, name).time_s,
                                                             rel=1e-12)
    assert per_op.kept_activation_bytes == pytest.approx(tp2.kept_activation_bytes)
    assert per_op.params_by_tp == ((2, tp2.params),)
    act = 2 * 4 * SEQ * H
    assert _needs(per_op.fwd_comm) == _needs(tp2.fwd_comm) + Counter(
        {("fwd", "all_gather", act): 1})
    assert _needs(per_op.bwd_comm) == _needs(tp2.bwd_comm) + Counter(
        {("bwd", "all_gather", act): 1})
    assert per_op.output_bytes == pytest.approx(tp2.output_bytes / 2)  # 2 samples, not 4


def test_stage_op_degrees_of_a_plan() -> None:
    """A plan with the MLP at tp 2 on stage 0 only: stage 0 gets its degrees (costed by the
    per-op path), stage 1 None (costed exactly as a one-degree stage)."""
    from trainsim.hwmodels.cluster import parse_cluster
    from trainsim.workloads.op_parallel import stage_op_degrees
    from trainsim.workloads.plan import ParallelPlan

    plan = ParallelPlan.build(MODEL, parse_cluster("4xV100-SXM2-32GB"), pp=2,
                              stage_gpus=(2, 2), micro_batch_size=4, global_batch=16,
                              stage_op_tp=({"mlp.fc1": 2, "mlp.gelu": 2, "mlp.fc2": 2}, {}))
    assert stage_op_degrees(plan, 1, 2, lambda b: _layers(b, [1])) is None
    deg = stage_op_degrees(plan, 0, plan.replica_batch(0, 4), lambda b: _layers(b, [1]))
    assert deg is not None and deg.batch_size == 2
    assert deg.degrees == (("mlp.fc1", 2), ("mlp.fc2", 2), ("mlp.gelu", 2))
    kw = {"tp": 1, "sp": False, "ep": 1, "recompute": "none", "cost_model": LinearCost(),
          "gpu": get_gpu("V100-SXM2-32GB"), "freq_mhz": None, "dtype": "fp16"}
    c = instruction_costs(_layers(2, [1]), op_degrees=deg, **kw)
    assert c == _costs([1], tp=1, batch=2, model=LinearCost(),
                       degrees={"mlp.fc1": 2, "mlp.gelu": 2, "mlp.fc2": 2})
