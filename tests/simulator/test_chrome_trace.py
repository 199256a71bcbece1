"""Chrome trace export: Trace Event Format structure, units, names, counters, determinism."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

from trainsim.simulator.chrome_trace import chrome_trace_json, to_chrome_trace, write_chrome_trace
from trainsim.simulator.engine_simpy import run_simpy
from trainsim.simulator.program import Program, ProgramInfo, Task
from trainsim.simulator.random_program import random_program

_METADATA_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def check_trace_event_format(trace: dict) -> None:
    """Check the fields the Trace Event Format requires per phase (JSON object form).

    X (complete): name, ph, ts, dur, pid, tid (numbers, ts/dur >= 0); M (metadata): a known name,
    pid, args.name (string) or args.sort_index (int), tid for thread ones; C (counter): name, ts,
    pid, args of numbers. Complete events on one thread must not overlap (Perfetto nests them).
    """
    assert isinstance(trace["traceEvents"], list)
    assert trace.get("displayTimeUnit", "ms") in {"ms", "ns"}
    named_threads, named_processes = set(), set()
    spans = defaultdict(list)
    for ev in trace["traceEvents"]:
        ph = ev["ph"]
        assert ph in {"X", "M", "C"}, ev
        assert isinstance(ev["name"], str) and ev["name"]
        assert isinstance(ev["pid"], int)
        if ph == "X":
            assert isinstance(ev["tid"], int)
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0
            assert isinstance(ev.get("args", {}), dict) and isinstance(ev.get("cat", ""), str)
            spans[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"]))
        elif ph == "M":
            assert ev["name"] in _METADATA_NAMES
            if ev["name"].endswith("_name"):
                assert isinstance(ev["args"]["name"], str)
            else:
                assert isinstance(ev["args"]["sort_index"], int)
            if ev["name"].startswith("thread"):
                assert isinstance(ev["tid"], int)
                if ev["name"] == "thread_name":
                    named_threads.add((ev["pid"], ev["tid"]))
            elif ev["name"] == "process_name":
                named_processes.add(ev["pid"])
        else:
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
            assert ev["args"] and all(isinstance(v, (int, float)) for v in ev["args"].values())
    for (pid, tid), intervals in spans.items():
        assert (pid, tid) in named_threads and pid in named_processes
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end - 1e-3


def _program() -> Program:
    return Program(
        num_ranks=2,
        tasks=[
            Task(
                name="s0.F0",
                kind="forward",
                ranks=(0,),
                stream="compute",
                duration_s=1.5,
                micro_batch=0,
                stage=0,
                first_layer=0,
                last_layer=3,
                freq_mhz=1410.0,
                power_w=300.0,
                mem_alloc_bytes=1000.0,
            ),
            Task(
                name="send0",
                kind="p2p",
                ranks=(0, 1),
                stream="pp",
                duration_s=0.0,
                comm_bytes=2e6,
                links=("nvl",),
                deps=(0,),
                micro_batch=0,
            ),
            Task(
                name="ar", kind="all_reduce", ranks=(0, 1), stream="dp", duration_s=0.25, deps=(1,)
            ),
        ],
        link_bandwidth_bytes_per_s={"nvl": 1e6},
        idle_power_w=[50.0, 50.0],
        info=ProgramInfo(gpu_names=("A100-SXM4-80GB", "V100-SXM2-32GB")),
    )


def test_trace_validates_against_the_trace_event_format() -> None:
    """A random program's trace has every field each phase requires, and threads don't overlap."""
    check_trace_event_format(to_chrome_trace(run_simpy(random_program(3, 4, 400))))
    check_trace_event_format(to_chrome_trace(run_simpy(_program())))


def test_complete_events_are_in_microseconds_with_rank_and_stream_ids() -> None:
    """The 1.5 s forward is an X event at ts 0, dur 1.5e6 µs on pid 0 / tid 1 (compute); the 2 MB
    transfer at 1 MB/s lasts 2e6 µs on tid 3 (pp) of both ranks; args carry kind, micro-batch,
    layers, bytes and frequency."""
    events = to_chrome_trace(run_simpy(_program()))["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    forward = next(e for e in complete if e["name"] == "s0.F0")
    assert (forward["pid"], forward["tid"], forward["ts"], forward["dur"]) == (0, 1, 0.0, 1.5e6)
    assert forward["args"] == {
        "task_id": 0,
        "kind": "forward",
        "micro_batch": 0,
        "stage": 0,
        "layers": "0-3",
        "freq_mhz": 1410.0,
        "power_w": 300.0,
    }
    sends = [e for e in complete if e["name"] == "send0"]
    assert [(e["pid"], e["tid"], e["ts"], e["dur"]) for e in sends] == [
        (0, 3, 1.5e6, 2e6),
        (1, 3, 1.5e6, 2e6),
    ]
    assert sends[0]["args"]["bytes"] == 2e6
    assert {e["tid"] for e in complete if e["name"] == "ar"} == {4}


def test_metadata_names_ranks_with_gpu_and_streams() -> None:
    """process_name is "rank N (GPU)"; thread_name is the stream name."""
    events = to_chrome_trace(run_simpy(_program()))["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {0: "rank 0 (A100-SXM4-80GB)", 1: "rank 1 (V100-SXM2-32GB)"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert threads == {(0, 1): "compute", (0, 3): "pp", (0, 4): "dp", (1, 3): "pp", (1, 4): "dp"}


def test_counters_for_memory_and_power() -> None:
    """Rank 0's memory counter goes to 1000 B at 0; its power is 300 W until 1.5 s, then 50 W."""
    events = to_chrome_trace(run_simpy(_program()))["traceEvents"]
    memory = [
        (e["ts"], e["args"]["bytes"])
        for e in events
        if e["ph"] == "C" and e["name"] == "memory" and e["pid"] == 0
    ]
    power = [
        (e["ts"], e["args"]["watts"])
        for e in events
        if e["ph"] == "C" and e["name"] == "power" and e["pid"] == 0
    ]
    assert memory == [(0.0, 1000.0)]
    assert power == [(0.0, 300.0), (1.5e6, 50.0)]


def test_expanded_result_uses_physical_ranks_as_pids() -> None:
    """Folded rank 1 standing for physical ranks 1 and 2 gives pids 0, 1, 2 after expand()."""
    program = Program(
        num_ranks=2,
        tasks=[Task(name="f", kind="forward", ranks=(1,), stream="compute", duration_s=1.0)],
        represents=[(0,), (1, 2)],
        info=ProgramInfo(gpu_name="A10"),
    )
    trace = to_chrome_trace(run_simpy(program).expand())
    check_trace_event_format(trace)
    assert sorted(e["pid"] for e in trace["traceEvents"] if e["ph"] == "X") == [1, 2]
    names = sorted(e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name")
    assert names == ["rank 0 (A10)", "rank 1 (A10)", "rank 2 (A10)"]


def test_written_trace_is_byte_identical_and_loads(tmp_path: Path) -> None:
    """Two writes of the same result give the same bytes, and the file is valid JSON."""
    result = run_simpy(random_program(11, 3, 200))
    first = write_chrome_trace(result, tmp_path / "a.json").read_bytes()
    second = write_chrome_trace(result, tmp_path / "b.json").read_bytes()
    assert first == second == chrome_trace_json(result).encode()
    loaded = json.loads(first)
    assert loaded["otherData"]["iteration_time_s"] == result.iteration_time_s
