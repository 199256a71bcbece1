"""Pipeline actions and schedules as data: compact strings, CSV round trips, validation.

A pipeline schedule is plain data, as in PyTorch's `torch.distributed.pipelining.schedules`:
`dict[rank, list[Action | None]]`, one ordered list of compute actions per pipeline rank, where
`None` is an idle slot (optional; the engines ignore it, it only aligns printed grids). An action
prints compactly as ``"2B3"`` -- stage 2, full backward, micro-batch 3 -- and `Action.parse` is the
exact inverse of `str`.

Kinds follow Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024, §2): ``F`` forward,
``B`` full backward, and the zero-bubble split of ``B`` into ``I`` (gradient w.r.t. the stage's
input, on the critical path) and ``W`` (gradient w.r.t. its weights, free to be deferred).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

from trainsim.errors import SpecError, read_user_text

ActionKind: TypeAlias = Literal["F", "B", "I", "W"]
"""F forward, B full backward, I backward for input grads only, W backward for weight grads only."""

ACTION_KINDS: tuple[ActionKind, ...] = ("F", "B", "I", "W")

_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")
# workloads/plan_fields.py states this grammar again for a plan's action keys (workloads sit
# below the simulator); tests/simulator/test_actions.py holds the two equal.


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One compute action of a pipeline schedule: run `kind` of `stage` on `micro_batch`.

    Positional construction (``Action(2, "B", 3)``) is allowed on purpose: an action is a
    three-field value, printed and parsed as ``"2B3"`` like torch's ``_Action``.
    """

    stage: int
    """Pipeline stage index (0-based; with virtual stages, the global virtual stage index)."""
    kind: ActionKind
    """``"F"``, ``"B"``, ``"I"`` or ``"W"`` (see module docstring)."""
    micro_batch: int
    """Micro-batch index (0-based)."""

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or not isinstance(self.stage, int) or self.stage < 0:
            raise SpecError(f"action stage={self.stage!r} must be an integer >= 0")
        if self.kind not in ACTION_KINDS:
            raise SpecError(f"action kind={self.kind!r} must be one of {', '.join(ACTION_KINDS)}")
        if (
            isinstance(self.micro_batch, bool)
            or not isinstance(self.micro_batch, int)
            or self.micro_batch < 0
        ):
            raise SpecError(f"action micro_batch={self.micro_batch!r} must be an integer >= 0")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.micro_batch}"

    @classmethod
    def trusted(cls, stage: int, kind: ActionKind, micro_batch: int) -> Action:
        """An Action from fields a schedule generator's own loops make (non-negative ints, a
        kind of ACTION_KINDS), without `__post_init__`'s checks: they cost over half of
        building 1F1B for 16 stages and 192 micro-batches (6,144 actions: 6.6 ms, 2.7 without)."""
        action = object.__new__(cls)
        object.__setattr__(action, "stage", stage)
        object.__setattr__(action, "kind", kind)
        object.__setattr__(action, "micro_batch", micro_batch)
        return action

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse ``"<stage><kind><micro_batch>"`` (e.g. ``"2B3"``), the inverse of `str`.

        Raises:
            SpecError: `text` is not of that form; the message quotes it.
        """
        match = _ACTION_RE.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise SpecError(
                f"cannot parse pipeline action {text!r}: expected <stage><kind><micro-batch> "
                f"with kind one of {', '.join(ACTION_KINDS)}, e.g. '2B3'"
            )
        stage, kind, micro_batch = match.groups()
        return cls(int(stage), kind, int(micro_batch))  # type: ignore[arg-type]


Schedule: TypeAlias = dict[int, list[Action | None]]
"""Per pipeline rank, its ordered actions; ``None`` is an idle slot."""


def parse_slot(value: Action | str | None) -> Action | None:
    """Turn one schedule entry (an Action, its string, or ``None``/``""`` for idle) into a slot."""
    if value is None or isinstance(value, Action):
        return value
    if isinstance(value, str):
        return None if value.strip() == "" else Action.parse(value)
    raise SpecError(f"pipeline action {value!r} must be a string like '0F1', an Action or null")


# ---------------------------------------------------------------------------------- CSV / grid


def schedule_to_csv(order: Mapping[int, Iterable[Action | None]]) -> str:
    """Write one CSV row per rank (rank 0 first), comma-separated actions, ``""`` for idle.

    The format is torch's `_dump_csv` format (one row per rank), so files are interchangeable.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for rank in sorted(order):
        writer.writerow(["" if a is None else str(a) for a in order[rank]])
    return buffer.getvalue()


def schedule_from_csv(text: str) -> Schedule:
    """Parse `schedule_to_csv` output: row i is rank i; empty cells are idle slots."""
    reader = csv.reader(io.StringIO(text))
    return {rank: [parse_slot(cell) for cell in row] for rank, row in enumerate(reader)}


def write_schedule_csv(order: Mapping[int, Iterable[Action | None]], path: str | Path) -> None:
    """Write `order` to `path` as CSV (see `schedule_to_csv`)."""
    Path(path).write_text(schedule_to_csv(order), encoding="utf-8")


def read_schedule_csv(path: str | Path) -> Schedule:
    """Read a schedule CSV written by `write_schedule_csv` (or torch's `_dump_csv`)."""
    return schedule_from_csv(read_user_text(path))


