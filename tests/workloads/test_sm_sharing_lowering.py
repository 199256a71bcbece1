"""Lowering passes each rank's φ (hwmodels/comm_sm.py) to the engines: overlapped collectives
then slow the compute beside them (issue 13, item 4); the option turns it off."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim import api
from trainsim.hwmodels.comm_sm import comm_sm_fraction
from trainsim.hwmodels.gpus import get_gpu
from trainsim.simulator.engines import run_program
from trainsim.simulator.program import SM_OCCUPIES, sm_roles
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.plan import ParallelPlan

MODEL = "gpt3-125m"


def _lowered(cluster: str, options: LoweringOptions | None = None, **fields: object):
    spec, hw = api.load_model(MODEL), api.load_cluster(cluster)
    plan = ParallelPlan.build(spec, hw, **{"pp": 1, "micro_batch_size": 2, **fields})
    return lower(spec, hw, plan, options)


def test_each_rank_carries_its_gpus_phi_and_the_option_zeroes_it() -> None:
    """On a mixed cluster each program rank gets its own GPU's φ; comm_sm_sharing=False gives
    0 everywhere and leaves every task as it was."""
    on = _lowered("1x4xA100-SXM4-80GB+1x4xA10", dp=8, global_batch=16)
    names = on.info.gpu_names
    assert names is not None and {"A100-SXM4-80GB", "A10"} <= set(names)
    assert on.comm_sm_fraction == tuple(comm_sm_fraction(get_gpu(n)) for n in names)
    off = _lowered("1x4xA100-SXM4-80GB+1x4xA10", LoweringOptions(comm_sm_sharing=False), dp=8,
                   global_batch=16)
    assert off.comm_sm_fraction == (0.0,) * off.num_ranks
    assert off.table().duration_s.tolist() == on.table().duration_s.tolist()


def test_overlapped_gradient_reduction_slows_the_backward_beside_it() -> None:
    """Data parallelism with the reduction overlapped: the dp all-reduces occupy SMs, and the
    iteration with sharing is longer than without, by less than φ/(1 − φ) of the time the
    collectives run (the work they take from the compute, done at the slowed rate at worst)."""
    on = _lowered("1x8xA100-SXM4-40GB", dp=8, global_batch=32)
    off = _lowered("1x8xA100-SXM4-40GB", LoweringOptions(comm_sm_sharing=False), dp=8,
                   global_batch=32)
    roles = sm_roles(on)
    assert np.count_nonzero(roles == SM_OCCUPIES) > 0
    r_on, r_off = run_program(on), run_program(off)
    phi = on.comm_sm_fraction[0]
    occupied = r_off.end_s[roles == SM_OCCUPIES] - r_off.start_s[roles == SM_OCCUPIES]
    assert r_on.iteration_time_s > r_off.iteration_time_s
    assert r_on.iteration_time_s - r_off.iteration_time_s <= phi / (1 - phi) * occupied.sum()


@pytest.mark.parametrize("engine", ["simpy", "numba"])
def test_without_collectives_nothing_changes(engine: str) -> None:
    """One GPU, no collective: sharing on or off gives the same times, bit for bit."""
    on = run_program(_lowered("1xA100-SXM4-40GB", dp=1, global_batch=4), engine=engine)
    off = run_program(_lowered("1xA100-SXM4-40GB", LoweringOptions(comm_sm_sharing=False),
                               dp=1, global_batch=4), engine=engine)
    assert on.end_s.tolist() == off.end_s.tolist()
