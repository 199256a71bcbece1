"""Importing torch.distributed.pipelining schedules: the same per-rank order torch prints."""

from __future__ import annotations

import importlib.util

import pytest

# Slow: importing torch (and its pipelining schedules) takes seconds even for one test.
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")]

from trainsim.errors import SpecError
from trainsim.simulator.actions import infer_stage_to_rank, validate_schedule
from trainsim.simulator.schedules import (
    dry_run,
    get_schedule,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    zb_h1,
)
from trainsim.simulator.torch_schedules import (
    from_torch,
    supported_classes,
    torch_printed_order,
)

CASES = [
    ("ScheduleGPipe", 4, 8, 1),
    ("ScheduleGPipe", 2, 3, 1),
    ("ScheduleInterleaved1F1B", 4, 8, 2),
    ("ScheduleInterleaved1F1B", 2, 6, 3),
    ("ScheduleLoopedBFS", 4, 8, 2),
    ("ScheduleInterleavedZeroBubble", 4, 8, 1),
    ("ScheduleInterleavedZeroBubble", 4, 8, 2),
    ("ScheduleZBVZeroBubble", 4, 8, 2),
    ("ScheduleZBVZeroBubble", 2, 3, 2),
    ("ScheduleDualPipeV", 4, 8, 2),
]


def _strs(order, keep_idle: bool = True) -> dict[int, list[str]]:
    return {r: ["" if a is None else str(a) for a in ops if keep_idle or a is not None]
            for r, ops in order.items()}


@pytest.mark.parametrize(("name", "p", "m", "v"), CASES)
def test_same_order_as_torch_prints(name: str, p: int, m: int, v: int) -> None:
    """The imported order equals torch's pipeline_order as printed (compute actions, idle
    slots kept), is a valid schedule and dry-runs without deadlock."""
    if name not in supported_classes():
        pytest.skip(f"{name} not in this torch")
    order = from_torch(name, p, m, v)
    assert _strs(order) == torch_printed_order(name, p, m, v)
    validate_schedule(order, p * v, m, infer_stage_to_rank(order))
    assert dry_run(order).makespan > 0


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 8), (3, 7)])
def test_schedule_1f1b_is_what_torch_runs(p: int, m: int) -> None:
    """torch's Schedule1F1B runs Megatron's 1F1B (recorded from its own step loop). Its
    printed IR agrees on every rank but the last, where torch 2.13 labels micro-batches 1..m."""
    order = from_torch("Schedule1F1B", p, m)
    assert order == one_f_one_b(p, m)
    printed = torch_printed_order("Schedule1F1B", p, m)
    assert {r: printed[r] for r in range(p - 1)} == {r: _strs(order)[r] for r in range(p - 1)}


def test_builtin_schedules_equal_torch_orders() -> None:
    """Our GPipe, interleaved 1F1B and ZB-H1 equal torch's (idle slots removed)."""
    assert from_torch("ScheduleGPipe", 4, 8) == gpipe(4, 8)
    for p, m, v in [(4, 8, 2), (2, 4, 2), (4, 4, 2), (2, 6, 3)]:
        assert _strs(from_torch("ScheduleInterleaved1F1B", p, m, v), keep_idle=False) == \
            _strs(interleaved_1f1b(p, m, v))
    for p, m in [(2, 2), (4, 4), (4, 8), (8, 16), (3, 1)]:
        assert _strs(from_torch("ScheduleInterleavedZeroBubble", p, m), keep_idle=False) == \
            _strs(zb_h1(p, m))


def test_zbv_places_stages_in_a_v() -> None:
    """ZBV puts stages r and 2p−1−r on rank r."""
    placement = infer_stage_to_rank(from_torch("ScheduleZBVZeroBubble", 4, 8, 2))
    assert placement == {0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 2, 6: 1, 7: 0}


def test_get_schedule_torch_prefix_and_short_names() -> None:
    """`torch:<Class>` goes through get_schedule; torch's short names work too."""
    assert get_schedule("torch:Schedule1F1B")(4, 8) == one_f_one_b(4, 8)
    assert from_torch("1F1B", 2, 4) == from_torch("schedule1f1b", 2, 4)
    with pytest.raises(SpecError, match="did you mean"):
        get_schedule("torch:ScheduleGPip")


def test_errors_are_one_line_spec_errors() -> None:
    """Unknown classes list the supported ones; torch's rejections become one-line SpecErrors."""
    with pytest.raises(SpecError, match="ScheduleInterleaved1F1B") as info:
        from_torch("ScheduleFoo", 2, 4)
    assert "valid:" in str(info.value)
    with pytest.raises(SpecError, match="must be greater than or equal") as info:
        from_torch("Schedule1F1B", 4, 2)
    assert "\n" not in str(info.value)
    with pytest.raises(SpecError, match="multiple of the number of rounds"):
        from_torch("ScheduleInterleaved1F1B", 2, 5, 2)
    with pytest.raises(SpecError, match="stages_per_rank in \\[2\\]"):
        from_torch("ScheduleZBVZeroBubble", 2, 4, 1)
    with pytest.raises(SpecError, match="one stage per rank"):
        from_torch("ScheduleGPipe", 2, 4, 2)
