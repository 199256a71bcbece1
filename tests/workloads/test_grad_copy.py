"""Gradient copies around the data-parallel reduction (workloads/lowering/gradient_sync.py,
`ModelSpec.grad_copy_traffic`): the gradients copied into the reduction buffer before it (the
first 2 bytes per gradient byte) and the result copied back after it (the rest), on each rank's
compute stream, the reduction waiting for the first and the optimizer step for the second."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.simulator.engines import run_program
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.stage_costs import optimizer_bytes_per_param
from trainsim.workloads.zoo import get_model

CLUSTER = parse_cluster_spec("1x4xV100-PCIe-32GB")
MODEL = get_model("gpt3-350m")


def _program(traffic: float, **fields):
    plan = ParallelPlan.build(MODEL, CLUSTER, **{"dp": 2, "pp": 2, "global_batch": 8,
                                                 "micro_batch_size": 2, **fields})
    model = dataclasses.replace(MODEL, grad_copy_traffic=traffic)
    # one bucket per stage: every copy moves all of the stage's gradients
    options = LoweringOptions(dp_bucket_bytes=1e15)
    return lower(model, CLUSTER, plan, options), plan


def _tasks(program, kind: str) -> np.ndarray:
    t = program.tasks
    return np.flatnonzero(t.kind_code == t.kind_names.index(kind)) if kind in t.kind_names \
        else np.zeros(0, np.int64)


def _deps(program, task: int) -> list[int]:
    t = program.tasks
    return t.dep_idx[t.dep_ptr[task]:t.dep_ptr[task + 1]].tolist()


def _name(program, task: int) -> str:
    t = program.tasks
    return t.name_templates[t.name_code[task]]


def test_no_copy_without_traffic_or_data_parallelism() -> None:
    assert len(_tasks(_program(0.0)[0], "grad_copy")) == 0
    assert len(_tasks(_program(6.0, dp=1, pp=4)[0], "grad_copy")) == 0


def test_copies_wrap_every_reduction_at_the_stated_traffic() -> None:
    program, plan = _program(6.0)
    reductions = _tasks(program, "all_reduce")
    assert len(reductions) == plan.pp  # one bucket per stage, folded
    copies = _tasks(program, "grad_copy")
    gpu, cost = CLUSTER.gpu(0), RooflineCostModel()
    grad = optimizer_bytes_per_param(plan.dtype)[1]
    ins = [c for c in copies if _name(program, c).endswith("copy_in")]
    outs = [c for c in copies if _name(program, c).endswith("copy_out")]
    assert len(ins) == len(outs) == plan.pp
    for red in reductions:
        stage = int(program.tasks.stage[red])
        params = program.static_memory_bytes[stage] / sum(optimizer_bytes_per_param(plan.dtype))
        (cin,) = [c for c in ins if c in _deps(program, red)]
        (cout,) = [c for c in outs if red in _deps(program, c)]
        for task, moved in ((cin, 2.0), (cout, 4.0)):
            want = cost.estimate("copy", 0.0, moved * grad * params, gpu, None, plan.dtype,
                                 None).time_s
            assert program.tasks.duration_s[task] == pytest.approx(want, rel=1e-9)
        optimizer = [o for o in _tasks(program, "optimizer") if cout in _deps(program, o)]
        assert len(optimizer) == 1


def test_copy_in_alone_below_two_bytes() -> None:
    program, _ = _program(1.5)
    names = {_name(program, c) for c in _tasks(program, "grad_copy")}
    assert names and all(n.endswith("copy_in") for n in names)


def test_copies_lengthen_the_iteration() -> None:
    plain = run_program(_program(0.0)[0], engine="numba").iteration_time_s
    copied = run_program(_program(6.0)[0], engine="numba").iteration_time_s
    assert copied > plain


def test_traffic_out_of_range_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="grad_copy_traffic"):
        dataclasses.replace(MODEL, grad_copy_traffic=-1.0)
