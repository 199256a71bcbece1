"""Exports: the best plan as trainsim JSON, Aceso's config JSON (round trip), Megatron-LM flags
for uniform plans only."""

from __future__ import annotations

import pytest

from trainsim.errors import SpecError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.exports import (
    from_aceso_config,
    megatron_flags_file,
    to_aceso_config,
    to_megatron_flags,
)
from trainsim.search.oracle import Oracle
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle(get_model("aceso-gpt-1.3b"), parse_cluster("4xV100-PCIe-32GB"))


def test_aceso_config_round_trips(oracle: Oracle) -> None:
    """A non-uniform plan → Aceso config → plan fields gives back the same ParallelPlan; the
    config counts 1 + 13·layers ops on stage 0 and 13·layers + 2 on the last (GPT)."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, pp=3, stage_gpus=(1, 1, 2),
                              stage_tp=(1, 1, 2), stage_layers=(7, 9, 8), micro_batch_size=2,
                              global_batch=64, stage_recompute=("full", "selective", "none"))
    config = to_aceso_config(plan, oracle.model, oracle.cluster)
    assert config["num_ops_in_each_stage"] == [1 + 13 * 7, 13 * 9, 13 * 8 + 2]
    assert config["num_gpus"] == [1, 1, 2]
    assert config["model_parallel_size_of_each_op"][2][0] == 2
    # Aceso's resharding_stages marks stages whose ops differ in tp/dp: none here
    assert config["resharding_stages"] == [False, False, False]
    back = ParallelPlan.build(oracle.model, oracle.cluster, **from_aceso_config(config,
                                                                                oracle.model))
    assert back == plan


def test_uniform_plan_round_trips_in_aceso_form(oracle: Oracle) -> None:
    """A Megatron plan (dp=2, pp=2, mbs 1) exports with micro_batch_size 2 (Aceso's pipeline
    micro-batch) and imports as stage_gpus=(2, 2) — the same iteration on the Oracle."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, dp=2, pp=2, micro_batch_size=1,
                              global_batch=8, recompute="full")
    config = to_aceso_config(plan, oracle.model)
    assert config["micro_batch_size"] == 2
    fields = from_aceso_config(config, oracle.model)
    assert fields["stage_gpus"] == [2, 2] and fields["stage_recompute"] == ["full", "full"]
    a, b = oracle.evaluate(plan), oracle.evaluate(fields)
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s)


def test_megatron_flags_for_uniform_plans_only(oracle: Oracle) -> None:
    """tp=2 pp=2 full recompute → Megatron's flag names; a non-uniform plan is refused."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, tp=2, pp=2, micro_batch_size=4,
                              global_batch=64, recompute="full")
    flags = to_megatron_flags(plan, oracle.model)
    assert "--tensor-model-parallel-size 2" in flags
    assert "--pipeline-model-parallel-size 2" in flags
    assert "--micro-batch-size 4" in flags and "--global-batch-size 64" in flags
    assert "--recompute-granularity full" in flags
    uneven = ParallelPlan.build(oracle.model, oracle.cluster, pp=2, dp=2, micro_batch_size=1,
                                global_batch=8, stage_layers=(10, 14))
    with pytest.raises(SpecError, match="uniform"):
        to_megatron_flags(uneven, oracle.model)


def test_trainsim_json_round_trips(oracle: Oracle) -> None:
    """ParallelPlan JSON (what --out writes as best_plan.json) parses back to the same plan."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, pp=2, stage_gpus=(2, 2),
                              micro_batch_size=2, global_batch=8,
                              stage_recompute=("full", ("attn.score",)))
    assert ParallelPlan.from_json(plan.to_json()) == plan


