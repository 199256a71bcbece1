"""ParallelPlan: construction checks, derived values and JSON round trip."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from trainsim.errors import PlanError, TrainsimError
from trainsim.workloads.plan import MicroBatch, ParallelPlan, uniform_split


def _gpu(name: str = "V100-SXM2-32GB", lo: float = 135.0, hi: float = 1530.0) -> SimpleNamespace:
    return SimpleNamespace(name=name, sm_clock_min_mhz=lo, sm_clock_max_mhz=hi)


def _cluster(n: int, groups: tuple[int, ...] | None = None) -> SimpleNamespace:
    groups = groups or (n,)
    return SimpleNamespace(num_gpus=n, node_groups=[SimpleNamespace(num_gpus=g) for g in groups],
                           gpu=lambda rank: _gpu())


MODEL = SimpleNamespace(name="gpt3-1.3b", num_layers=24, num_heads=32, num_kv_heads=32,
                        ffn_hidden=8192, num_experts=0, max_seq_len=2048,
                        op_names=lambda: ["attn.qkv", "mlp.fc1"])


def test_global_batch_sets_micro_batch_count() -> None:
    """global_batch / (micro_batch_size·dp) micro-batches per replica."""
    plan = ParallelPlan(dp=2, pp=2, micro_batch_size=4, global_batch=512)
    assert plan.num_micro_batches == 64
    assert plan.gpus == 4


def test_global_batch_must_divide() -> None:
    """A global batch not divisible by micro_batch_size·dp names both numbers."""
    with pytest.raises(PlanError, match=r"global_batch=500 is not divisible by micro_batch_size×dp=4×2"):
        ParallelPlan(dp=2, micro_batch_size=4, global_batch=500)


def test_global_batch_smaller_than_one_step() -> None:
    """A global batch below micro_batch_size·dp says so and suggests multiples of it (1000
    nodes × 8 GPUs at dp=8000 cannot split 512 samples), never an empty "e.g."."""
    with pytest.raises(PlanError) as err:
        ParallelPlan(dp=8000, global_batch=512)
    text = str(err.value)
    assert "global_batch=512 is smaller than micro_batch_size×dp=8000" in text
    assert "use global_batch ≥ 8000, e.g. 8000, 16000, or fewer data-parallel replicas" in text
    assert "e.g.  " not in text and "e.g. )" not in text
    with pytest.raises(PlanError, match=r"or a smaller micro_batch_size"):
        ParallelPlan(micro_batch_size=4, global_batch=2)


def test_global_batch_suggestions_are_multiples() -> None:
    """Every suggested global batch is a multiple of micro_batch_size·dp within two steps."""
    with pytest.raises(PlanError, match=r"\(e.g. 488, 496, 504 would be\)"):
        ParallelPlan(dp=8, global_batch=500)
    with pytest.raises(PlanError, match=r"\(e.g. 8, 16, 24 would be\)"):
        ParallelPlan(dp=8, global_batch=9)


def test_degrees_must_match_gpu_count() -> None:
    """dp·tp·pp ≠ GPUs fails and suggests valid degrees."""
    with pytest.raises(PlanError, match=r"1×1×2 = 2 but the cluster has 4 GPUs \(valid e.g.:"):
        ParallelPlan.build(MODEL, _cluster(4), pp=2)


def test_tp_must_divide_heads() -> None:
    """tp not dividing the head count is rejected with the valid degrees."""
    model = SimpleNamespace(**{**MODEL.__dict__, "num_heads": 12, "num_kv_heads": 12,
                               "ffn_hidden": 3072})
    with pytest.raises(PlanError, match=r"plan.tp=8 does not divide model.num_heads=12"):
        ParallelPlan.build(model, _cluster(8), tp=8)


def test_pp_beyond_layers() -> None:
    """More pipeline stages than layers is impossible."""
    with pytest.raises(PlanError, match=r"exceeds the model.s 24 layers"):
        ParallelPlan.build(MODEL, _cluster(32), pp=32)


def test_stage_layers_must_sum_to_layers() -> None:
    """A non-uniform partition must cover every layer exactly once."""
    with pytest.raises(PlanError, match=r"sum to 23 but the model has 24 layers"):
        ParallelPlan.build(MODEL, _cluster(4), pp=4, stage_layers=(5, 6, 6, 6))
    plan = ParallelPlan.build(MODEL, _cluster(4), pp=4, stage_layers=(5, 7, 7, 5))
    assert plan.layers_per_stage(24) == (5, 7, 7, 5)


def test_uniform_split_spreads_remainder() -> None:
    """A uniform split differs by at most one layer and keeps the total."""
    assert uniform_split(10, 4) == (3, 3, 2, 2)
    assert sum(uniform_split(97, 8)) == 97


def test_placement_onto_missing_gpus() -> None:
    """Placing more stages on a node group than it has GPUs fails naming the group."""
    with pytest.raises(PlanError, match=r"node group 1 which has 2"):
        ParallelPlan.build(MODEL, _cluster(8, (6, 2)), tp=2, pp=4, placement=(0, 1, 1, 0))
    with pytest.raises(PlanError, match=r"placement\[0\]=5"):
        ParallelPlan.build(MODEL, _cluster(8, (6, 2)), tp=2, pp=4, placement=(5, 1, 0, 0))


def test_frequency_outside_clock_range() -> None:
    """A frequency the GPU cannot run at names the GPU's range."""
    with pytest.raises(PlanError, match=r"outside V100-SXM2-32GB's SM clock range 135–1530 MHz"):
        ParallelPlan.build(MODEL, _cluster(4), pp=4, freq_mhz=2000)


