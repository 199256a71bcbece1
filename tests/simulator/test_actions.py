"""Pipeline actions: compact strings, CSV round trips and the schedule validator."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsim.errors import PlanError, SpecError
from trainsim.simulator.actions import (
    Action,
    format_schedule,
    infer_stage_to_rank,
    schedule_from_csv,
    schedule_to_csv,
    validate_schedule,
)
from trainsim.workloads.plan_fields import _action_key


def test_str_is_stage_kind_micro_batch() -> None:
    """An action prints as stage, kind, micro-batch: stage 2, full backward, micro-batch 3."""
    assert str(Action(2, "B", 3)) == "2B3"
    assert str(Action(stage=10, kind="W", micro_batch=12)) == "10W12"


@given(st.integers(0, 999), st.sampled_from("FBIW"), st.integers(0, 999))
def test_a_trusted_action_is_the_checked_one(stage: int, kind: str, micro_batch: int) -> None:
    """`Action.trusted` (schedule generators) makes the same value as the checked
    constructor: equal, same hash, order and text, and just as frozen."""
    checked = Action(stage, kind, micro_batch)  # type: ignore[arg-type]
    trusted = Action.trusted(stage, kind, micro_batch)  # type: ignore[arg-type]
    assert trusted == checked and hash(trusted) == hash(checked) and str(trusted) == str(checked)
    assert not trusted < checked and not checked < trusted
    with pytest.raises(AttributeError):
        trusted.stage = 1  # type: ignore[misc]


@given(st.integers(0, 999), st.sampled_from("FBIW"), st.integers(0, 999))
def test_parse_inverts_str(stage: int, kind: str, micro_batch: int) -> None:
    """`Action.parse(str(a)) == a` for every action, and `str(parse(s)) == s`."""
    action = Action(stage, kind, micro_batch)  # type: ignore[arg-type]
    assert Action.parse(str(action)) == action
    assert str(Action.parse(str(action))) == str(action)


@pytest.mark.parametrize("text", ["", "2X3", "B3", "2B", "-1F0", "2 B 3", "2b3", "1F0x"])
def test_parse_errors_name_the_text(text: str) -> None:
    """Malformed action strings raise SpecError quoting the text."""
    with pytest.raises(SpecError, match=re.escape(repr(text))):
        Action.parse(text)


def _plan_key_verdict(text: str) -> str | None:
    """None when a plan accepts `text` as an action key, else its error message."""
    try:
        _action_key("instruction_freq_mhz", text)
    except PlanError as exc:
        return str(exc)
    return None


@given(st.one_of(st.text(alphabet="0123456789FBIWfbx -٣", max_size=6),
                 st.sampled_from(["", "2X3", "B3", "2B", "-1F0", "2 B 3", " 2B3 ", "1F0x", "0W0"])))
def test_plan_action_keys_follow_the_action_grammar(text: str) -> None:
    """A plan's action keys (workloads/plan_fields.py, which may not import the simulator) are
    accepted exactly when `Action.parse` accepts them, and refused with its message."""
    try:
        Action.parse(text)
        expected = None
    except SpecError as exc:
        expected = (f"plan.instruction_freq_mhz key {text!r} is not an action like '2F3' "
                    f"(stage 2 forward of micro-batch 3): {exc}")
    assert _plan_key_verdict(text) == expected


def test_constructor_rejects_bad_fields() -> None:
    """A negative stage or an unknown kind is a SpecError naming the field."""
    with pytest.raises(SpecError, match="stage=-1"):
        Action(-1, "F", 0)
    with pytest.raises(SpecError, match="kind='X'"):
        Action(0, "X", 0)  # type: ignore[arg-type]


def test_csv_round_trip_keeps_idle_slots() -> None:
    """One row per rank; idle slots are empty cells and come back as None."""
    order = {0: [Action(0, "F", 0), None, Action(0, "B", 0)], 1: [None, Action(1, "F", 0),
                                                                    Action(1, "B", 0)]}
    text = schedule_to_csv(order)
    assert text == "0F0,,0B0\n,1F0,1B0\n"
    assert schedule_from_csv(text) == order


def _two_stage() -> dict[int, list[Action | None]]:
    return {
        0: [Action.parse(s) for s in ("0F0", "0F1", "0B0", "0B1")],
        1: [Action.parse(s) for s in ("1F0", "1I0", "1F1", "1W0", "1I1", "1W1")],
    }


def test_validator_accepts_b_or_split_i_w() -> None:
    """A schedule mixing full B on one stage and I/W on another is valid."""
    validate_schedule(_two_stage(), 2, 2, {0: 0, 1: 1})
    validate_schedule(_two_stage(), 2, 2, lambda s: s)


def test_validator_marks_backward_before_forward() -> None:
    """B before its F fails, naming the action and marking the bad step in the grid."""
    order = _two_stage()
    order[0] = [Action.parse(s) for s in ("0F0", "0B1", "0F1", "0B0")]
    with pytest.raises(SpecError) as info:
        validate_schedule(order, 2, 2, lambda s: s)
    message = str(info.value)
    assert "rank 0, step 1: 0B1 runs before its forward 0F1" in message
    assert "step 1: 0B1" in message and "<-- here" in message.splitlines()[3]


def test_validator_catches_w_before_i_missing_and_misplaced() -> None:
    """W before I, a missing backward and a stage on the wrong rank are each reported."""
    order = _two_stage()
    order[1] = [Action.parse(s) for s in ("1F0", "1W0", "1I0", "1F1", "1I1", "1W1")]
    with pytest.raises(SpecError, match="1W0 runs before its input backward 1I0"):
        validate_schedule(order, 2, 2, lambda s: s)
    order = _two_stage()
    order[1] = order[1][:-1]
    with pytest.raises(SpecError, match="missing backward 1W1"):
        validate_schedule(order, 2, 2, lambda s: s)
    with pytest.raises(SpecError, match="stage 1 belongs to rank 0"):
        validate_schedule(_two_stage(), 2, 2, lambda s: 0)


def test_validator_rejects_duplicates_and_mixed_backward() -> None:
    """Two F of one micro-batch, or a B mixed with I for one (stage, micro-batch), fail."""
    order = _two_stage()
    order[0] = [Action.parse(s) for s in ("0F0", "0F0", "0F1", "0B0", "0B1")]
    with pytest.raises(SpecError, match="0F0 appears twice"):
        validate_schedule(order, 2, 2, lambda s: s)
    order = _two_stage()
    order[1] = [Action.parse(s) for s in ("1F0", "1I0", "1B0", "1F1", "1B1")]
    with pytest.raises(SpecError, match="mixes a full backward"):
        validate_schedule(order, 2, 2, lambda s: s)


def test_format_and_infer_stage_to_rank() -> None:
    """The grid has one column per rank; stage placement is read off the order."""
    grid = format_schedule(_two_stage())
    assert grid.splitlines()[0].split() == ["rank", "0", "rank", "1"]
    assert infer_stage_to_rank(_two_stage()) == {0: 0, 1: 1}
    with pytest.raises(SpecError, match="stage 0 on rank 1"):
        infer_stage_to_rank({0: [Action(0, "F", 0)], 1: [Action(0, "B", 0)]})
