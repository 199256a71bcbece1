"""A measured trace is checked when it is loaded: types, durations, ranks vs the plan.

`sim validate` simulates the trace's plan and reads its ranks, so a hand-edited or corrupt
trace must fail at load with one TraceError naming the field, not deep in the comparison (a
ValueError traceback) or by simulating a different run (dp = 10^6 against 2 recorded ranks).
"""

from __future__ import annotations

import copy
import json

import pytest

from trainsim.cli import main
from trainsim.errors import TraceError
from trainsim.validate.trace_record import MeasuredTrace, import_kineto


@pytest.fixture
def good(traces_dir) -> dict:
    """The repository's recorded DP2 trace of tiny-gpt (2 ranks), freshly read."""
    return json.loads((traces_dir / "tiny-gpt-dp2.json").read_text())


def _edit(data: dict, path: str, value) -> dict:
    """`data` with the field at dotted `path` set to `value` (in place)."""
    keys = path.split(".")
    node = data
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


BAD = [
    ("ranks.0.compute_s", "x", "ranks[0].compute_s='x'"),
    ("ranks.1.dp_sync_s", -1.0, "ranks[1].dp_sync_s=-1.0"),
    ("plan.dp", 1000000, "= 1000000 ranks, but ranks records 2"),
    ("plan.tp", 0, "plan.tp=0"),
    ("plan.pp", 1.5, "plan.pp=1.5"),
    ("events", "x", "events='x' must be a JSON list"),
    ("events.0.dur_us", -5.0, "events[0].dur_us=-5.0"),
    ("events.0", 3, "events[0]=3"),
    ("ranks", [], "ranks is empty"),
    ("ranks", "x", "ranks='x' must be a JSON list"),
    ("ranks.0.stage", 1, "ranks[0].stage=1 must be an integer >= 0 and < 1"),
    ("ranks.0.kind_s", {"matmul": "fast"}, "ranks[0].kind_s['matmul']='fast'"),
    ("iteration_times_s", [0.1, float("inf")], "iteration_times_s[1]=inf"),
    ("model", 7, "model=7"),
]


def test_recorded_traces_pass(traces_dir) -> None:
    """The traces shipped in traces/ (DP2, PP2, TP2; 2 ranks each) load unchanged."""
    for name in ("dp2", "pp2", "tp2"):
        trace = MeasuredTrace.load(traces_dir / f"tiny-gpt-{name}.json")
        plan = trace.plan
        assert plan["dp"] * plan["tp"] * plan["pp"] == len(trace.ranks) == 2


@pytest.mark.parametrize(("path", "value", "message"), BAD)
def test_bad_field_is_a_trace_error_naming_it(good, path, value, message) -> None:
    """Each corruption raises TraceError whose message names the field and value."""
    with pytest.raises(TraceError) as info:
        MeasuredTrace.from_dict(_edit(good, path, value), "t.json")
    assert message in str(info.value)
    assert str(info.value).startswith("t.json:")


@pytest.mark.parametrize(("path", "value", "message"), BAD[:3])
def test_cli_bad_trace_exits_2_with_one_line(tmp_path, capsys, traces_dir, good, path, value,
                                             message) -> None:
    """`sim validate` on a corrupt trace prints one error line and exits 2 (no traceback)."""
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps(_edit(good, path, value)))
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(bad), "--profile", str(traces_dir / "profile.csv")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_kineto_import_lays_ranks_out_like_sim_trace(tmp_path) -> None:
    """A 2-pid Kineto file imported as tp2 gets ranks (stage 0, replica 0, tp 0) and
    (stage 0, replica 0, tp 1) — tp innermost as `sim trace` numbers its workers; imported
    as dp=1 (1 rank) against 2 pids it is refused."""
    ev = [{"ph": "X", "name": "aten::mm", "pid": pid, "tid": 1, "ts": 0.0, "dur": 10.0}
          for pid in (1, 2)]
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    plan = {"dp": 1, "tp": 2, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 1}
    trace = import_kineto(path, "micro-gpt", plan)
    assert [(r["stage"], r["replica"], r["tp_index"]) for r in trace.ranks] == [(0, 0, 0),
                                                                                 (0, 0, 1)]
    single = copy.deepcopy(plan)
    single["tp"] = 1
    with pytest.raises(TraceError, match="records 2"):
        import_kineto(path, "micro-gpt", single)
