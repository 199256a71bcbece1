"""Pipeline schedules as per-rank action orders: GPipe, 1F1B, interleaved 1F1B, ZB-H1, explicit.

Every builder returns a `Schedule` -- `dict[rank, list[Action | None]]` -- for ``p`` pipeline
ranks and ``m`` micro-batches. Orders are compact (no idle slots): bubbles arise when the
lowering or `schedule_dryrun.dry_run` honours the dependencies. Stage ``s`` of a one-stage-per-rank
schedule lives on rank ``s``; interleaved schedules put virtual stage ``c·p + r`` on rank ``r``
(chunk ``c``), as Megatron-LM does; `infer_stage_to_rank` recovers the placement of any order.

`get_schedule(name)` maps a user-facing name to a builder with the uniform signature
``(num_ranks, num_micro_batches, stages_per_rank=1) -> Schedule``; ``"torch:<ClassName>"`` reads
the order PyTorch itself generates (`trainsim.simulator.torch_schedules`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeAlias

from trainsim.errors import DataFileError, SpecError, read_user_text, unknown_name
from trainsim.simulator.actions import (
    Action,
    Schedule,
    format_schedule,
    infer_stage_to_rank,
    parse_slot,
    read_schedule_csv,
    validate_schedule,
)
from trainsim.simulator.cyclic_schedule import capped_cyclic, parse_cyclic_name, wait_free_cyclic
from trainsim.simulator.schedule_dryrun import DryRun, dry_run, peak_in_flight, unit_time_makespan
from trainsim.simulator.torch_schedules import from_torch, resolve_class_name

_act = Action.trusted
"""The generators below make their actions from `_check_sizes`-checked sizes and their own
loops, so they skip `Action`'s checks."""

__all__ = [
    "DryRun", "ScheduleBuilder", "dry_run", "explicit", "get_schedule", "gpipe",
    "interleaved_1f1b", "load_explicit", "one_f_one_b", "peak_in_flight", "schedule_names",
    "schedule_to_json", "unit_time_makespan", "zb_h1",
]

ScheduleBuilder: TypeAlias = Callable[..., Schedule]
"""``builder(num_ranks, num_micro_batches, stages_per_rank=1) -> Schedule``."""


