"""Pipeline schedules: golden orders, bubble fractions under a unit-time dry run, memory."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.errors import SpecError, UnknownNameError
from trainsim.simulator.actions import Action, read_schedule_csv, validate_schedule
from trainsim.simulator.schedules import (
    dry_run,
    explicit,
    get_schedule,
    gpipe,
    interleaved_1f1b,
    load_explicit,
    one_f_one_b,
    peak_in_flight,
    schedule_to_json,
    unit_time_makespan,
    zb_h1,
)

DATA = Path(__file__).parent / "data"


def _strs(order: dict[int, list[Action | None]]) -> dict[int, list[str]]:
    return {r: [str(a) for a in ops if a is not None] for r, ops in order.items()}


@pytest.mark.parametrize(
    ("builder", "golden"),
    [
        (lambda: gpipe(4, 8), "gpipe_p4_m8.csv"),
        (lambda: one_f_one_b(4, 8), "1f1b_p4_m8.csv"),
        (lambda: interleaved_1f1b(4, 8, 2), "interleaved_p4_m8_v2.csv"),
        (lambda: zb_h1(4, 8), "zbh1_p4_m8.csv"),
    ],
)
def test_golden_orders(builder, golden: str) -> None:
    """Each schedule for p=4, m=8 equals its golden CSV (checked against torch's orders)."""
    assert builder() == read_schedule_csv(DATA / golden)


def test_one_f_one_b_matches_megatron_figure() -> None:
    """1F1B, p=4 m=8 (Narayanan et al. 2021 Fig. 4 top): rank 0 warms up with 3 forwards,
    the last rank alternates from the start."""
    order = _strs(one_f_one_b(4, 8))
    assert order[0][:6] == ["0F0", "0F1", "0F2", "0F3", "0B0", "0F4"]
    assert order[3][:4] == ["3F0", "3B0", "3F1", "3B1"]
    assert order[0][-4:] == ["0B4", "0B5", "0B6", "0B7"]


def test_interleaved_places_chunks_round_robin() -> None:
    """Interleaved v=2 on p=4: rank 1 holds virtual stages 1 and 5; forwards run in groups of p
    micro-batches per chunk: 1F0..1F3 on chunk 0, then 5F0.. on chunk 1."""
    order = _strs(interleaved_1f1b(4, 8, 2))
    assert {a[0] for a in order[1]} == {"1", "5"}
    assert order[1][:6] == ["1F0", "1F1", "1F2", "1F3", "5F0", "5F1"]


def test_interleaved_requires_m_multiple_of_p() -> None:
    """Megatron's rule: m % p == 0, else SpecError naming it."""
    with pytest.raises(SpecError, match="m=6 is not divisible by p=4"):
        interleaved_1f1b(4, 6, 2)


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 5), (4, 4), (4, 8), (8, 16), (3, 7)])
def test_gpipe_and_1f1b_bubble_is_exact(p: int, m: int) -> None:
    """With F=1, B=2 and free communication the bubble is (p−1)/(m+p−1) exactly, for GPipe
    and 1F1B alike; the makespan is 3·(m + p − 1)."""
    for order in (gpipe(p, m), one_f_one_b(p, m)):
        run = dry_run(order)
        assert run.makespan == 3 * (m + p - 1)
        assert Fraction(run.bubble_fraction).limit_denominator(1000) == Fraction(p - 1, m + p - 1)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (4, 4, 2), (2, 4, 3), (4, 12, 3),
                                           (8, 16, 4)])
def test_interleaved_bubble_is_exact(p: int, m: int, v: int) -> None:
    """Interleaved with v chunks per rank, F=1/v, B=2/v: bubble (p−1)/(v·m+p−1) exactly."""
    run = dry_run(interleaved_1f1b(p, m, v), f=Fraction(1, v), b=Fraction(2, v))
    busy = sum(run.busy_by_rank.values())
    assert 1 - busy / (p * run.makespan) == Fraction(p - 1, v * m + p - 1)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (8, 16), (4, 4)])
