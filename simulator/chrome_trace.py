"""Chrome trace export: a SimResult as Trace Event Format JSON, opened by Perfetto or about:tracing.

Follows the Trace Event Format (Google, "Trace Event Format" document): the JSON object form
`{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}` with

* complete events (`ph: "X"`: name, cat, ts, dur, pid, tid, args) — one per task and member
  rank; `pid` is the rank, `tid` the stream (1 = compute, 2 = tp, 3 = pp, 4 = dp, then other
  streams alphabetically), `ts`/`dur` in microseconds rounded to the nanosecond;
* metadata events (`ph: "M"`): `process_name` "rank N (GPU)" and `thread_name` per stream, with
  `process_sort_index` / `thread_sort_index` so ranks and streams keep their order;
* counter events (`ph: "C"`): `memory` (bytes) and `power` (W) per rank, one per instant.

GPU names come from `program.info.gpu_names` (one per program rank) or `program.info.gpu_name`
(all ranks). `ranks` keeps only some ranks (the CLI's `--trace-ranks`; past
`timeline_groups.GROUP_THRESHOLD` ranks it defaults to one representative rank per rank group,
each process named for the group it stands for); `otherData` then says how many ranks the
trace holds of how many. Output is deterministic: events in a fixed order and
keys sorted, so the same result always gives byte-identical JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainsim.simulator.own_files import make_parent
from trainsim.simulator.program import CONVENTIONAL_STREAMS, stream_display_order
from trainsim.simulator.result import SimResult
from trainsim.simulator.timeline_groups import gpu_name, program_rank_of

__all__ = ["chrome_trace_json", "gpu_name", "to_chrome_trace", "write_chrome_trace"]


def _us(seconds: float) -> float:
    """Seconds to microseconds, rounded to the nanosecond (stable text, no float noise)."""
    return round(float(seconds) * 1e6, 3)


def to_chrome_trace(
    result: SimResult,
    *,
    ranks: Sequence[int] | None = None,
    notes: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """Return the trace as a JSON-ready dict (see the module docstring for its layout).

    Args:
        result: the simulated iteration.
        ranks: result ranks to keep (default all).
        notes: text appended to a rank's process name ("stage 3 · 640 GPUs").
    """
    frame = result.tasks
    records = result.ranks
    memory, power = result.memory_timeline, result.power_timeline
    if ranks is not None:
        keep = {int(r) for r in ranks}
        frame = frame[frame["rank"].isin(keep)]
        records = [rec for rec in records if rec.rank in keep]
        memory = memory[memory["rank"].isin(keep)]
        power = power[power["rank"].isin(keep)]
    # Fixed tids for the conventional streams (1 compute, 2 tp, 3 pp, 4 dp), then the others.
    tid_of = {name: i + 1 for i, name in enumerate(CONVENTIONAL_STREAMS)}
    others = [s for s in stream_display_order(frame["stream"].unique()) if s not in tid_of]
    tid_of.update({name: len(CONVENTIONAL_STREAMS) + 1 + i for i, name in enumerate(others)})
    # Physical rank -> program rank (identity unless the result was expanded).
    program_rank = program_rank_of(result)
    events: list[dict[str, Any]] = []
    for rec in records:
        label = f"rank {rec.rank}"
        gpu = gpu_name(result, program_rank[rec.rank])
        if gpu:
            label += f" ({gpu})"
        if len(rec.represents) > 1:
            label += f" x{len(rec.represents)} folded"
        if notes and rec.rank in notes:
            label += f" · {notes[rec.rank]}"
        events.append(
            {"ph": "M", "name": "process_name", "pid": rec.rank, "tid": 0, "args": {"name": label}}
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": rec.rank,
                "tid": 0,
                "args": {"sort_index": rec.rank},
            }
        )
    pairs = sorted(
        {(int(r), s) for r, s in zip(frame["rank"], frame["stream"], strict=True)},
        key=lambda rs: (rs[0], tid_of[rs[1]]),
    )
    for rank, stream in pairs:
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": rank,
                "tid": tid_of[stream],
                "args": {"name": stream},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": rank,
                "tid": tid_of[stream],
                "args": {"sort_index": tid_of[stream]},
            }
        )

    rows = frame.assign(trace_tid=frame["stream"].map(tid_of)).sort_values(
        ["rank", "trace_tid", "start_s", "task_id"], kind="stable"
    )
    for row in rows.itertuples(index=False):
        ts = _us(row.start_s)
        args: dict[str, Any] = {"task_id": int(row.task_id), "kind": row.kind}
        if row.micro_batch >= 0:
            args["micro_batch"] = int(row.micro_batch)
        if row.stage >= 0:
            args["stage"] = int(row.stage)
        if row.first_layer >= 0:
            args["layers"] = f"{int(row.first_layer)}-{int(row.last_layer)}"
        if row.comm_bytes > 0:
            args["bytes"] = float(row.comm_bytes)
        if not math.isnan(row.freq_mhz):
            args["freq_mhz"] = float(row.freq_mhz)
        if row.power_w > 0:
            args["power_w"] = float(row.power_w)
        events.append(
            {
                "ph": "X",
                "name": row.name,
                "cat": row.kind,
                "pid": int(row.rank),
                "tid": int(row.trace_tid),
                "ts": ts,
                "dur": round(_us(row.end_s) - ts, 3),
                "args": args,
            }
        )
    for timeline, counter, key, column in (
        (memory, "memory", "bytes", "bytes"),
        (power, "power", "watts", "power_w"),
    ):
        owners = timeline["rank"].to_numpy()
        times = timeline["time_s"].to_numpy()
        values = timeline[column].to_numpy()
        for i in range(len(timeline)):
            last_at_instant = (
                i + 1 == len(timeline) or owners[i + 1] != owners[i] or times[i + 1] != times[i]
            )
            if last_at_instant:
                events.append(
                    {
                        "ph": "C",
                        "name": counter,
                        "pid": int(owners[i]),
                        "tid": 0,
                        "ts": _us(times[i]),
                        "args": {key: float(values[i])},
                    }
                )
    summary = result.to_summary_dict()
    summary.pop("per_rank")
    if ranks is not None:
        summary["ranks_in_trace"] = len(records)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "trainsim", **summary},
    }


def chrome_trace_json(
    result: SimResult,
    *,
    ranks: Sequence[int] | None = None,
    notes: Mapping[int, str] | None = None,
) -> str:
    """The trace as JSON text (sorted keys; byte-identical for identical results)."""
    return (
        json.dumps(to_chrome_trace(result, ranks=ranks, notes=notes), sort_keys=True, separators=(",", ":"), allow_nan=False)
        + "\n"
    )


def write_chrome_trace(
    result: SimResult,
    path: str | Path,
    *,
    ranks: Sequence[int] | None = None,
    notes: Mapping[int, str] | None = None,
) -> Path:
    """Write the trace to `path` (open it at https://ui.perfetto.dev) and return the path.

    `ranks` keeps only those result ranks (default all); `notes` extends their process names."""
    path = Path(path)
    make_parent(path).write_text(chrome_trace_json(result, ranks=ranks, notes=notes),
                                 encoding="utf-8")
    return path
