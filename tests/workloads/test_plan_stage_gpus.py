"""Per-stage GPU counts (Aceso-style plans): stages of different sizes with their own tp and dp,
the pipeline micro-batch split over each stage's replicas, and per-stage recompute."""

from __future__ import annotations

import pytest

from trainsim.errors import PlanError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.oracle import Oracle
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

MODEL, CLUSTER = get_model("gpt3-125m"), parse_cluster("4xV100-SXM2-32GB")


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle(MODEL, CLUSTER)


def test_equal_stage_gpus_equal_the_uniform_plan(oracle: Oracle) -> None:
    """stage_gpus=(2, 2) with tp=1 and a pipeline micro-batch of 2 is dp=2, micro-batch 1:
    the same iteration time, memory and busy times."""
    a = oracle.evaluate({"pp": 2, "stage_gpus": (2, 2), "micro_batch_size": 2,
                         "global_batch": 16, "seq_len": 256})
    b = oracle.evaluate({"pp": 2, "dp": 2, "micro_batch_size": 1, "global_batch": 16,
                         "seq_len": 256})
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s)
    assert a.peak_memory_bytes_per_rank == pytest.approx(b.peak_memory_bytes_per_rank)


def test_uneven_stages_split_the_micro_batch(oracle: Oracle) -> None:
    """A 1-GPU stage runs the whole micro-batch of 2, a 2-GPU dp stage half of it: per
    layer the 1-GPU stage is busier, and the plan occupies 1 + 2 + 1 = 4 GPUs."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, pp=3, stage_gpus=(1, 2, 1),
                              stage_layers=(4, 4, 4), micro_batch_size=2, global_batch=16,
                              seq_len=256)
    assert plan.gpus == 4 and plan.dp_of_stage(1) == 2 and plan.replica_batch(1, 2) == 1
    s = oracle.evaluate(plan)
    assert s.stage_busy_s[0] > s.stage_busy_s[1]


def test_stage_recompute_applies_per_stage(oracle: Oracle) -> None:
    """Full recompute on stage 0 only lowers stage 0's peak memory and adds work there."""
    base = {"pp": 2, "dp": 2, "micro_batch_size": 1, "global_batch": 16, "seq_len": 256}
    a = oracle.evaluate(base)
    b = oracle.evaluate(base | {"stage_recompute": ("full", "none")})
    assert b.peak_memory_bytes_per_rank[0] < a.peak_memory_bytes_per_rank[0]
    assert b.peak_memory_bytes_per_rank[1] == pytest.approx(a.peak_memory_bytes_per_rank[1])
    assert b.stage_busy_s[0] > a.stage_busy_s[0]


@pytest.mark.parametrize(("fields", "message"), [
    ({"pp": 2, "stage_gpus": (1, 2), "micro_batch_size": 2}, r"sum to 3 but the cluster has 4"),
    ({"pp": 2, "stage_gpus": (2, 2), "dp": 2}, r"plan.dp=2 must be 1"),
    ({"pp": 2, "stage_gpus": (2, 2), "micro_batch_size": 1}, r"divisible by stage 0's dp=2"),
    ({"pp": 2, "stage_gpus": (2, 2), "stage_tp": (4, 1), "micro_batch_size": 2},
     r"stage_tp\[0\]=4 must divide plan.stage_gpus\[0\]=2"),
    ({"pp": 2, "dp": 2, "stage_recompute": ("full",)}, r"stage_recompute has 1 values but pp=2"),
])
def test_bad_stage_fields_are_refused(oracle: Oracle, fields: dict, message: str) -> None:
    """Impossible per-stage fields fail at construction, naming the field and value."""
    with pytest.raises(PlanError, match=message):
        ParallelPlan.build(oracle.model, oracle.cluster, **({"global_batch": 16} | fields))


