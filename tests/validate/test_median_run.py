"""traces/record.sh keeps the median of three recordings of each trace (validate/median_run.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from trainsim.validate.median_run import main, median_run
from trainsim.validate.trace_record import MeasuredTrace


def _copies(traces_dir: Path, tmp_path: Path, scales: list[float]) -> list[Path]:
    """Copies of the DP2 trace with every iteration time scaled, one file per scale."""
    trace = MeasuredTrace.load(traces_dir / "tiny-gpt-dp2.json")
    out = []
    for i, k in enumerate(scales):
        data = json.loads((traces_dir / "tiny-gpt-dp2.json").read_text())
        data["iteration_times_s"] = [k * t for t in trace.iteration_times_s]
        data.pop("sha256", None)
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(data))
        out.append(path)
    return out


def test_the_median_run_is_kept(traces_dir: Path, tmp_path: Path) -> None:
    """Of runs 1.3x, 1.0x and 0.9x the recorded times, the 1.0x one (the middle argument) is the
    median; main copies it, and refuses (exit 2, no traceback) to overwrite an existing file,
    to run on no input or to read a missing run."""
    runs = _copies(traces_dir, tmp_path, [1.3, 1.0, 0.9])
    assert median_run(runs) == runs[1]
    assert median_run([runs[2], runs[0], runs[1]]) == runs[1]
    out = tmp_path / "kept.json"
    assert main([str(out), *map(str, runs)]) == 0
    assert out.read_bytes() == runs[1].read_bytes()
    assert main([str(out), *map(str, runs)]) == 2
    assert main([str(tmp_path / "x.json")]) == 2
    assert main([str(tmp_path / "y.json"), str(tmp_path / "missing.json")]) == 2
    with pytest.raises(Exception, match="no recordings"):
        median_run([])
    assert dataclasses.is_dataclass(MeasuredTrace.load(out))
