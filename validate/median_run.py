"""Pick the median of several recordings of one trace (traces/record.sh).

The CI machine kind's speed drifts by up to 2× within minutes (traces/README.md), so one
recording of a trace can land in a slow spell that the reference GEMM at its ends does not
see. record.sh therefore records every trace three times, interleaved with the others (a
minute or so apart), and keeps the recording whose median iteration time is the median of the
three: chosen by the measurement alone, before any prediction is made.

Usage: ``python -m trainsim.validate.median_run OUT RUN1 RUN2 RUN3`` copies the median run to
OUT and prints the runs' medians.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from trainsim.errors import TraceError
from trainsim.validate.trace_record import MeasuredTrace


def median_run(paths: list[Path]) -> Path:
    """The path whose trace's median iteration time is the median of all (the lower middle one
    for an even count).

    Raises:
        TraceError: no paths, or a file is not a trace.
    """
    if not paths:
        raise TraceError("median_run: no recordings given")
    ranked = sorted(paths, key=lambda p: MeasuredTrace.load(p).iteration_time_s)
    return ranked[(len(ranked) - 1) // 2]


def main(argv: list[str] | None = None) -> int:
    """Copy the median run to OUT; 2 on bad input or an existing OUT (nothing is
    overwritten)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m trainsim.validate.median_run OUT RUN [RUN ...]", file=sys.stderr)
        return 2
    out, runs = Path(args[0]), [Path(a) for a in args[1:]]
    if out.exists():
        print(f"error: {out} exists; remove it first", file=sys.stderr)
        return 2
    try:
        medians = {r: MeasuredTrace.load(r).iteration_time_s for r in runs}
        chosen = median_run(runs)
    except (TraceError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in runs:
        mark = "  <- kept" if r == chosen else ""
        print(f"{r}: median iteration {1e3 * medians[r]:.2f} ms{mark}")
    shutil.copyfile(chosen, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