def test_stage_fields_round_trip_through_json() -> None:
    """stage_gpus and stage_recompute (with an op-name tuple) survive to_json/from_json."""
    plan = ParallelPlan(pp=2, stage_gpus=(1, 2), micro_batch_size=2, global_batch=8,
                        stage_recompute=("full", ("attn.score", "attn.softmax")))
    again = ParallelPlan.from_json(plan.to_json())
    assert again == plan


def test_sequence_parallelism_on_per_stage_degrees_needs_one_degree() -> None:
    """Aceso-style stage degrees take `sp` where every stage has the same tp > 1 (the stages
    split their sequence: less memory; folded equals unfolded). Different degrees are
    refused in one line: a boundary between sequence-split groups of different sizes would
    need a resharding the stage-boundary transfer does not size."""
    from trainsim import api
    from trainsim.errors import PlanError

    m, hw = api.load_model("gpt3-350m"), api.load_cluster("8xA100-SXM4-40GB")
    fields = {"pp": 2, "dp": 1, "tp": 1, "stage_gpus": [4, 4], "stage_tp": [2, 2],
              "stage_layers": [12, 12], "micro_batch_size": 8, "global_batch": 32}
    peaks = {}
    for sp in (False, True):
        plan = api.make_plan(m, hw, {**fields, "sp": sp})
        folded, unfolded = api.simulate(m, hw, plan), api.simulate(m, hw, plan, unfold=True)
        assert folded.iteration_time_s == unfolded.iteration_time_s
        peaks[sp] = [r.peak_memory_bytes for r in folded.ranks]
    assert all(a < b for a, b in zip(peaks[True], peaks[False]))
    with pytest.raises(PlanError, match=r"one tensor-parallel degree on every stage"):
        api.make_plan(m, hw, {**fields, "stage_tp": [2, 1], "sp": True})


def _boundary_bytes(program: object, prefix: str) -> float:
    """Bytes of the stage-boundary transfers whose names start with `prefix`."""
    table = program.table()  # type: ignore[attr-defined]
    names = program.task_names()  # type: ignore[attr-defined]
    p2p = table.kind_names.index("p2p")
    return sum(float(table.comm_bytes[i]) for i, n in enumerate(names)
               if int(table.kind_code[i]) == p2p and n.startswith(prefix))


@pytest.mark.parametrize(("stage_gpus", "stage_tp"), [
    ((4, 4), (1, 4)), ((4, 4), (4, 1)), ((2, 6), (1, 1)), ((2, 6), (2, 1)), ((4, 4), (2, 2))])
@pytest.mark.parametrize("fold", [True, False])
def test_backward_sends_the_gradient_the_forward_sent(stage_gpus: tuple[int, int],
                                                      stage_tp: tuple[int, int],
                                                      fold: bool) -> None:
    """A boundary's gradient is the size of its activation, so the backward transfer moves
    the forward's bytes, however the two stages split the micro-batch. (It used to be sized
    by the receiving stage's GPUs: stage_tp (1, 4) sent a quarter of the gradient back,
    (4, 1) four times too much.)"""
    from trainsim.workloads.lowering.lower import lower
    from trainsim.workloads.lowering.options import LoweringOptions

    model, cluster = get_model("gpt3-125m"), parse_cluster("8xV100-SXM2-32GB")
    plan = ParallelPlan.build(model, cluster, pp=2, stage_gpus=stage_gpus, stage_tp=stage_tp,
                              micro_batch_size=12, global_batch=24, seq_len=256)
    program = lower(model, cluster, plan, LoweringOptions(fold=fold))
    forward, backward = _boundary_bytes(program, "s0>1.F"), _boundary_bytes(program, "s1>0.B")
    assert forward > 0
    assert backward == pytest.approx(forward)