def test_per_op_degrees_export_per_op_and_round_trip(oracle: Oracle) -> None:
    """Stage 1 (2 GPUs, tp 1) runs its 8 blocks' MLP GEMMs and GeLU at tp 2: those 3·8 ops
    export tp 2 / dp 1, the other ops tp 1 / dp 2; the stage is marked for resharding; the
    config reads back to the same plan, and Megatron flags are refused."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, pp=2, stage_gpus=(2, 2),
                              stage_tp=(1, 1), stage_layers=(12, 12), micro_batch_size=2,
                              global_batch=8, stage_recompute=("none", "selective"),
                              stage_op_tp=({}, {"mlp.fc1": 2, "mlp.gelu": 2, "mlp.fc2": 2}))
    config = to_aceso_config(plan, oracle.model)
    tps, dps = config["model_parallel_size_of_each_op"], config["data_parallel_size_of_each_op"]
    names = config["op_names"][1]
    mlp = {"enc-MLP-GEMM-1", "enc-MLP-gelu", "enc-MLP-GEMM-2"}
    assert sum(n in mlp for n in names) == 3 * 12
    assert all((t, d) == ((2, 1) if n in mlp else (1, 2)) for n, t, d in
               zip(names, tps[1], dps[1]))
    assert set(tps[0]) == {1} and config["resharding_stages"] == [False, True]
    back = ParallelPlan.build(oracle.model, oracle.cluster,
                              **from_aceso_config(config, oracle.model))
    assert back == plan
    config.pop("trainsim_stage_tp")  # Aceso's own configs: the first op's degree is the stage's
    assert from_aceso_config(config, oracle.model)["stage_tp"] == [1, 1]
    with pytest.raises(SpecError, match="per-op degrees on stages \\[1\\]"):
        to_megatron_flags(plan, oracle.model)


def test_conflicting_per_op_degrees_are_refused(oracle: Oracle) -> None:
    """An Aceso config giving one op name two degrees in one stage (trainsim keeps one per
    name per stage) or a tp × dp that is not the stage's GPUs is refused by name."""
    plan = ParallelPlan.build(oracle.model, oracle.cluster, pp=2, stage_gpus=(2, 2),
                              stage_layers=(12, 12), micro_batch_size=2, global_batch=8)
    config = to_aceso_config(plan, oracle.model)
    names = config["op_names"][1]
    first = names.index("enc-MLP-GEMM-1")
    config["model_parallel_size_of_each_op"][1][first] = 2
    config["data_parallel_size_of_each_op"][1][first] = 1
    with pytest.raises(SpecError, match="gives op 'mlp.fc1' degrees 2 and 1"):
        from_aceso_config(config, oracle.model)
    config["data_parallel_size_of_each_op"][1][first] = 2
    with pytest.raises(SpecError, match=r"tp 2 × dp 2 != num_gpus\[1\]=2"):
        from_aceso_config(config, oracle.model)


# ------------------------------------------------ Megatron-LM flags: every field, or none
HETERO = parse_cluster("1x4xA100-SXM4-40GB+1x4xA10")


def _flags(**fields) -> str:
    model = get_model("gpt3-350m")  # 24 layers
    base = {"dp": 4, "tp": 2, "pp": 1, "micro_batch_size": 2, "global_batch": 32}
    return to_megatron_flags(ParallelPlan.build(model, HETERO, **{**base, **fields}), model)


@pytest.mark.parametrize(("fields", "flag"), [
    ({}, ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
          "--micro-batch-size 2 --global-batch-size 32")),
    ({"dp": 2, "tp": 1, "pp": 4, "micro_batch_size": 1, "schedule": "interleaved",
      "virtual_stages": 2}, "--num-layers-per-virtual-pipeline-stage 3"),  # 24 / (4·2)
    ({"dp": 2, "tp": 2, "cp": 2}, "--context-parallel-size 2 --micro-batch-size 2"),  # was 1
    ({"seq_len": 1024}, "--seq-length 1024"),
    ({"sp": True}, "--sequence-parallel"),
    ({"recompute": "full"}, ("--recompute-granularity full --recompute-method uniform "
                             "--recompute-num-layers 1")),
    ({"recompute": "selective"}, "--recompute-granularity selective"),
    ({"zero": 1}, "--use-distributed-optimizer"),
    ({"zero": 1, "overlap_param_gather": True}, "--overlap-grad-reduce --overlap-param-gather"),
    ({"sp": True, "tp_comm_overlap": True}, "--tp-comm-overlap"),
    ({"dtype": "fp16"}, "--fp16"),
    ({"dtype": "bf16"}, "--bf16"),
    ({"dp_batch_split": [8, 8, 8, 8]}, "--micro-batch-size 2 --global-batch-size 32"),
    ({"node_order": [0, 1]}, "--tensor-model-parallel-size 2"),  # the written order: launch order
    ({"dp": 1, "tp": 1, "pp": 2, "stage_gpus": [4, 4], "micro_batch_size": 4},
     "--micro-batch-size 1 --global-batch-size 32"),  # Aceso's pipeline micro-batch over dp 4
])
def test_megatron_flags_express_each_field(fields: dict, flag: str) -> None:
    """Each plan field Megatron-LM runs appears as its flag (names checked against
    Megatron-LM's arguments.py, see to_megatron_flags)."""
    assert flag in _flags(**fields)