def test_zb_h1_bubble_smaller_than_1f1b(p: int, m: int) -> None:
    """ZB-H1 with F=I=W=1 has makespan 3m + (p−1) (bubble (p−1)·(F+I−W), Qi et al. 2024 §3.1),
    below 1F1B's 3m + 3(p−1) with B = I + W = 2."""
    zb = dry_run(zb_h1(p, m))
    assert zb.makespan == 3 * m + (p - 1)
    assert zb.bubble_fraction < dry_run(one_f_one_b(p, m)).bubble_fraction


def test_in_flight_micro_batches() -> None:
    """1F1B keeps at most p−r micro-batches on rank r, GPipe m, ZB-H1 at most p (1F1B's peak)."""
    assert peak_in_flight(one_f_one_b(4, 8)) == {0: 4, 1: 3, 2: 2, 3: 1}
    assert peak_in_flight(gpipe(4, 8)) == {r: 8 for r in range(4)}
    assert max(peak_in_flight(zb_h1(4, 8)).values()) == 4
    assert peak_in_flight(one_f_one_b(4, 2)) == {0: 2, 1: 2, 2: 2, 3: 1}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.sampled_from(["gpipe", "1f1b", "zb-h1"]))
def test_builders_are_valid_and_deadlock_free(p: int, m: int, name: str) -> None:
    """Every built-in single-stage schedule validates and dry-runs for any p, m."""
    order = get_schedule(name)(p, m)
    validate_schedule(order, p, m, lambda s: s)
    assert unit_time_makespan(order) >= 3 * m


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.integers(1, 4))
def test_interleaved_valid_for_any_sizes(p: int, rounds: int, v: int, c: int) -> None:
    """Interleaved orders validate (stage c·p + r on rank r) and finish, with comm delays too."""
    m = p * rounds
    order = interleaved_1f1b(p, m, v)
    validate_schedule(order, p * v, m, lambda s: s % p)
    assert unit_time_makespan(order, comm=c) > 0


def test_explicit_from_json_and_round_trip(tmp_path: Path) -> None:
    """A user order given as JSON {"rank": [actions]} loads, validates and round-trips."""
    data = {"0": ["0F0", "0F1", None, "0B0", "0B1"], "1": ["1F0", "1B0", "1F1", "1B1"]}
    order = explicit(data)
    assert order[0][2] is None and str(order[1][1]) == "1B0"
    path = tmp_path / "order.json"
    path.write_text(json.dumps(data))
    assert load_explicit(path) == order
    assert json.loads(schedule_to_json(order)) == data


def test_explicit_deadlock_names_stuck_ranks() -> None:
    """Rank 0 waits for 1B0 before its F1; rank 1 wants 0F1 before 1B0: a cycle. The error
    names both stuck ranks and what each waits for."""
    data = {"0": ["0F0", "0B0", "0F1", "0B1"], "1": ["1F0", "1F1", "1B0", "1B1"]}
    with pytest.raises(SpecError) as info:
        explicit(data)
    message = str(info.value)
    assert "stuck ranks [0, 1]" in message
    assert "rank 0 stuck at 0B0 waiting for 1B0" in message
    assert "rank 1 stuck at 1F1 waiting for 0F1" in message


def test_explicit_rejects_bad_input() -> None:
    """Unparsable actions, bad rank keys and invalid orders are SpecErrors."""
    with pytest.raises(SpecError, match="'0Q0'"):
        explicit({"0": ["0Q0"]})
    with pytest.raises(SpecError, match="exactly 0..p-1"):
        explicit({"1": ["0F0", "0B0"]})
    with pytest.raises(SpecError, match="missing backward"):
        explicit({"0": ["0F0"]})


def test_get_schedule_names_and_aliases() -> None:
    """Names and aliases map to the builders; unknown names list the valid ones."""
    assert get_schedule("1F1B")(4, 8) == one_f_one_b(4, 8)
    assert get_schedule("zbh1")(2, 3) == zb_h1(2, 3)
    assert get_schedule("interleaved_1f1b")(2, 4, 2) == get_schedule("interleaved")(2, 4, 2)
    with pytest.raises(SpecError, match="stages_per_rank=2"):
        get_schedule("gpipe")(2, 4, 2)
    with pytest.raises(UnknownNameError, match="did you mean gpipe"):
        get_schedule("gpip")
