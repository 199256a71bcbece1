"""What-if sweeps (`sim sweep`): models × clusters × plans or planners × knobs, one Parquet
table with one row per scenario, resumable, on local processes or a Ray cluster.

* `spec.py`: the YAML schema, its up-front checks, the expansion into scenarios and their
  content hashes (the resume keys);
* `runner.py`: one scenario's row (failures are rows too), the table, checkpoints, resume;
* `executors.py`: local worker processes or Ray (an optional extra);
* `report.py`: the plotly dashboard (`sim sweep report`).

`trainsim.api.sweep` and `trainsim.api.sweep_report` are the entry points.
"""

from __future__ import annotations

from trainsim.search.sweep.executors import EXECUTORS, RAY_INSTALL, make_executor
from trainsim.search.sweep.report import write_report
from trainsim.search.sweep.runner import SweepRun, read_table, run_sweep, table_rows
from trainsim.search.sweep.spec import (
    EXAMPLE_NAME,
    EXAMPLE_SPEC,
    MAX_SCENARIOS,
    Scenario,
    SweepSpec,
    load_spec,
)

__all__ = ["EXAMPLE_NAME", "EXAMPLE_SPEC", "EXECUTORS", "MAX_SCENARIOS", "RAY_INSTALL",
           "Scenario", "SweepRun", "SweepSpec", "load_spec", "make_executor", "read_table",
           "run_sweep", "table_rows", "write_report"]
