"""What the data-parallel gradient reduction carries per gradient (`ModelSpec.grad_reduce_dtype`,
set by framework profiles): Megatron-LM reduces bf16 runs' gradients in fp32, torchtitan's
FSDP2 reduce-scatters in fp32, NeMo's performance runs in bf16."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.workloads.framework import apply_framework
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.stage_costs import grad_reduce_bytes
from trainsim.workloads.zoo import get_model

CLUSTER = parse_cluster_spec("1x8xA100-SXM4-80GB")


@pytest.mark.parametrize(("policy", "dtype", "want"), [
    ("param", "bf16", 2.0), ("param", "fp16", 2.0), ("param", "fp32", 4.0),
    ("fp32", "bf16", 4.0), ("fp32", "fp16", 4.0), ("fp32", "fp32", 4.0),
    ("fp32-for-bf16", "bf16", 4.0), ("fp32-for-bf16", "fp8", 4.0),
    ("fp32-for-bf16", "fp16", 2.0)])
def test_bytes_per_gradient(policy: str, dtype: str, want: float) -> None:
    assert grad_reduce_bytes(policy, dtype) == want


def _reduced_bytes(framework: str | None, dtype: str, zero: int) -> float:
    """Bytes the dp reduction moves over the plan's one stage, per GPU (folded)."""
    spec = apply_framework(get_model("gpt3-350m"), framework)
    plan = ParallelPlan.build(spec, CLUSTER, dp=8, global_batch=16, micro_batch_size=2,
                              dtype=dtype, zero=zero, overlap_grad_reduce=False)
    program = lower(spec, CLUSTER, plan, LoweringOptions())
    t = program.tasks
    names = np.asarray(t.name_templates)[t.name_code]
    kinds = np.asarray(t.kind_names)[t.kind_code]
    picked = (names == "s0.dp") & np.isin(kinds, ("all_reduce", "reduce_scatter"))
    assert picked.any()
    return float(t.comm_bytes[picked].sum())


@pytest.mark.parametrize("zero", [0, 1])
def test_frameworks_set_what_the_reduction_moves(zero: int) -> None:
    base = _reduced_bytes(None, "bf16", zero)
    assert _reduced_bytes("megatron", "bf16", zero) == pytest.approx(2 * base)
    assert _reduced_bytes("megatron", "fp16", zero) == pytest.approx(
        _reduced_bytes(None, "fp16", zero))
    assert _reduced_bytes("torchtitan", "bf16", zero) == pytest.approx(2 * base)
    assert _reduced_bytes("nemo", "bf16", zero) == pytest.approx(base)


def test_bad_policy_is_refused() -> None:
    import dataclasses

    with pytest.raises(ValueError, match="grad_reduce_dtype"):
        dataclasses.replace(get_model("gpt3-350m"), grad_reduce_dtype="fp64")


@pytest.mark.parametrize(("framework", "dtype", "per_param"), [
    (None, "bf16", 16.0), ("megatron", "bf16", 18.0), ("megatron", "fp16", 16.0),
    ("nemo", "bf16", 16.0), ("torchtitan", "bf16", 16.0)])
def test_gradient_memory_follows_the_stacks_buffer(framework: str | None, dtype: str,
                                                   per_param: float) -> None:
    """Megatron-Core keeps bf16 runs' gradients in its fp32 buffer: 2 + 4 + 12 bytes a
    parameter (data parallelism alone: every GPU holds the whole model)."""
    spec = apply_framework(get_model("gpt3-350m"), framework)
    plan = ParallelPlan.build(spec, CLUSTER, dp=8, global_batch=16, micro_batch_size=2,
                              dtype=dtype)
    program = lower(spec, CLUSTER, plan, LoweringOptions())
    assert program.static_memory_bytes[0] == pytest.approx(per_param * spec.parameters(),
                                                           rel=1e-9)
