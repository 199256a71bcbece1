"""The one family of errors a user can cause.

Everything a user can get wrong (an unknown GPU name, a malformed YAML file, an impossible
plan, a trace of the wrong format) raises a subclass of `TrainsimError`. The CLI turns any of
them into one line on stderr and exit code 2; library users catch them like any exception.
Messages name the offending field and value, and where they can, what would be valid.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from os import PathLike
from pathlib import Path


class TrainsimError(Exception):
    """Base class of every error caused by user input."""


class UnknownNameError(TrainsimError, KeyError):
    """A name (GPU, node, NIC, model, schedule, ...) that is not in its catalog."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DataFileError(TrainsimError):
    """A data file (YAML, JSON, CSV, config.json) that is malformed or misses a field."""


class SpecError(TrainsimError):
    """A short specification string (e.g. a cluster spec) that cannot be parsed."""


class PlanError(TrainsimError):
    """A parallel plan that cannot run on the given model and cluster."""


class SimulationError(TrainsimError):
    """A program that cannot finish (deadlock) or is otherwise inconsistent."""


class TraceError(TrainsimError):
    """A measured trace of the wrong format, truncated, or of an unknown model."""


def unknown_name(kind: str, name: str, valid: Iterable[str]) -> UnknownNameError:
    """Build an error for an unknown `name` of `kind` listing the closest valid names."""
    valid = sorted(valid)
    lowered = name.lower()
    # Names that start with what was typed come first ("A100" -> A100-PCIe-40GB, ...), then
    # names containing it, then spelling neighbours.
    close = [v for v in valid if v.lower().startswith(lowered)]
    close += [v for v in valid if lowered in v.lower() and v not in close]
    close += [v for v in difflib.get_close_matches(name, valid, n=3, cutoff=0.4) if v not in close]
    close = close[:3]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    listing = ", ".join(valid) if len(valid) <= 12 else ", ".join(valid[:12]) + ", ..."
    return UnknownNameError(f"unknown {kind} {name!r}{hint} (valid: {listing})")


def read_user_text(path: str | PathLike[str]) -> str:
    """A user's input file as UTF-8 text; one that is not names itself (a UnicodeDecodeError
    alone says neither which file nor which flag)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            f"give a text file") from None
