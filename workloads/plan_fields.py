"""Field checks for ParallelPlan: each turns a JSON-like value into the declared type or
raises a PlanError naming the field, the value and what was expected (workloads/plan.py)."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping
from typing import Any, cast

from trainsim.errors import PlanError

_NOT_LISTS = (str, bytes, Mapping, set, frozenset)

ACTION_KEY_KINDS = ("F", "B", "I", "W")
"""Pass kinds of a pipeline action: forward, full backward, input-grad and weight-grad halves."""
_ACTION_KEY = re.compile(r"^(\d+)([FBIW])(\d+)$")


def _int(name: str, value: Any, expected: str = "a positive integer",
         minimum: int | None = 1) -> int:
    """`value` as an int (bools and floats are refused), at least `minimum`, else a PlanError."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
            and (minimum is None or int(value) >= minimum):
        return int(value)
    raise PlanError(f"plan.{name}={value!r} must be {expected}")


def _mhz(name: str, value: Any) -> float:
    """A positive, finite frequency in MHz (int or float; bools and strings are refused)."""
    as_given = type(value) in (int, float)  # kept as given (an int stays one)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            as_float = float(value)
        except OverflowError:  # a 400-digit integer
            as_float = math.inf
        if 0 < as_float < math.inf:
            return cast(float, value) if as_given else as_float
    raise PlanError(f"plan.{name}={value!r} must be a positive frequency in MHz, e.g. 1200")


def _text(name: str, value: Any, expected: str) -> str:
    if isinstance(value, str):
        return value
    raise PlanError(f"plan.{name}={value!r} must be {expected}")


def _action_key(name: str, key: str) -> str:
    """`key` if it names a pipeline action ``<stage><kind><micro-batch>`` ("2F3": stage 2
    forward of micro-batch 3), else a PlanError naming the field.

    A plan keys per-instruction settings by the strings schedule actions print as, so this is
    the grammar of `trainsim.simulator.actions.Action.parse`. Workloads sit below the simulator
    and do not import it: the grammar is stated here too, and tests/simulator/test_actions.py
    holds the two to the same answers and messages.
    """
    if isinstance(key, str) and _ACTION_KEY.match(key.strip()):
        return key
    raise PlanError(f"plan.{name} key {key!r} is not an action like '2F3' (stage 2 forward of "
                    f"micro-batch 3): cannot parse pipeline action {key!r}: expected "
                    f"<stage><kind><micro-batch> with kind one of {', '.join(ACTION_KEY_KINDS)}, "
                    f"e.g. '2B3'")


def action_stage(key: str) -> int:
    """The (virtual) stage an action key names ("2F3" -> 2); the key was checked
    (`_action_key`)."""
    found = _ACTION_KEY.match(key.strip())
    if found is None:
        raise PlanError(f"{key!r} is not an action like '2F3'")
    return int(found.group(1))


def _items(name: str, value: Any, expected: str) -> tuple[Any, ...]:
    """A list/tuple (any ordered iterable but a string or a mapping) as a tuple."""
    if isinstance(value, _NOT_LISTS) or not isinstance(value, Iterable):
        raise PlanError(f"plan.{name}={value!r} must be {expected}")
    return tuple(value)


def _pairs(name: str, value: Any, expected: str) -> tuple[tuple[str, Any], ...]:
    """A mapping, or a list of [key, value] lists, as (key, value) pairs; later keys win."""
    if isinstance(value, Mapping):
        items = tuple(value.items())
    else:
        items = _items(name, value, expected)
        if not all(isinstance(p, list | tuple) and len(p) == 2 for p in items):
            raise PlanError(f"plan.{name}={value!r} must be {expected}")
    for key, _ in items:
        if not isinstance(key, str):
            raise PlanError(f"plan.{name}={value!r}: key {key!r} is not a string; "
                            f"plan.{name} must be {expected}")
    return tuple(dict(items).items())


def _names(name: str, value: Any) -> tuple[str, ...]:
    """A non-string list of op names."""
    names = _items(name, value, "none, selective, full or a list of op names")
    for i, n in enumerate(names):
        _text(f"{name}[{i}]", n, "an op name (a string)")
    return names


def _divisors(n: int) -> list[int]:
    """Divisors of n, ascending (those up to 10^5 and their cofactors, so it stays fast for
    any n a plan file can hold; complete for n <= 10^10)."""
    small = [d for d in range(1, min(math.isqrt(max(n, 0)), 10**5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _global_batch_hint(global_batch: int, micro_batch_size: int, dp: int) -> str:
    """Why `global_batch` does not split into micro-batches of micro_batch_size × dp samples,
    and the nearest global batches that would (at least one, never an empty list)."""
    per_step = micro_batch_size * dp
    if global_batch < per_step:
        fewer = [*(["fewer data-parallel replicas (dp)"] if dp > 1 else []),
                 *(["a smaller micro_batch_size"] if micro_batch_size > 1 else [])]
        return (f"plan.global_batch={global_batch} is smaller than micro_batch_size×dp="
                f"{per_step} ({micro_batch_size}×{dp}): one micro-batch per replica already "
                f"holds more samples; use global_batch ≥ {per_step}, e.g. {per_step}, "
                f"{2 * per_step}, or {' or '.join(fewer)}")
    below = global_batch // per_step * per_step
    valid = [b for b in (below - per_step, below, below + per_step, below + 2 * per_step)
             if b >= per_step and abs(b - global_batch) <= 2 * per_step][:3]
    return (f"plan.global_batch={global_batch} is not divisible by micro_batch_size×dp="
            f"{micro_batch_size}×{dp}={per_step} (e.g. {', '.join(map(str, valid))} would be)")
