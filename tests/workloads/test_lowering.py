"""Lowering: ParallelPlan + zoo model + cluster → Program, checked against hand formulas.

Collective times use the α-β formulas of simulator/collectives.py with the cluster's own link
figures (2×A10 nodes: PCIe 4.0 x16 inside a node, one 50 Gb/s NIC per node, so the NIC is the
bottleneck of every inter-node transfer), priced as measured (hwmodels/collectives.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from trainsim.errors import PlanError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.hwmodels.collectives import collective_models
from trainsim.simulator.collectives import (
    hierarchical_all_reduce_time_s,
    ring_all_reduce_time_s,
)
from trainsim.simulator.engine_simpy import run_simpy
from trainsim.workloads.lowering import LoweringOptions, lower, stage_layout
from trainsim.workloads.lowering.layout import LoweringLayout
from trainsim.workloads.model import build_graph
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

ONE_BUCKET = 1e15
"""A gradient bucket larger than any model: one data-parallel all-reduce per stage."""


def _lower(model: str, cluster: str, options: LoweringOptions | None = None, **plan):
    spec, hw = get_model(model), parse_cluster(cluster)
    built = ParallelPlan.build(spec, hw, **plan)
    program = lower(spec, hw, built, options)
    return spec, hw, program, run_simpy(program)


def _rows(result, **where):
    frame = result.tasks
    for key, value in where.items():
        frame = frame[frame[key] == value]
    return frame


def _path_latency(hw, src: int, dst: int) -> float:
    return sum(link.latency_s for link in hw.path(src, dst))


def _measured_s(kind: str, link_class: str, steps: int, inter_steps: int, volume: float,
                bandwidth: float, *, first: bool, intra: str | None = None) -> float:
    """One phase alone as hwmodels/collectives.py prices it: the chosen protocol's latency plus
    volume / (bandwidth × efficiency) (NCCL's cost model with measured bus efficiencies)."""
    price = collective_models().price(kind, link_class, steps=steps, volume_bytes=volume,
                                      bandwidth_bytes_per_s=bandwidth, first=first,
                                      inter_steps=inter_steps, intra_class_name=intra,
                                      multi_node=True)
    return price.latency_s + volume / (bandwidth * price.efficiency)


# ----------------------------------------------------------------------------- collectives
def test_lone_ring_all_reduce_takes_its_formula_time() -> None:
    """dp=2 over two nodes: the gradient all-reduce of S = 2 bytes × parameters moves
    2(n−1)/n·S over the NIC (bottleneck) in 2(n−1) network steps, priced as measured
    (Ethernet: NCCL's network step latencies, busbw 48 % of line rate)."""
    opts = LoweringOptions(dp_bucket_bytes=ONE_BUCKET, collective_algorithm="ring")
    spec, hw, _program, result = _lower("gpt3-125m", "2x1xA10", opts, dp=2,
                                       num_micro_batches=1, seq_len=128)
    size = 2.0 * build_graph(spec, 1, 128).parameters
    nic = hw.link("n0.nic.out").bandwidth_bytes_per_s
    expected = _measured_s("all_reduce", "ethernet", 2, 2, size, nic, first=True)
    assert expected > ring_all_reduce_time_s(2, size, _path_latency(hw, 0, 1), nic)
    dp = _rows(result, stream="dp", kind="all_reduce")
    assert len(dp) == 1
    assert dp["duration_s"].iloc[0] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("fold", [True, False])
def test_two_all_reduces_through_one_nic_take_twice_as_long(fold) -> None:
    """tp=2 inside each of two A10 nodes, dp=2 across them: the two tensor-parallel ranks'
    gradient all-reduces both cross each node's NIC at once, so each moves its bytes at half the
    NIC bandwidth — folded (one task on a half-bandwidth virtual link) and unfolded alike."""
    opts = LoweringOptions(dp_bucket_bytes=ONE_BUCKET, collective_algorithm="ring", fold=fold)
    _, hw, program, result = _lower("gpt3-125m", "2x2xA10", opts, dp=2, tp=2,
                                    num_micro_batches=1, seq_len=128)
    nic = hw.link("n0.nic.out").bandwidth_bytes_per_s
    dp = _rows(result, stream="dp", kind="all_reduce").drop_duplicates("task_id")
    assert len(dp) == (1 if fold else 2)
    for _, row in dp.iterrows():
        task = program.tasks[row.task_id]
        alone = task.duration_s + task.comm_bytes / nic
        shared = task.duration_s + 2 * task.comm_bytes / nic
        assert row.duration_s == pytest.approx(shared, rel=1e-12)
        assert row.duration_s > 1.9 * (alone - task.duration_s)


def test_hierarchical_all_reduce_follows_three_phase_formula() -> None:
    """dp=4 on 2 nodes × 2 GPUs with the hierarchical algorithm: intra-node reduce-scatter
    ((k−1)/k·S over PCIe, k−1 steps), inter-node all-reduce of S/k by both local ranks through
    the NIC (S on the NIC, 2(N−1) network steps), intra-node all-gather — each priced as
    measured, the protocol start-up paid once."""
    opts = LoweringOptions(dp_bucket_bytes=ONE_BUCKET, collective_algorithm="hierarchical")
    spec, hw, _, result = _lower("gpt3-125m", "2x2xA10", opts, dp=4, num_micro_batches=1,
                                 seq_len=128)
    size = 2.0 * build_graph(spec, 1, 128).parameters
    intra_bw = min(link.bandwidth_bytes_per_s for link in hw.path(0, 1))
    nic = hw.link("n0.nic.out").bandwidth_bytes_per_s
    expected = (_measured_s("reduce_scatter", "pcie", 1, 0, size / 2, intra_bw, first=True)
                + _measured_s("all_reduce", "ethernet", 2, 2, size, nic, first=False,
                              intra="pcie")
                + _measured_s("all_gather", "pcie", 1, 0, size / 2, intra_bw, first=False))
    assert expected > hierarchical_all_reduce_time_s(
        2, 2, size, _path_latency(hw, 0, 1), intra_bw, _path_latency(hw, 0, 2), nic)
    dp = _rows(result, stream="dp", rank=0)
    assert len(dp) == 3  # reduce-scatter, inter-node all-reduce, all-gather
    assert dp["end_s"].max() - dp["start_s"].min() == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------- features
def test_t5_pipeline_sends_encoder_output_to_decoder_stages() -> None:
    """T5 over 4 stages: a boundary inside the decoder carries the decoder hidden state
    (b·s_dec·h·2 bytes) plus the encoder output its cross attention reads (b·s_enc·h·2)."""
    spec, _, program, result = _lower("t5-770m", "4xA100-SXM4-80GB", pp=4, num_micro_batches=2)
    h, s_enc, s_dec = spec.hidden, spec.seq_len, spec.decoder_seq_len
    sends = {t.name: t.comm_bytes for t in program.tasks if t.kind == "p2p"}
    assert sends["s0>1.F0"] == 2 * s_enc * h  # inside the encoder
    assert sends["s2>3.F0"] == 2 * s_dec * h + 2 * s_enc * h  # inside the decoder
    assert result.iteration_time_s > 0 and not result.oom


def test_moe_expert_parallel_all_to_alls() -> None:
    """ep=4 of an 8-expert MoE on 8 GPUs: every MoE block's dispatch and combine run as
    all-to-alls over 4 GPUs, forward and backward; ep=1 has none."""
    _, _, program, _result = _lower("gpt-moe-1.3b-8e", "8xA100-SXM4-80GB", dp=8, ep=4,
                                   num_micro_batches=1, seq_len=256)
    a2a = [t for t in program.tasks if t.kind == "all_to_all"]
    assert {t.stream for t in a2a} == {"ep"}
    assert len(a2a) == 2  # one merged forward, one merged backward task (folded)
    _, _, dense, _ = _lower("gpt-moe-1.3b-8e", "8xA100-SXM4-80GB", dp=8, num_micro_batches=1,
                            seq_len=256)
    assert not [t for t in dense.tasks if t.kind == "all_to_all"]


def test_wide_resnet_pipeline_runs() -> None:
    """Wide-ResNet (convolutions) lowers and runs; its throughput counts images."""
    _, _, _program, result = _lower("wresnet-500m", "4xV100-SXM2-32GB", pp=4,
                                   micro_batch_size=8, num_micro_batches=4)
    assert result.samples_per_s == pytest.approx(32 / result.iteration_time_s)
    assert result.tokens_per_s == result.samples_per_s


def test_heterogeneous_placement_puts_stages_on_their_gpus() -> None:
    """1 A100 node + 2 A10 nodes, stages 0,1 placed on the A10 group and 2,3 on the A100 one:
    the A10 stages take longer per forward and report the A10's peak FLOPs."""
    _, hw, program, _result = _lower("gpt3-1.3b", "1x8xA100-SXM4-40GB+2x4xA10", dp=4, pp=4,
                                    num_micro_batches=4, placement=(1, 1, 0, 0), seq_len=512)
    assert program.represents[0] == (8, 9, 10, 11) and program.represents[2] == (0, 1, 2, 3)
    names = program.info.gpu_names
    assert names is not None
    assert names[0] == hw.gpu(8).name != names[2] == hw.gpu(0).name
    fwd = {t.stage: t.duration_s for t in program.tasks if t.name.endswith(".F1")}
    assert fwd[1] > fwd[2]


def test_zero_stages_divide_static_memory() -> None:
    """Per GPU static memory is Ψ·(2 + 2 + 12) bytes without ZeRO, Ψ·(2 + 2 + 12/dp) with ZeRO-1,
    Ψ·(2 + (2 + 12)/dp) with ZeRO-2 and Ψ·16/dp with ZeRO-3 (Rajbhandari et al. 2020, Fig. 1)."""
    statics = {}
    for zero in range(4):
        _, _, program, _ = _lower("gpt3-125m", "4xA100-SXM4-80GB", dp=4, zero=zero,
                                  num_micro_batches=1, seq_len=128)
        statics[zero] = program.static_memory_bytes[0]
    psi = statics[0] / 16
    assert psi == build_graph(get_model("gpt3-125m"), 1, 128).parameters
    assert statics[1] == pytest.approx(psi * (4 + 12 / 4))
    assert statics[2] == pytest.approx(psi * (2 + 14 / 4))
    assert statics[3] == pytest.approx(psi * 16 / 4)


def test_zero3_gathers_parameters_before_every_pass() -> None:
    """ZeRO-3 all-gathers the stage's weights before each forward and backward."""
    _, _, program, _ = _lower("gpt3-125m", "4xA100-SXM4-80GB", dp=4, zero=3,
                              num_micro_batches=3, seq_len=128)
    gathers = [t for t in program.tasks if t.name.endswith(".gather")]
    assert len(gathers) == 2 * 3


def test_sequence_parallel_splits_activations_by_tp() -> None:
    """With tp=4 a block keeps s·b·h·(10 + 24/t) + 4·a·s·b/t bytes; sequence parallelism makes
    it (s·b·h·34 + 4·a·s·b)/t (Korthikanti et al. 2022, Table 2, with flash attention: no s²
    term, the fp32 logsumexp 4·a·s·b instead)."""
    opts = LoweringOptions(embedding_and_head=False)
    kept = {}
    for sp in (False, True):
        _, _, program, _ = _lower("gpt3-350m", "4xA100-SXM4-80GB", opts, tp=4, sp=sp,
                                  num_micro_batches=1, seq_len=256)
        kept[sp] = next(t.mem_alloc_bytes for t in program.tasks if t.name == "s0.F0")
    spec = get_model("gpt3-350m")
    s, h, a, t, L = 256, spec.hidden, spec.num_heads, 4, spec.num_layers
    assert kept[True] == pytest.approx(L * (s * h * 34 + 4 * a * s) / t, rel=1e-12)
    assert kept[False] == pytest.approx(L * (s * h * (10 + 24 / t) + 4 * a * s / t),
                                        rel=1e-12)


def test_per_op_recompute_list() -> None:
    """Recomputing only the fused attention op keeps fewer bytes (its logsumexp) and adds a
    recompute task shorter than the full forward."""
    _, _, base, r0 = _lower("gpt3-350m", "2xA100-SXM4-80GB", pp=2, num_micro_batches=2,
                            seq_len=256)
    _, _, prog, r1 = _lower("gpt3-350m", "2xA100-SXM4-80GB", pp=2, num_micro_batches=2,
                            seq_len=256, recompute=("attn.flash",))
    kept = lambda p: next(t.mem_alloc_bytes for t in p.tasks if t.name == "s0.F0")
    assert kept(prog) < kept(base)
    rec = next(t for t in prog.tasks if t.name == "s0.R0")
    fwd = next(t for t in prog.tasks if t.name == "s0.F0")
    assert 0 < rec.duration_s < fwd.duration_s
    assert r1.peak_memory_bytes < r0.peak_memory_bytes


def test_per_stage_tensor_parallel_degree() -> None:
    """stage_tp=(4, 1) on 8 GPUs (dp·tp = 4 per stage): stage 0 runs tp=4 (tensor-parallel
    collectives) on one replica of the dp=2 replicas' 2 x 2 samples, stage 1 pure data
    parallelism over 4 replicas of one sample each: each GPU of either stage does a quarter
    of the micro-batch's work, so their forwards differ only by how the degrees shape the
    GEMMs (0.97 here); when each replica ran 2 samples whatever its stage's dp, 0.48."""
    _, _, program, _result = _lower("gpt3-1.3b", "8xA100-SXM4-80GB", tp=2, dp=2, pp=2,
                                   stage_tp=(4, 1), micro_batch_size=2, num_micro_batches=2,
                                   seq_len=512)
    tp_stages = {t.stage for t in program.tasks if t.name.startswith("tp.")}
    assert tp_stages == {0}
    f0 = next(t for t in program.tasks if t.name == "s0.F0").duration_s
    f1 = next(t for t in program.tasks if t.name == "s1.F0").duration_s
    assert 0.8 < f0 / f1 < 1.25


@pytest.mark.parametrize(("recompute", "attention", "held"), [
    ("full", "flash", 8 * 14 * 1024 * 1024),  # 8 blocks x Korthikanti's GEMM inputs 14·sbh
    ("full", "eager", None), ("selective", "eager", None), ("selective", "flash", None)])
def test_a_split_backward_holds_what_its_weight_pass_reads(recompute: str, attention: str,
                                                           held: int | None) -> None:
    """Under ZB-H1 the backward is I now and W later. W (dW = Xᵀ·dY) reads every GEMM's input
    again, which full recompute rebuilt for I, so a micro-batch holds all its stage's
    recomputed GEMM inputs from the recompute until W: on the middle of 3 stages of
    gpt3-350m (8 blocks, h = 1024, s = 1024, b = 1) 14·s·b·h bytes a block with
    FlashAttention, where 1F1B's one-pass backward holds one block's recomputation at a time.
    With eager attention one block's recomputation (its s² score terms) outweighs that, and
    selective recompute rebuilds only the attention core, which has no weights: ZB-H1 holds
    what 1F1B holds. (A split backward held 1F1B's one block at a time before.)"""
    def alloc(schedule: str) -> float:
        model = dataclasses.replace(get_model("gpt3-350m"), attention=attention)
        hw = parse_cluster("3xA100-SXM4-80GB")
        plan = ParallelPlan.build(model, hw, pp=3, recompute=recompute, schedule=schedule,
                                  num_micro_batches=3, seq_len=1024)
        program = lower(model, hw, plan)
        return float(program.tasks.mem_alloc_bytes[program.task_names().index("s1.R0")])

    one_pass, split = alloc("1f1b"), alloc("zb-h1")
    assert one_pass > 0
    assert split == (held if held is not None else one_pass)
    if held is not None:
        assert held > one_pass


def test_a_schedule_mixing_whole_and_split_backwards_frees_every_micro_batch() -> None:
    """torch's DualPipeV runs some micro-batches' backwards whole (B) and splits others' (I,
    then W) on the same stage: each micro-batch's activations are freed at its own last
    backward pass, so the peak does not grow with the micro-batch count. (Memory was freed
    only at the stage's kind of last pass, so the B micro-batches were never freed: rank 0
    peaked at 4.2, 5.07 and 6.8 GB for 8, 16 and 32 micro-batches.)"""
    from trainsim import api

    model, hw = api.load_model("gpt3-350m"), api.load_cluster("4xA100-SXM4-80GB")
    peaks = [[r.peak_memory_bytes for r in api.simulate(model, hw, {
        "pp": 4, "virtual_stages": 2, "num_micro_batches": m, "seq_len": 1024,
        "schedule": "torch:ScheduleDualPipeV"}).ranks] for m in (8, 32)]
    assert peaks[0] == pytest.approx(peaks[1], rel=1e-12)


def test_stage_tp_with_explicit_micro_batches_checks_their_sizes() -> None:
    """With explicit micro-batches the split check reads their sizes, not the unused
    micro_batch_size (two 2-sample micro-batches on stage_tp (1, 2) were refused as
    "1-sample micro-batches")."""
    spec, hw = get_model("gpt3-350m"), parse_cluster("4xA100-SXM4-80GB")
    fields = {"dp": 1, "tp": 2, "pp": 2, "stage_tp": (1, 2)}
    plan = ParallelPlan.build(spec, hw, **fields, micro_batches=[
        {"batch_size": 2, "seq_len": 512}] * 2)
    assert [plan.replica_batch(s, 2) for s in range(2)] == [1, 2]
    with pytest.raises(PlanError, match=r"dp=1 replicas' 3-sample micro-batches evenly"):
        ParallelPlan.build(spec, hw, **fields, micro_batches=[
            {"batch_size": 3, "seq_len": 512}] * 2)


@pytest.mark.parametrize("stage_tp", [(2, 4), (4, 1), (1, 2), (4, 2)])
def test_stage_tp_runs_what_its_stage_gpus_form_runs(stage_tp: tuple[int, int]) -> None:
    """A grid plan with per-stage tp (each stage keeps dp·tp GPUs) is the plan of equal
    `stage_gpus` with the same degrees and a pipeline micro-batch of dp x micro_batch_size:
    every stage runs the same samples, split over its own replicas. (Each stage's replicas
    used to run micro_batch_size samples whatever their count, so stage_tp (2, 4) on
    dp 2 x tp 2 ran half the samples on stage 1: 535 against 433 samples/s.)"""
    from trainsim import api

    model, hw = api.load_model("gpt3-125m"), api.load_cluster("8xA100-SXM4-80GB")
    dp, tp = 4 // stage_tp[0], stage_tp[0]
    grid = api.simulate(model, hw, {"dp": dp, "tp": tp, "pp": 2, "stage_tp": stage_tp,
                                    "micro_batch_size": 4 // dp, "global_batch": 16,
                                    "seq_len": 128})
    gpus = api.simulate(model, hw, {"pp": 2, "stage_gpus": (4, 4), "stage_tp": stage_tp,
                                    "micro_batch_size": 4, "global_batch": 16,
                                    "seq_len": 128})
    assert grid.iteration_time_s == pytest.approx(gpus.iteration_time_s, rel=1e-12)
    assert sorted(r.peak_memory_bytes for r in grid.ranks) == \
        pytest.approx(sorted(r.peak_memory_bytes for r in gpus.ranks), rel=1e-12)


def test_tensor_parallel_collectives_are_on_the_critical_path_unless_overlapped() -> None:
    """A synchronous TP all-reduce sits between the GEMMs whose result it carries: the next
    compute on that GPU waits for it (compute stream). --tp-comm-overlap (AsyncTP) puts the
    collectives on their own stream, behind compute, and the step is never slower."""
    kw = {"tp": 4, "dp": 1, "pp": 2, "num_micro_batches": 4, "seq_len": 512}
    _, _, sync_prog, sync = _lower("gpt3-1.3b", "8xA100-SXM4-80GB", **kw)
    _, _, async_prog, overlapped = _lower("gpt3-1.3b", "8xA100-SXM4-80GB",
                                         tp_comm_overlap=True, **kw)
    assert {t.stream for t in sync_prog.tasks if t.name.startswith("tp.")} == {"tp"}
    assert any(t.kind == "wait" for t in sync_prog.tasks)
    assert not any(t.kind == "wait" for t in async_prog.tasks)
    assert overlapped.iteration_time_s < sync.iteration_time_s
    # synchronous: no compute task of a GPU runs while one of its TP collectives does
    tasks = sync.tasks
    for rank, rows in tasks.groupby("rank"):
        comm = rows[rows["name"].str.startswith("tp.")]
        work = rows[(rows["stream"] == "compute") & (rows["duration_s"] > 0)]
        for _, c in comm.iterrows():
            inside = work[(work["start_s"] < c["end_s"] - 1e-12) &
                          (work["end_s"] > c["start_s"] + 1e-12)]
            assert inside.empty, (rank, c["name"])


def test_instruction_frequency_slows_that_instruction() -> None:
    """A lower SM clock for instruction 1F0 shows on that task only, and it takes longer."""
    _, hw, _program, result = _lower("gpt3-1.3b", "4xV100-SXM2-32GB", pp=4, num_micro_batches=2,
                                    seq_len=512, instruction_freq_mhz={"1F0": 800.0})
    f0 = _rows(result, name="s1.F0").iloc[0]
    f1 = _rows(result, name="s1.F1").iloc[0]
    assert f0.freq_mhz == 800.0 and f1.freq_mhz == hw.gpu(0).sm_clock_max_mhz
    assert f0.duration_s > f1.duration_s


@pytest.mark.parametrize("plan", [
    {"dp": 2, "tp": 2, "pp": 2, "num_micro_batches": 4},
    {"tp": 2, "pp": 4, "num_micro_batches": 4, "sp": True, "recompute": "selective"},
    {"dp": 4, "pp": 2, "num_micro_batches": 4, "zero": 2},
    {"dp": 2, "pp": 4, "num_micro_batches": 4, "schedule": "zb-h1"},
])
def test_folded_equals_unfolded_on_one_node(plan) -> None:
    """Folding identical tp members and dp replicas changes the task count, not the timeline."""
    times = []
    for fold in (True, False):
        *_, result = _lower("gpt3-350m", "8xA100-SXM4-80GB", LoweringOptions(fold=fold),
                            seq_len=256, **plan)
        times.append(result.iteration_time_s)
    assert times[0] == pytest.approx(times[1], rel=1e-9)


# ----------------------------------------------------------------------------- invalid plans
INVALID = [
    ("bert-base", "8xA100-SXM4-80GB", {"tp": 8}, r"plan.tp=8 does not divide model.num_heads=12"),
    ("gpt3-125m", "2x8xA100-SXM4-80GB", {"pp": 16}, r"exceeds the model's 12 layers"),
    ("gpt3-1.3b", "4xV100-SXM2-32GB", {"dp": 2, "pp": 1},
     r"dp×tp×pp = 2×1×1 = 2 but the cluster has 4 GPUs"),
    ("gpt3-1.3b", "1x8xA100-SXM4-40GB+2x4xA10", {"dp": 4, "pp": 4, "placement": (0, 1, 1, 1)},
     r"puts 12 GPUs on node group 1 which has 8"),
    ("gpt3-1.3b", "1x8xA100-SXM4-40GB+2x4xA10", {"dp": 4, "pp": 4, "placement": (0, 0, 1, 2)},
     r"placement\[3\]=2: the cluster has node groups 0..1"),
    ("gpt3-1.3b", "4xV100-SXM2-32GB", {"dp": 4, "micro_batch_size": 2, "global_batch": 500},
     r"global_batch=500 is not divisible by micro_batch_size×dp=2×4=8"),
    ("gpt3-1.3b", "4xV100-SXM2-32GB", {"pp": 4, "micro_batch_size": 0},
     r"plan.micro_batch_size=0 must be a positive integer"),
    ("gpt3-1.3b", "4xV100-SXM2-32GB", {"pp": 4, "stage_layers": (6, 6, 6, 5)},
     r"sum to 23 but the model has 24 layers"),
    ("gpt3-1.3b", "4xV100-SXM2-32GB", {"pp": 4, "freq_mhz": 2500.0},
     r"2500 MHz is outside V100-SXM2-32GB's SM clock range"),
    ("gpt3-1.3b", "8xA100-SXM4-80GB", {"tp": 8, "sp": True, "seq_len": 4096},
     r"seq_len=4096 exceeds model.max_seq_len=2048"),
    ("gpt3-1.3b", "8xA100-SXM4-80GB", {"dp": 2, "tp": 2, "pp": 2, "stage_tp": (3, 2)},
     r"stage_tp\[0\]=3 must divide the stage's dp×tp=4 GPUs"),
    ("gpt3-1.3b", "8xA100-SXM4-80GB", {"dp": 2, "tp": 2, "pp": 2, "stage_tp": (4, 1)},
     (r"stage_tp\[1\]=1: stage 1 runs dp=4 replicas, which must split the dp=2 replicas' "
      r"1-sample micro-batches evenly")),
    ("gpt-moe-1.3b-8e", "8xA100-SXM4-80GB", {"dp": 8, "ep": 3}, r"plan.ep=3 does not divide"),
    ("gpt3-1.3b", "8xA100-SXM4-80GB", {"dp": 8, "ep": 2}, r"has no experts"),
    ("gpt3-1.3b", "4xV100-SXM2-32GB", {"pp": 4, "schedule": "interleaved", "virtual_stages": 2,
                                           "num_micro_batches": 6},
     r"needs the micro-batch count \(6\) divisible by pp=4"),
]


@pytest.mark.parametrize(("model", "cluster", "plan", "message"), INVALID)
def test_invalid_plans_on_real_models_and_clusters(model, cluster, plan, message) -> None:
    """Each impossible plan fails at construction with a message naming field and value."""
    with pytest.raises(PlanError, match=message):
        ParallelPlan.build(get_model(model), parse_cluster(cluster), **plan)


def _op_tp_lowered(fold: bool):
    """gpt3-125m on one 4-GPU node, tp=4, with the MLP GEMMs at degree 2 (Aceso per-op tp)."""
    opts = LoweringOptions(fold=fold, dp_bucket_bytes=ONE_BUCKET, collective_algorithm="ring")
    return _lower("gpt3-125m", "4xA100-SXM4-80GB", opts, tp=4, micro_batch_size=2,
                  num_micro_batches=2, seq_len=128, op_tp={"mlp.fc1": 2, "mlp.fc2": 2})


def test_per_op_tp_collectives_run_over_their_own_groups() -> None:
    """With the MLP GEMMs at degree 2 on a tp=4 stage, unfolded, tensor-parallel collectives
    run over the stage's 4 GPUs and over its groups of 2 consecutive GPUs (0,1) and (2,3):
    each collective spans exactly the group its op's degree says (CommNeed.group_size)."""
    *_, program, _result = _op_tp_lowered(fold=False)
    groups = {t.ranks for t in program.tasks if t.name.startswith("tp.")}
    assert groups == {(0, 1, 2, 3), (0, 1), (2, 3)}


def test_per_op_tp_gradients_reduce_over_each_degrees_replicas() -> None:
    """Ops at degree 2 of 4 GPUs have 2 replicas, ranks[k::2] = (0, 2) and (1, 3): their
    gradients (2 bytes per parameter per GPU, `params_by_tp`) are all-reduced there, a ring of
    2 moving 2(n-1)/n·S = S bytes; ops at the stage's degree 4 have one replica, no sync."""
    spec, hw, program, _result = _op_tp_lowered(fold=False)
    dp = [t for t in program.tasks if t.stream == "dp"]
    assert {t.ranks for t in dp} == {(0, 2), (1, 3)}
    plan = ParallelPlan.build(spec, hw, tp=4, micro_batch_size=2, num_micro_batches=2,
                              seq_len=128, op_tp={"mlp.fc1": 2, "mlp.fc2": 2})
    by_tp = dict(stage_layout(spec, hw, plan).costs[(0, None)].params_by_tp)
    assert by_tp[2] > 0
    assert {t.comm_bytes for t in dp} == {2.0 * by_tp[2]}


def test_per_op_tp_folded_equals_unfolded_on_one_node() -> None:
    """Folding a per-op-tp stage (one program rank, each collective's copies = all groups of
    its size) gives the unfolded iteration time on one symmetric node."""
    times = [_op_tp_lowered(fold)[-1].iteration_time_s for fold in (True, False)]
    assert times[0] == pytest.approx(times[1], rel=1e-9)


def test_op_tp_at_the_stage_degree_lowers_as_without_it() -> None:
    """Naming ops at the stage's own degree changes nothing: the same tasks, the same time."""
    *_, plain, r0 = _lower("gpt3-125m", "4xA100-SXM4-80GB", tp=4, num_micro_batches=2,
                           seq_len=128)
    *_, named, r1 = _lower("gpt3-125m", "4xA100-SXM4-80GB", tp=4, num_micro_batches=2,
                           seq_len=128, op_tp={"mlp.fc1": 4})
    assert named.num_tasks == plain.num_tasks
    assert r1.iteration_time_s == r0.iteration_time_s


@pytest.mark.parametrize("fields", [
    {"pp": 4, "global_batch": 16},
    {"dp": 2, "tp": 2, "global_batch": 16, "zero": 3, "recompute": "selective", "sp": True},
    {"pp": 2, "tp": 2, "global_batch": 16, "schedule": "interleaved", "virtual_stages": 2},
])
def test_lowered_programs_pass_full_validation(fields: dict) -> None:
    """Lowering builds tasks without per-field checks (for speed); the whole program must still
    pass `Program.validate()` (ids, deps, ranks, links, no dependency cycle)."""
    model, cluster = get_model("gpt3-125m"), parse_cluster("4xA100-SXM4-80GB")
    plan = ParallelPlan.build(model, cluster, **fields)
    for fold in (True, False):
        lower(model, cluster, plan, LoweringOptions(fold=fold)).validate()


def test_zero_stages_never_raise_peak_memory() -> None:
    """Each ZeRO stage shards more (optimizer states, then gradients, then weights), so peak
    memory per GPU never grows from ZeRO-0 to ZeRO-3 — ZeRO-3's gathered weights are held a
    layer or two at a time, not the whole stage."""
    model, cluster = get_model("gpt3-1.3b"), parse_cluster("4xV100-SXM2-32GB")
    peaks = []
    for zero in range(4):
        plan = ParallelPlan.build(model, cluster, dp=4, global_batch=16, zero=zero)
        peaks.append(run_simpy(lower(model, cluster, plan)).peak_memory_bytes)
    assert peaks == sorted(peaks, reverse=True)
    assert peaks[3] < peaks[2] < peaks[1] < peaks[0]


@pytest.mark.parametrize(("model", "cluster", "fields"), [
    ("gpt3-125m", "1x8xA100-SXM4-40GB", {"dp": 4, "tp": 2, "global_batch": 4, "seq_len": 128}),
    ("gpt3-350m", "1x8xA100-SXM4-80GB", {"dp": 8, "global_batch": 32, "seq_len": 256}),
])
def test_zero3_holds_one_passs_gathered_weights_at_a_time(model: str, cluster: str,
                                                         fields: dict) -> None:
    """Above its static shards, a ZeRO-3 rank holds the activations (as without ZeRO) and one
    pass's gathered weights (`zero3_bytes`), not two: the next pass's first gather is
    prefetched while this pass computes, and the bug hunt found both passes' buffers held
    through every pass (gpt3-125m dp 4 tp 2: ZeRO-3 418.3 MB above ZeRO-2's 388.1 MB)."""
    spec, hw = get_model(model), parse_cluster(cluster)
    runs = {}
    for zero in (0, 2, 3):
        plan = ParallelPlan.build(spec, hw, zero=zero, micro_batch_size=1, **fields)
        program = lower(spec, hw, plan)
        runs[zero] = (program, run_simpy(program).peak_memory_bytes)
    (p0, peak0), (_, peak2), (p3, peak3) = runs[0], runs[2], runs[3]
    layout = LoweringLayout(spec, hw, ParallelPlan.build(spec, hw, zero=3, micro_batch_size=1,
                                                         **fields), LoweringOptions())
    weight_bytes = 2.0
    buffer = min(layout.local_params(0), 2 * layout.largest_layer_params(0)) * weight_bytes \
        * (layout.plan.dp - 1) / layout.plan.dp
    activations = peak0 - p0.static_memory_bytes[0]
    assert peak3 <= p3.static_memory_bytes[0] + activations + buffer + 1.0
    assert peak3 < peak2


def test_stage_clocks_on_a_mixed_cluster_are_checked_against_their_stages_gpus() -> None:
    """Stages 2-3 land on the A10s (node groups fill fastest first), so their A10 clock is
    accepted; the same clock on an A100 stage, or a plan-wide clock one GPU type cannot run,
    is refused naming the field and the GPU."""
    spec, hw = get_model("gpt3-1.3b"), parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")
    fields = {"dp": 2, "pp": 4, "micro_batch_size": 1, "global_batch": 16}
    a10_max = float(hw.gpu(hw.num_gpus - 1).sm_clock_max_mhz)
    ok = ParallelPlan.build(spec, hw, **fields, stage_freq_mhz=(1410.0, 1410.0, a10_max, a10_max))
    prog = lower(spec, hw, ok)
    assert prog.info.plan["stage_freq_mhz"] == [1410.0, 1410.0, a10_max, a10_max]
    bad = ParallelPlan.build(spec, hw, **fields, stage_freq_mhz=(a10_max, 1410.0, 1410.0, 1410.0))
    with pytest.raises(PlanError, match=r"plan.stage_freq_mhz\[0\]=1695 MHz is outside "
                                        r"A100-SXM4-40GB's SM clock range .*stage 0 runs on"):
        lower(spec, hw, bad)
    with pytest.raises(PlanError, match=r"1695 MHz is outside A100-SXM4-40GB's SM clock range"):
        ParallelPlan.build(spec, hw, **fields, freq_mhz=a10_max)
    with pytest.raises(PlanError, match=r"plan.stage_freq_mhz\[3\]: .*outside .*SM clock range"):
        ParallelPlan.build(spec, hw, **fields, stage_freq_mhz=(1410.0, 1410.0, 1410.0, 3000.0))
    by_action = ParallelPlan.build(spec, hw, **fields, instruction_freq_mhz={"0F1": a10_max})
    with pytest.raises(PlanError, match=r"instruction_freq_mhz\['0F1'\]=1695 MHz"):
        lower(spec, hw, by_action)
