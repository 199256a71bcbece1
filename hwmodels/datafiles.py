"""Strict loading of the hardware catalog's JSON data files.

Calculon's habit (STYLE.md): each data file is compared key by key against the keys the code
expects, so a typo in a data file fails loudly with the file and the field named, instead of
silently falling back to a default. Units live in the key names and are converted to SI once,
here or in the module that owns the record.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from trainsim.errors import DataFileError, UnknownNameError, unknown_name

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Folder holding gpus.json, nodes.json, nics.json, prices.json, power.json, efficiency.json."""

GIB_BYTES = 1024**3
"""Bytes in one GiB (memory sizes are given in binary GiB)."""

GB_BYTES = 1e9
"""Bytes in one (decimal) GB, the unit of every *_gbps bandwidth."""

GBIT_BYTES = 1e9 / 8
"""Bytes in one gigabit, the unit of every *_gbitps NIC rate."""

MHZ_HZ = 1e6
"""Hertz in one MHz."""

TFLOPS_FLOPS = 1e12
"""FLOP/s in one TFLOP/s."""


@cache
def load_json(name: str) -> dict[str, Any]:
    """Load `hwmodels/data/<name>` once and return its top-level object (do not mutate it)."""
    path = DATA_DIR / name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise DataFileError(f"{path}: data file missing") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFileError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise DataFileError(f"{path}: top level must be an object")
    return data


def check_keys(
    where: str,
    record: Mapping[str, Any],
    required: Iterable[str],
    optional: Iterable[str] = (),
) -> None:
    """Raise DataFileError unless `record` has every required key and nothing unexpected.

    Args:
        where: file and record path for the message, e.g. ``"gpus.json: gpus.A10"``.
        record: the mapping read from the file.
        required: keys that must be present.
        optional: keys that may be present.
    """
    if not isinstance(record, Mapping):
        raise DataFileError(f"{where}: expected an object, got {type(record).__name__}")
    required = set(required)
    allowed = required | set(optional)
    missing = sorted(required - record.keys())
    if missing:
        raise DataFileError(f"{where}: missing field(s) {', '.join(missing)}")
    extra = sorted(set(record) - allowed)
    if extra:
        raise DataFileError(
            f"{where}: unexpected field(s) {', '.join(extra)} (allowed: {', '.join(sorted(allowed))})"
        )


def number(where: str, field: str, value: Any, *, positive: bool = True) -> float:
    """Return `value` as float, raising DataFileError naming `field` if it is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DataFileError(f"{where}: field {field}={value!r} is not a number")
    if positive and not value > 0:
        raise DataFileError(f"{where}: field {field}={value!r} must be > 0")
    return float(value)


def unknown(kind: str, name: str, valid: Iterable[str]) -> UnknownNameError:
    """Like `trainsim.errors.unknown_name`, but names that start with `name` are suggested first.

    difflib alone answers 'A100' with 'A10, A40'; a capacity planner typing a family name
    wants its variants (A100-SXM4-40GB, ...).
    """
    valid = sorted(valid)
    err = unknown_name(kind, name, valid)
    lowered = name.strip().lower()
    prefixed = [v for v in valid if v.lower().startswith(lowered) and v.lower() != lowered]
    if not lowered or not prefixed:
        return err
    listing = ", ".join(valid) if len(valid) <= 12 else ", ".join(valid[:12]) + ", ..."
    hint = ", ".join(prefixed[:4])
    return UnknownNameError(f"unknown {kind} {name!r}; did you mean {hint}? (valid: {listing})")