def _check_sizes(p: int, m: int) -> None:
    for name, value in (("num_ranks", p), ("num_micro_batches", m)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"schedule {name}={value!r} must be an integer >= 1")


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019, "GPipe", Fig. 2c): all forwards, then all backwards.

    Rank ``r`` runs ``rF0 … rF(m-1)`` then ``rB0 … rB(m-1)``; the backwards go in micro-batch
    order, as torch's `ScheduleGPipe` runs them (reverse order gives the same makespan). Every
    rank holds the activations of all ``m`` micro-batches at the turn.
    """
    _check_sizes(p, m)
    return {
        r: [*(_act(r, "F", j) for j in range(m)), *(_act(r, "B", j) for j in range(m))]
        for r in range(p)
    }


def one_f_one_b(p: int, m: int) -> Schedule:
    """PipeDream-Flush / Megatron-LM 1F1B (Narayanan et al. 2021, SC'21, §2.2.1 and Fig. 4 top).

    Megatron's `forward_backward_pipelining_without_interleaving`: rank ``r`` runs
    ``w = min(p − r − 1, m)`` warm-up forwards, then ``m − w`` steady pairs "forward j+w, backward
    j", then ``w`` cool-down backwards. At most ``min(p − r, m)`` micro-batches are in flight.
    """
    _check_sizes(p, m)
    order: Schedule = {}
    for r in range(p):
        warmup = min(p - r - 1, m)
        ops: list[Action | None] = [_act(r, "F", j) for j in range(warmup)]
        for j in range(m - warmup):
            ops += [_act(r, "F", warmup + j), _act(r, "B", j)]
        ops += [_act(r, "B", j) for j in range(m - warmup, m)]
        order[r] = ops
    return order


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Megatron-LM interleaved 1F1B (Narayanan et al. 2021, §2.2.2, Fig. 4 bottom).

    Rank ``r`` holds the ``v`` model chunks (virtual stages) ``r, r + p, …, r + (v−1)·p``.
    Megatron's `forward_backward_pipelining_with_interleaving` orders the ``v·m`` forward
    "virtual micro-batches" k = 0, 1, … of a rank in groups of ``p``: chunk ``(k mod p·v) // p``
    on micro-batch ``(k // (p·v))·p + k mod p``; backwards walk the chunks in reverse. Warm-up is
    ``min(2·(p − r − 1) + (v − 1)·p, v·m)`` forwards (current Megatron-core; early Megatron
    made every rank all-warm-up when ``m == p``, which holds more activations for the same
    makespan), then forward/backward pairs, then cool-down backwards. torch's
    `ScheduleInterleaved1F1B` generates the same order (idle slots aside). The bubble shrinks to
    ``(p − 1)/(v·m + p − 1)`` of the iteration (paper §2.2.2).

    Raises:
        SpecError: ``m`` is not a multiple of ``p`` (Megatron's rule), or ``v < 1``.
    """
    _check_sizes(p, m)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(f"interleaved schedule virtual stages v={v!r} must be an integer >= 1")
    if v == 1:
        return one_f_one_b(p, m)
    if m % p != 0:
        raise SpecError(
            f"interleaved 1F1B needs num_micro_batches to be a multiple of num_ranks "
            f"(Megatron's rule): m={m} is not divisible by p={p}; use m in "
            f"{[p * k for k in range(max(1, m // p), max(1, m // p) + 3)]}"
        )
    total = v * m
    group = p * v

    def virtual(k: int, kind: str, rank: int) -> Action:
        chunk = (k % group) // p
        if kind == "B":
            chunk = v - 1 - chunk
        micro_batch = (k // group) * p + k % p
        return _act(chunk * p + rank, kind, micro_batch)  # type: ignore[arg-type]

    order: Schedule = {}
    for r in range(p):
        warmup = min(2 * (p - r - 1) + (v - 1) * p, total)
        steady = total - warmup
        ops: list[Action | None] = [virtual(k, "F", r) for k in range(warmup)]
        for k in range(steady):
            ops += [virtual(warmup + k, "F", r), virtual(k, "B", r)]
        ops += [virtual(k, "B", r) for k in range(steady, total)]
        order[r] = ops
    return order


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 zero-bubble schedule (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §3.1, Fig. 3).

    The 1F1B skeleton with every backward split into I (input grads, critical path) and W
    (weight grads): rank ``r`` runs ``w = min(p − r − 1, m)`` warm-up forwards, then pairs
    "F j+w, I j", then the remaining I; rank ``r`` starts its W passes after ``r + 1`` I passes,
    then runs one W (oldest first) after each I, and the leftover W at the end. The deferred W
    fill the tail bubble of later ranks, so with F = I = W the bubble is about (p − 1)·(F + I − W)
    instead of 1F1B's (p − 1)·(F + B), while peak activations (held until W) stay at ``p`` micro-
    batches on every rank -- 1F1B's peak on rank 0, counted in micro-batches. In bytes a later
    rank can peak above 1F1B's: where its micro-batches hold more (the last stage keeps the LM
    head's logits; under full recompute, the recomputed activations) it holds p of them, not 1.
    The lowering frees a micro-batch's activations at its W, all of them. Freeing at I what
    only I needed would save little: W (dW = Xᵀ·dY) keeps every linear's input X and needs the
    output gradients dY that I computed, which 1F1B never holds. Per GPT layer (Korthikanti et
    al. 2022's bytes, 16-bit) the X are 14·sbh and the dY 18·sbh, against 34·sbh (+ 5·as²b
    without FlashAttention) kept: freeing at I and holding dY would save 2·sbh (plus the score
    terms), and at the head dY is the logits' gradient, as large as the logits. This is the
    order torch's `ScheduleInterleavedZeroBubble` generates with one stage per rank (its idle slots removed);
    tests/simulator/test_torch_schedules.py checks they agree.
    """
    _check_sizes(p, m)
    order: Schedule = {}
    for r in range(p):
        warmup = min(p - r - 1, m)
        ops: list[Action | None] = [_act(r, "F", j) for j in range(warmup)]
        next_w = 0
        for j in range(m):
            if j < m - warmup:
                ops.append(_act(r, "F", warmup + j))
            ops.append(_act(r, "I", j))
            if j >= r:
                ops.append(_act(r, "W", next_w))
                next_w += 1
        ops += [_act(r, "W", j) for j in range(next_w, m)]
        order[r] = ops
    return order


def explicit(
    order: Mapping[Any, Iterable[Action | str | None]],
    *,
    num_micro_batches: int | None = None,
    check_deadlock: bool = True,
) -> Schedule:
    """A user-given per-rank order, e.g. parsed from JSON ``{"0": ["0F0", "0F1", …], …}``.

    Keys are ranks (ints or digit strings, exactly 0..p−1); entries are action strings, Actions,
    or ``null``/``""`` for idle. The number of stages is the largest stage + 1, micro-batches the
    largest index + 1 unless given. The order is validated (`validate_schedule`) and, with
    `check_deadlock`, dry-run at unit times so a cyclic order is reported with its stuck ranks.

    Raises:
        SpecError: bad rank keys, unparsable actions, an invalid or deadlocking order.
    """
    result: Schedule = {}
    for key, actions in order.items():
        try:
            rank = int(key)
        except (TypeError, ValueError):
            raise SpecError(f"explicit schedule rank key {key!r} must be an integer") from None
        if isinstance(actions, str):
            raise SpecError(f"explicit schedule rank {rank}: expected a list of actions, "
                            f"got the string {actions!r}")
        result[rank] = [parse_slot(a) for a in actions]
    if sorted(result) != list(range(len(result))) or not result:
        raise SpecError(f"explicit schedule ranks {sorted(result)} must be exactly 0..p-1")
    result = dict(sorted(result.items()))
    actions_all = [a for ops in result.values() for a in ops if a is not None]
    if not actions_all:
        raise SpecError("explicit schedule has no actions")
    num_stages = max(a.stage for a in actions_all) + 1
    m = num_micro_batches if num_micro_batches is not None else (
        max(a.micro_batch for a in actions_all) + 1)
    validate_schedule(result, num_stages, m, infer_stage_to_rank(result))
    if check_deadlock:
        dry_run(result)
    return result


def load_explicit(path: str | Path) -> Schedule:
    """Load an explicit order from a JSON object ``{rank: [actions]}`` or a per-rank CSV.

    Raises:
        DataFileError: the file cannot be read or is not JSON/CSV of that shape.
    """
    path = Path(path)
    try:
        text = read_user_text(path)
    except OSError as exc:
        raise DataFileError(f"cannot read schedule file {str(path)!r}: {exc}") from exc
    if path.suffix.lower() == ".csv":
        return explicit(read_schedule_csv(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFileError(f"schedule file {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DataFileError(f"schedule file {str(path)!r} must hold an object {{rank: [actions]}}")
    return explicit(data)


def schedule_to_json(order: Mapping[int, Iterable[Action | None]]) -> str:
    """Serialise `order` as the JSON `explicit` reads (idle slots as ``null``), keys sorted."""
    data = {str(r): [None if a is None else str(a) for a in order[r]] for r in sorted(order)}
    return json.dumps(data, separators=(",", ":"))


# ------------------------------------------------------------------------------ name lookup


def _single_stage(builder: Callable[[int, int], Schedule], name: str) -> ScheduleBuilder:
    def build(num_ranks: int, num_micro_batches: int, stages_per_rank: int = 1) -> Schedule:
        if stages_per_rank != 1:
            raise SpecError(f"schedule {name!r} runs one stage per rank; got "
                            f"stages_per_rank={stages_per_rank} (use 'interleaved')")
        return builder(num_ranks, num_micro_batches)

    build.__name__ = builder.__name__
    build.__doc__ = builder.__doc__
    return build


def _interleaved(num_ranks: int, num_micro_batches: int, stages_per_rank: int = 1) -> Schedule:
    return interleaved_1f1b(num_ranks, num_micro_batches, stages_per_rank)


_BUILDERS: dict[str, ScheduleBuilder] = {
    "gpipe": _single_stage(gpipe, "gpipe"),
    "1f1b": _single_stage(one_f_one_b, "1f1b"),
    "interleaved": _interleaved,
    "interleaved_1f1b": _interleaved,
    "zb-h1": _single_stage(zb_h1, "zb-h1"),
    "zbh1": _single_stage(zb_h1, "zb-h1"),
    "cyclic": _single_stage(wait_free_cyclic, "cyclic"),  # DynaPipe (simulator/cyclic_schedule.py)
}


def schedule_names() -> list[str]:
    """The built-in schedule names (aliases included), sorted; plus any ``torch:<Class>``."""
    return sorted(_BUILDERS)


def get_schedule(name: str) -> ScheduleBuilder:
    """The builder for a schedule name: ``gpipe``, ``1f1b``, ``interleaved`` (alias
    ``interleaved_1f1b``), ``zb-h1`` (alias ``zbh1``), ``cyclic`` / ``cyclic-K`` (DynaPipe's
    wait-free cyclic order, capped at K micro-batches in flight) or ``torch:<ClassName>``.

    The builder is called as ``builder(num_ranks, num_micro_batches, stages_per_rank=1)``.

    Raises:
        UnknownNameError: an unknown name, listing the closest valid ones.
        SpecError: ``torch:<ClassName>`` names no supported torch class (they are listed).
    """
    key = name.strip()
    if key.lower().startswith("torch:"):
        return partial(from_torch, resolve_class_name(key.split(":", 1)[1]))
    cap = parse_cyclic_name(key)
    if cap is not None and cap is not False:  # "cyclic-K": at most K micro-batches in flight
        return _single_stage(capped_cyclic(cap), key)
    builder = _BUILDERS.get(key.lower())
    if builder is None:
        raise unknown_name("schedule", name, [*_BUILDERS, "torch:<ClassName>"])
    return builder


def describe(order: Mapping[int, Iterable[Action | None]]) -> str:
    """The step x rank grid of `order` (for logs and error messages)."""
    return format_schedule(order)
