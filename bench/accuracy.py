"""Accuracy against published training runs (issue 13, item 8): how far trainsim is off.

Runs `api.accuracy` over ../shared/data/published/training_runs.csv (or `--csv FILE`) and
prints what `sim accuracy` prints — predicted vs published per row, MAPE and mean signed error
per GPU generation, framework and source, the rows trainsim cannot express yet — then a
leave-one-source-out table: for each source S, the error on S's rows when the calibration is
fitted without S, so a fit is judged on data it has not seen.

`leave_one_source_out` takes the fit as a callable, `fit(rows) -> Calibration | None`. No fit to
published runs exists in trainsim yet (`sim calibrate` fits DVFS to Perseus' profiles only), so
the default is the identity: no coefficients, the catalog's values — the held-out error is
then the plain error, and a line says so. Plug a real fit in with `leave_one_source_out(...,
fit=my_fit)`.

`--quick` keeps the runs on at most 64 GPUs (a line says how many rows that leaves out).

Usage: ``python bench/accuracy.py [--quick] [--csv FILE] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainsim import api
from trainsim.commands.accuracy import print_report
from trainsim.commands.output import print_table
from trainsim.hwmodels.calibration import Calibration
from trainsim.validate.published_runs import (
    REF_KINDS,
    AccuracyReport,
    PublishedRun,
    RowResult,
    read_runs,
)

QUICK_MAX_GPUS = 64
Fit = Callable[[Sequence[PublishedRun]], Calibration | None]


def identity_fit(rows: Sequence[PublishedRun]) -> Calibration | None:
    """No fit: the catalog's coefficients, whatever the training rows (the default)."""
    return None


def _errors(results: Sequence[RowResult], kind: str) -> dict[str, Any]:
    errors = [r.error for r in results if r.run.ref_kind == kind]
    if not errors:
        return {"rows": 0, "mape": None, "mean_signed_error": None}
    return {"rows": len(errors), "mape": sum(abs(e) for e in errors) / len(errors),
            "mean_signed_error": sum(errors) / len(errors)}


def leave_one_source_out(report: AccuracyReport, fit: Fit = identity_fit, *,
                         max_gpus: int | None = None) -> list[dict[str, Any]]:
    """For each source S: fit on every other source's rows, predict S's rows with that fit,
    and give their error per kind. A fit that returns None (no coefficients) predicts exactly
    what `report` did, so its rows are reused instead of simulated again."""
    runs = [r for r in read_runs(report.csv_path) if max_gpus is None or r.gpus <= max_gpus]
    out = []
    for source in sorted({r.source for r in runs}):
        calibration = fit([r for r in runs if r.source != source])
        if calibration is None:
            held = [r for r in report.results if r.run.source == source]
        else:
            held = api.accuracy(report.csv_path, sources={source}, max_gpus=max_gpus,
                                calibration=calibration).results
        out.append({"held_out": source, "fitted": calibration is not None,
                    **{kind: _errors(held, kind) for kind in REF_KINDS}})
    return out


def _pct(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else f"{100 * value:{'+' if signed else ''}.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"only runs on at most {QUICK_MAX_GPUS} GPUs")
    ap.add_argument("--csv", type=Path, default=None, help="published runs CSV (default: "
                    "the reference data's published/training_runs.csv)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if not sys.stdout.isatty():
        os.environ.setdefault("COLUMNS", "200")  # rich would cut piped tables at 80 columns
    max_gpus = QUICK_MAX_GPUS if args.quick else None
    report = api.accuracy(args.csv, max_gpus=max_gpus)
    loso = leave_one_source_out(report, identity_fit, max_gpus=max_gpus)
    if args.json:
        print(json.dumps({**report.to_dict(), "leave_one_source_out": loso}, indent=2))
        return 0
    if max_gpus is not None:
        left = sum(r.gpus > max_gpus for r in read_runs(report.csv_path))
        print(f"--quick: runs on at most {max_gpus} GPUs ({left} rows on more left out)")
    print_report(report)
    if not any(r["fitted"] for r in loso):
        print("leave-one-source-out: no calibration fit to published runs exists yet, so the fit "
              "is the identity (catalog coefficients); held-out errors equal the plain errors")
    print_table("leave-one-source-out (fit without S, error on S's rows)",
                ["held-out source S", "fitted", "tokens/s rows", "MAPE", "mean signed",
                 "memory rows", "memory MAPE", "memory mean signed"],
                [[r["held_out"], "yes" if r["fitted"] else "no (identity)",
                  *(v for kind in REF_KINDS for v in (
                      str(r[kind]["rows"]), _pct(r[kind]["mape"]),
                      _pct(r[kind]["mean_signed_error"], signed=True)))] for r in loso],
                right=("tokens/s rows", "MAPE", "mean signed", "memory rows", "memory MAPE",
                       "memory mean signed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
