"""Small CLI runs whose JSON output must stay byte-identical across refactors.

`python tests/golden_cases.py --write` records them into tests/data/golden/; the test
`tests/test_golden_outputs.py` runs the same commands and compares. Wall-clock fields
(search_s, elapsed_s, planner_s) are dropped: they are the only figures that differ run to run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "data" / "golden"
TIMING_KEYS = frozenset({"search_s", "elapsed_s", "planner_s"})

ENERGY_CSV = "stage,instruction,frequency,time,energy\n" + "".join(
    f"{s},{inst},{f},{t},{e}\n"
    for s in (0, 1)
    for inst, base, ebase in (("forward", 0.002, 1.0), ("backward", 0.004, 2.0))
    for f, t, e in ((1410, base, ebase), (1200, base + 0.001, ebase * 0.8),
                    (1000, base + 0.002, ebase * 0.7)))

CASES: dict[str, list[str]] = {
    "simulate_pp2_dp2": ["simulate", "--model", "gpt3-350m", "--cluster", "4xV100-SXM2-32GB",
                         "--pp", "2", "--dp", "2", "--global-batch", "16", "--json"],
    "simulate_tp2_unfold_simpy": ["simulate", "--model", "gpt3-125m", "--cluster",
                                  "2x2xA100-SXM4-40GB", "--tp", "2", "--dp", "2",
                                  "--global-batch", "8", "--recompute", "selective",
                                  "--engine", "simpy", "--unfold", "--json"],
    "simulate_interleaved_zero": ["simulate", "--model", "llama2-7b", "--cluster",
                                  "1x8xA100-SXM4-80GB+1x4xA10", "--pp", "4", "--dp", "3",
                                  "--schedule", "interleaved", "--virtual-stages", "2",
                                  "--zero", "1", "--global-batch", "24", "--freq-mhz", "1200",
                                  "--allow-oom", "--json"],
    "simulate_cpu_profile": ["simulate", "--model", "tiny-gpt", "--cluster", "cpu:2",
                             "--profile", "traces/profile.csv", "--dp", "2", "--json"],
    "search_grid": ["search", "--method", "grid", "--model", "gpt3-125m", "--cluster",
                    "4xV100-SXM2-32GB", "--global-batch", "8", "--top", "3", "--json"],
    "search_aceso": ["search", "--method", "aceso", "--model", "gpt3-125m", "--cluster",
                     "4xV100-SXM2-32GB", "--global-batch", "8", "--memory-limit-gb", "8",
                     "--time-budget-s", "60", "--top", "3", "--json"],
    "energy_frontier_csv": ["energy", "frontier", "--profile", "{csv}", "--microbatches", "3",
                            "--blocking-power-w", "10", "--json"],
    "energy_frontier_model": ["energy", "frontier", "--model", "gpt3-125m", "--cluster",
                              "2xA100-SXM4-80GB", "--pp", "2", "--microbatches", "3",
                              "--unit-s", "0.0001", "--json"],
    "validate_dp2": ["validate", "traces/tiny-gpt-dp2.json", "--profile", "traces/profile.csv",
                     "--json"],
    "validate_pp2": ["validate", "traces/tiny-gpt-pp2.json", "--profile", "traces/profile.csv",
                     "--json"],
}


def _strip(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in TIMING_KEYS}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


def run_case(name: str, tmp: Path) -> str:
    """Run one case through the CLI in-process and return its canonical JSON text."""
    import contextlib
    import io
    import os

    from trainsim.cli import main

    csv = tmp / "energy.csv"
    csv.write_text(ENERGY_CSV)
    args = [a.replace("{csv}", str(csv)) for a in CASES[name]]
    buf = io.StringIO()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(buf):
            try:
                main(args)
            except SystemExit as exc:
                if exc.code not in (0, None):
                    raise RuntimeError(f"{name}: exit {exc.code}") from exc
    finally:
        os.chdir(cwd)
    doc = _strip(json.loads(buf.getvalue()))
    return json.dumps(doc, indent=1, sort_keys=True).replace(str(tmp), "TMP") + "\n"


if __name__ == "__main__":
    import tempfile
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/golden_cases.py --write")
    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for case in CASES:
            (GOLDEN / f"{case}.json").write_text(run_case(case, Path(d)))
            print("wrote", case)
