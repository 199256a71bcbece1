"""Shared links of folded programs (program.py): a folded task standing for n copies on physical
link l crosses ``l/n``, and every ``l/n`` is the one physical link, its users counted in copies.
Before this, a folded tensor-parallel all-reduce on ``l`` and a data-parallel one on ``l/2``
never contended, so folded plans ran up to 8 % faster than the same plans unfolded."""

from __future__ import annotations

import pytest

from trainsim import api
from trainsim.errors import SimulationError
from trainsim.simulator.engines import run_program
from trainsim.simulator.program import Program, Task, physical_link, shared_link_id


def _transfer(name: str, rank: int, nbytes: float, link: str) -> Task:
    return Task(name=name, kind="comm", ranks=(rank,), stream="comm", duration_s=0.0,
                comm_bytes=nbytes, links=(link,))


@pytest.mark.parametrize("engine", ["numba", "simpy"])
def test_copies_on_one_physical_link_share_it(engine: str) -> None:
    """Task A (one copy, 100 B on x) and task B (two copies, 50 B each, on x/2) are three flows
    on x: each gets 100/3 B/s, B ends at 1.5 s and A, alone after, at 2.0 s (unshared: both at
    1.0 s)."""
    program = Program(num_ranks=2, tasks=[_transfer("a", 0, 100.0, "x"),
                                          _transfer("b", 1, 50.0, "x/2")],
                      link_bandwidth_bytes_per_s={"x": 100.0, "x/2": 50.0})
    result = run_program(program, engine=engine)
    ends = dict(zip(result.tasks["name"], result.tasks["end_s"], strict=True))
    assert ends["b"] == pytest.approx(1.5, rel=1e-12)
    assert ends["a"] == pytest.approx(2.0, rel=1e-12)


def test_link_ids_round_trip() -> None:
    assert shared_link_id("n0.nic.out", 1) == "n0.nic.out"
    assert physical_link(shared_link_id("n0.nic.out", 4)) == ("n0.nic.out", 4)
    assert physical_link("n0.nvlink.g0-g1") == ("n0.nvlink.g0-g1", 1)


def test_ids_of_one_physical_link_must_agree_on_its_bandwidth() -> None:
    with pytest.raises(SimulationError, match=r"'x/2'.*disagrees with 'x'"):
        Program(num_ranks=1, link_bandwidth_bytes_per_s={"x": 100.0, "x/2": 40.0})


def _mb(batch: int, seq: int) -> dict:
    return {"batch_size": batch, "seq_len": seq}


@pytest.mark.parametrize(("model", "cluster", "plan"), [
    # tp 4 spans two nodes: its all-reduce (one copy per NIC) meets dp's (two copies per NIC)
    ("gpt3-125m", "4x2xA10", {"dp": 2, "tp": 4, "micro_batch_size": 2, "global_batch": 4,
                              "seq_len": 256}),
    ("gpt3-125m", "2x8xA100-SXM4-80GB", {"dp": 8, "pp": 2, "micro_batch_size": 1, "seq_len": 256,
                                         "global_batch": 18,
                                         "dp_batch_split": (4, 2, 2, 2, 2, 2, 2, 2)}),
    ("gpt3-125m", "2x8xA100-SXM4-80GB", {
        "dp": 8, "pp": 2, "schedule": "gpipe", "global_batch": 12,
        "replica_micro_batches": [[_mb(1, 256)], [_mb(2, 256)], [_mb(1, 64)], [_mb(2, 256)]] * 2}),
    ("bert-base", "2x2xA10+1x4xH100-SXM5-80GB", {
        "dp": 2, "tp": 4, "micro_batch_size": 2, "global_batch": 8, "seq_len": 256, "zero": 3,
        "recompute": "selective", "node_order": (2, 0, 1)}),
])
def test_folded_equals_unfolded_where_folded_collectives_meet_on_a_nic(
        model: str, cluster: str, plan: dict) -> None:
    """The bug hunter's cases: folded ran 4.4, 1.6, 4.5 and 8.4 % faster than unfolded."""
    folded = api.simulate(model, cluster, **plan)
    unfolded = api.simulate(model, cluster, unfold=True, **plan)
    assert folded.program.num_ranks < unfolded.program.num_ranks
    assert folded.iteration_time_s == pytest.approx(unfolded.iteration_time_s, rel=1e-9)
    assert folded.energy_j == pytest.approx(unfolded.energy_j, rel=1e-9)