def test_unknown_schedule_and_recompute() -> None:
    """Unknown schedule names list the valid ones; bad recompute policies are named."""
    with pytest.raises(TrainsimError, match=r"unknown schedule 'onefoneb'.*valid:"):
        ParallelPlan(schedule="onefoneb")
    with pytest.raises(PlanError, match=r"plan.recompute='some'"):
        ParallelPlan(recompute="some")
    with pytest.raises(PlanError, match=r"plan.zero=4"):
        ParallelPlan(zero=4)


def test_virtual_stages_need_interleaved() -> None:
    """Virtual stages only make sense with an interleaved (or explicit/torch) schedule."""
    with pytest.raises(PlanError, match=r"virtual_stages=2 needs schedule 'interleaved'"):
        ParallelPlan(pp=2, virtual_stages=2, schedule="1f1b")
    with pytest.raises(PlanError, match=r"divisible by pp=4"):
        ParallelPlan.build(MODEL, _cluster(4), pp=4, virtual_stages=2, schedule="interleaved",
                           num_micro_batches=6)


def test_interleaved_needs_two_virtual_stages() -> None:
    """schedule='interleaved' with one chunk per rank would silently be plain 1F1B: refused,
    suggesting virtual_stages >= 2."""
    with pytest.raises(PlanError, match=r"plan.schedule='interleaved' with "
                                        r"plan.virtual_stages=1 .* virtual_stages >= 2"):
        ParallelPlan(pp=2, schedule="interleaved")
    assert ParallelPlan(pp=2, schedule="interleaved", virtual_stages=2).num_stages == 4


def test_seq_len_refused_for_image_models() -> None:
    """A Wide-ResNet trains on images: a sequence length (--seq-len) is an error, not ignored."""
    wresnet = SimpleNamespace(name="wresnet-500m", family="wresnet", num_layers=16,
                              num_heads=0, num_kv_heads=0, ffn_hidden=0, num_experts=0,
                              max_seq_len=0, op_names=list)
    with pytest.raises(PlanError, match=r"plan.seq_len=128: model 'wresnet-500m' is a "
                                        r"Wide-ResNet"):
        ParallelPlan.build(wresnet, _cluster(1), seq_len=128)
    assert ParallelPlan.build(wresnet, _cluster(1)).seq_len is None


def test_sequence_parallel_needs_tp() -> None:
    """Sequence parallelism without tensor parallelism is rejected."""
    with pytest.raises(PlanError, match=r"plan.sp=true needs plan.tp > 1"):
        ParallelPlan.build(MODEL, _cluster(4), pp=4, sp=True)


def test_per_op_recompute_names_are_checked() -> None:
    """A per-op recompute list may only name ops the model has."""
    plan = ParallelPlan.build(MODEL, _cluster(1), recompute=["attn.qkv"])
    assert plan.recompute == ("attn.qkv",)
    with pytest.raises(TrainsimError, match=r"unknown op in plan.recompute 'attn.qkvv'"):
        ParallelPlan.build(MODEL, _cluster(1), recompute=["attn.qkvv"])


def test_explicit_micro_batches() -> None:
    """Explicit variable-length micro-batches keep their own shapes and set the global batch."""
    plan = ParallelPlan(dp=2, micro_batches=[{"batch_size": 4, "seq_len": 512},
                                             {"batch_size": 2, "seq_len": 2048}])
    assert plan.global_batch == 12
    assert plan.micro_batch_list(2048)[1] == MicroBatch(batch_size=2, seq_len=2048)
    with pytest.raises(PlanError, match=r"seq_len=0"):
        ParallelPlan(micro_batches=[{"batch_size": 1, "seq_len": 0}])


def test_frequency_precedence() -> None:
    """Per-instruction frequency beats per-stage, which beats the global one."""
    plan = ParallelPlan(pp=2, freq_mhz=1200, stage_freq_mhz=(1000, 1100),
                        instruction_freq_mhz={"1F3": 900})
    assert plan.frequency_of(1, "1F3") == 900
    assert plan.frequency_of(1, "1F2") == 1100
    assert ParallelPlan(freq_mhz=1200).frequency_of(0, "0B0") == 1200


def test_json_round_trip(tmp_path) -> None:
    """A plan survives to_json/from_json unchanged, and save never overwrites silently."""
    plan = ParallelPlan(dp=2, tp=2, pp=2, sp=True, micro_batch_size=2, global_batch=64,
                        stage_layers=(10, 14), recompute=("attn.qkv",), zero=1,
                        instruction_freq_mhz={"0F0": 1100.0}, op_tp={"mlp.fc1": 2})
    again = ParallelPlan.from_json(plan.to_json())
    assert again == plan
    assert json.loads(plan.to_json()) == json.loads(again.to_json())
    path = tmp_path / "plan.json"
    plan.save(path)
    assert ParallelPlan.load(path) == plan
    with pytest.raises(PlanError, match=r"exists; pass force=True"):
        plan.save(path)


def test_unknown_json_field() -> None:
    """An unknown field in plan JSON is named, with the closest valid field."""
    with pytest.raises(TrainsimError, match=r"unknown plan field 'tensor_parallel'"):
        ParallelPlan.from_json('{"tensor_parallel": 2}')
    with pytest.raises(PlanError, match=r"my.json: not valid JSON"):
        ParallelPlan.from_json("{", source="my.json")