def test_megatron_flags_leave_out_what_is_megatron_default() -> None:
    """fp32 is Megatron-LM's default (no --fp16/--bf16), ZeRO 0 no distributed optimizer,
    overlap_grad_reduce=False no --overlap-grad-reduce."""
    flags = _flags(dtype="fp32", overlap_grad_reduce=False)
    assert not {"--fp16", "--bf16", "--use-distributed-optimizer", "--overlap-grad-reduce",
                "--sequence-parallel", "--recompute"} & set(flags.split())


@pytest.mark.parametrize(("fields", "named"), [
    ({"dp_batch_split": [12, 12, 4, 4]}, "plan.dp_batch_split=[12, 12, 4, 4]"),
    ({"dp": 2, "tp": 1, "pp": 4, "schedule": "zb-h1"}, "plan.schedule='zb-h1'"),
    ({"dp": 2, "tp": 1, "pp": 4, "schedule": "gpipe"}, "plan.schedule='gpipe'"),
    ({"zero": 2}, "plan.zero=2"),
    ({"zero": 3, "dtype": "bf16"}, "plan.zero=3"),
    ({"tp_comm_overlap": True}, "plan.tp_comm_overlap without plan.sp"),
    ({"dp": 2, "pp": 2, "node_order": [1, 0]}, "plan.node_order=[1, 0]"),
    ({"dp": 2, "pp": 2, "placement": [1, 0]}, "plan.placement=[1, 0]"),
    ({"freq_mhz": 1200.0}, "plan.freq_mhz"),
    ({"dp": 2, "pp": 2, "stage_layers": [10, 14]}, "plan.stage_layers=[10, 14]"),
    ({"dp": 2, "pp": 2, "stage_recompute": ["full", "none"]}, "plan.stage_recompute"),
    ({"recompute": ["attn.qkv"]}, "plan.recompute=['attn.qkv']"),
    ({"dp": 1, "tp": 1, "pp": 2, "stage_gpus": [2, 6], "micro_batch_size": 6,
      "global_batch": 36}, "plan.stage_gpus=[2, 6]"),
])
def test_megatron_flags_refuse_and_name_what_megatron_cannot_run(fields: dict,
                                                                   named: str) -> None:
    """No flags for a plan Megatron-LM cannot run as it is; the message names the field (the
    old flags dropped dp_batch_split, zb-h1, ZeRO-3 and placement silently)."""
    with pytest.raises(SpecError, match="uniform") as info:
        _flags(**fields)
    assert named in str(info.value)


def test_megatron_flags_file_says_the_world_size() -> None:
    """megatron_flags.txt: the GPUs to launch on (Megatron-LM's dp is world / (tp·pp·cp)),
    then the flags; a plan it cannot run is one comment line."""
    model = get_model("gpt3-350m")
    plan = ParallelPlan.build(model, HETERO, dp=2, tp=2, pp=2, micro_batch_size=2,
                              global_batch=32)
    text = megatron_flags_file(plan, model)
    comment, flags = text.splitlines()
    assert "launch on 8 GPUs" in comment and "= 2" in comment
    assert flags == to_megatron_flags(plan, model)
    odd = ParallelPlan.build(model, HETERO, dp=2, tp=2, pp=2, micro_batch_size=2,
                             dp_batch_split=(24, 8))
    assert megatron_flags_file(odd, model).count("\n") == 1
    assert megatron_flags_file(odd, model).startswith("# no Megatron-LM flags")


@pytest.mark.slow
def test_hetero_search_writes_no_flags_for_its_uneven_split(tmp_path) -> None:
    """The bug hunt's case: the hetero best plan splits 32 samples [12, 12, 4, 4] over its
    replicas; megatron_flags.txt described an even split (--micro-batch-size 4
    --global-batch-size 32 on tp 2) and now names dp_batch_split instead."""
    from trainsim.cli import main

    out = tmp_path / "o"
    with pytest.raises(SystemExit) as info:
        main(["search", "--method", "hetero", "--model", "gpt3-125m", "--cluster",
              "1x4xA100-SXM4-40GB+1x4xA10", "--global-batch", "32", "--max-evals", "60",
              "--top", "1", "--out", str(out)])
    assert (info.value.code or 0) == 0
    split = ParallelPlan.from_json((out / "best_plan.json").read_text()).dp_batch_split
    assert split is not None and len(set(split)) > 1
    text = (out / "megatron_flags.txt").read_text()
    assert text.startswith("# no Megatron-LM flags") and "plan.dp_batch_split=" in text
    assert "--micro-batch-size" not in text