def format_schedule(
    order: Mapping[int, Iterable[Action | None]], error_step: int | None = None
) -> str:
    """Render `order` as a step (row) x rank (column) grid, marking `error_step` if given."""
    columns = {rank: ["" if a is None else str(a) for a in order[rank]] for rank in sorted(order)}
    num_steps = max((len(c) for c in columns.values()), default=0)
    label_width = len(f"step {max(num_steps - 1, 0)}")
    widths = {
        r: max([len(f"rank {r}")] + [len(s) for s in col]) for r, col in columns.items()
    }
    header = " " * (label_width + 2) + " ".join(f"{f'rank {r}':<{widths[r]}}" for r in columns)
    lines = [header.rstrip()]
    for step in range(num_steps):
        cells = " ".join(
            f"{(col[step] if step < len(col) else ''):<{widths[r]}}" for r, col in columns.items()
        )
        mark = "  <-- here" if step == error_step else ""
        lines.append(f"{f'step {step}':<{label_width}}: {cells}".rstrip() + mark)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- validation


def _rank_of(stage_to_rank: Mapping[int, int] | Callable[[int], int], stage: int) -> int | None:
    if callable(stage_to_rank):
        return stage_to_rank(stage)
    return stage_to_rank.get(stage)


def validate_schedule(
    order: Mapping[int, Iterable[Action | None]],
    num_stages: int,
    num_micro_batches: int,
    stage_to_rank: Mapping[int, int] | Callable[[int], int],
) -> None:
    """Check that `order` is a complete, well-ordered pipeline schedule.

    Rules (those of torch's `_validate_schedule`, plus placement): every (stage, micro-batch)
    has exactly one F and either one B or one I and one W; on its rank, F comes before B/I and
    I before W; every action sits on the rank that owns its stage.

    Raises:
        SpecError: the first rule broken, with the step x rank grid and the bad step marked.
    """
    grid = {rank: list(order[rank]) for rank in order}

    def fail(message: str, rank: int | None = None, step: int | None = None) -> SpecError:
        where = f"rank {rank}, step {step}: " if rank is not None else ""
        return SpecError(f"{where}{message}\n{format_schedule(grid, error_step=step)}")

    seen: dict[tuple[int, int], dict[str, int]] = {}
    for rank in sorted(grid):
        for step, action in enumerate(grid[rank]):
            if action is None:
                continue
            if not isinstance(action, Action):
                raise fail(f"{action!r} is not an Action", rank, step)
            if action.stage >= num_stages:
                raise fail(f"{action} uses stage {action.stage} >= num_stages={num_stages}",
                           rank, step)
            if action.micro_batch >= num_micro_batches:
                raise fail(
                    f"{action} uses micro-batch {action.micro_batch} >= "
                    f"num_micro_batches={num_micro_batches}", rank, step)
            owner = _rank_of(stage_to_rank, action.stage)
            if owner != rank:
                raise fail(f"{action} runs on rank {rank} but stage {action.stage} belongs to "
                           f"rank {owner}", rank, step)
            done = seen.setdefault((action.stage, action.micro_batch), {})
            if action.kind in done:
                raise fail(f"{action} appears twice (first at step {done[action.kind]})",
                           rank, step)
            if action.kind in ("B", "I") and "F" not in done:
                raise fail(f"{action} runs before its forward "
                           f"{Action(action.stage, 'F', action.micro_batch)}", rank, step)
            if action.kind == "W" and "I" not in done:
                raise fail(f"{action} runs before its input backward "
                           f"{Action(action.stage, 'I', action.micro_batch)}", rank, step)
            if (action.kind == "B" and "I" in done) or (action.kind == "I" and "B" in done):
                raise fail(f"{action}: (stage {action.stage}, micro-batch {action.micro_batch}) "
                           f"mixes a full backward B with a split I/W", rank, step)
            done[action.kind] = step
    for stage in range(num_stages):
        for mb in range(num_micro_batches):
            done = seen.get((stage, mb), {})
            if "F" not in done:
                raise fail(f"missing forward {Action(stage, 'F', mb)}")
            if "B" not in done and not ("I" in done and "W" in done):
                missing = [str(Action(stage, k, mb)) for k in ("I", "W") if k not in done]
                what = " and ".join(missing) if "I" in done or "W" in done else (
                    f"{Action(stage, 'B', mb)} (or {Action(stage, 'I', mb)} and "
                    f"{Action(stage, 'W', mb)})")
                raise fail(f"missing backward {what}")


def infer_stage_to_rank(order: Mapping[int, Iterable[Action | None]]) -> dict[int, int]:
    """Map each stage to the rank whose list holds it.

    Raises:
        SpecError: a stage appears on two ranks.
    """
    mapping: dict[int, int] = {}
    for rank in sorted(order):
        for step, action in enumerate(order[rank]):
            if action is None:
                continue
            owner = mapping.setdefault(action.stage, rank)
            if owner != rank:
                raise SpecError(
                    f"rank {rank}, step {step}: {action} puts stage {action.stage} on rank "
                    f"{rank}, but rank {owner} also runs it; a stage lives on one rank\n"
                    + format_schedule(order, error_step=step)
                )
    return dict(sorted(mapping.items()))