def test_t5_equal_stage_gpus_equal_the_uniform_plan() -> None:
    """T5's stage boundaries also carry the encoder's output to the decoder stages; with
    `stage_gpus` it is one replica's share of the micro-batch, as the activations are (it was
    sized for the whole pipeline micro-batch: 9.44 against 2.10 MB a forward send on
    2 x 8 A100, +0.22 % on the iteration)."""
    from trainsim import api

    model, hw = api.load_model("t5-770m"), api.load_cluster("4xV100-SXM2-32GB")
    base = {"pp": 2, "seq_len": 512, "global_batch": 16}
    uniform = api.simulate(model, hw, {**base, "dp": 2, "micro_batch_size": 1})
    split = api.simulate(model, hw, {**base, "stage_gpus": (2, 2), "micro_batch_size": 2})
    assert split.iteration_time_s == pytest.approx(uniform.iteration_time_s, rel=1e-12)


_FAN = "2x8xA100-SXM4-80GB"


def _fan_out(stage_gpus: tuple[int, ...], unfold: bool,
             stage_tp: tuple[int, ...] | None = None):
    import math

    from trainsim import api

    tps = stage_tp or (1,) * len(stage_gpus)
    mbs = math.lcm(*(g // t for g, t in zip(stage_gpus, tps, strict=True)))
    return api.simulate("gpt3-1.3b", _FAN, pp=len(stage_gpus), dp=1, tp=1,
                        micro_batch_size=mbs, global_batch=8 * mbs, stage_gpus=stage_gpus,
                        stage_tp=stage_tp, unfold=unfold)


@pytest.mark.parametrize(("stage_gpus", "stage_tp"), [
    ((4, 12), None), ((6, 10), None), ((3, 13), None), ((12, 4), None), ((4, 8, 4), None),
    ((4, 12), (2, 2)), ((6, 10), (2, 2))])
def test_stages_of_different_sizes_fold_exactly(stage_gpus: tuple[int, ...],
                                                stage_tp: tuple[int, ...] | None) -> None:
    """A GPU of the smaller stage sends its share of a micro-batch to several GPUs of the
    larger one (and receives their gradients) all at once, NCCL-batched, sharing its links;
    some pairs cross NVLink, some a PCIe path to the other node's NIC. Folded, the
    boundary's transfer is the slowest pair of the slowest chain, on its links shared with
    the others, and the tied embedding's all-reduce rounds follow the slowest chain too, so
    folding changes nothing. gpt3-1.3b on 2 x 8 A100, (4, 12): folded 1.14858 s against
    unfolded 1.16738 s before (folded sent over the first pair's NVLink only, and timed the
    tied all-reduce rounds on it too; unfolded ran a GPU's sends one after another); with
    stage_tp (2, 2), 0.68004 against 0.69054 s."""
    folded = _fan_out(stage_gpus, False, stage_tp)
    unfolded = _fan_out(stage_gpus, True, stage_tp)
    assert folded.iteration_time_s == pytest.approx(unfolded.iteration_time_s, rel=1e-9)


def test_a_gpus_sends_to_several_run_at_once() -> None:
    """Unfolded, GPU 2 of stage (4, 12)'s first stage sends micro-batch 0's activations to
    GPUs 10, 11 and 12 at once (one stream each, so the three share its PCIe link to the
    NIC); folded, the send lasts as long as the slowest of all the pairs."""
    unfolded = _fan_out((4, 12), unfold=True).tasks
    sends = unfolded[(unfolded["name"] == "s0>1.F0") & (unfolded["rank"] == 2)]
    assert len(sends) == 3
    assert sends["start_s"].nunique() == 1
    assert sends["stream"].nunique() == 3
    every = unfolded[unfolded["name"] == "s0>1.F0"]
    folded = _fan_out((4, 12), unfold=False).tasks
    send = folded[folded["name"] == "s0>1.F0"]
    assert send["duration_s"].iloc[0] == pytest.approx(every["duration_s"].max(), rel=1e-12)
    assert every["duration_s"].min() < every["duration_s"].max() / 5  # NVLink pairs too
