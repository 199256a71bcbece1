"""Reading traces: trainsim's measured-trace JSON and plain Kineto / torch.profiler Chrome traces.

A Kineto trace (``torch.profiler.profile(...).export_chrome_trace``) is ``{"traceEvents": [...]}``
(or a bare list) of Chrome events: ``ph: "X"`` spans with ``ts``/``dur`` in µs, and, with
``profile_memory=True``, ``[memory]`` instant events whose ``args["Total Allocated"]`` is the
bytes allocated since profiling began and still alive (CPU: c10's profiled CPU allocator).
`parse_kineto` keeps each thread's top-level spans, maps them to zoo op kinds — trainsim's own
``op:<kind>:<name>`` ranges first, then autograd backward nodes and aten op names — and takes
the peak of Total Allocated.

**Communication time** is the time a process spends in communication and not in an op:
the union of every communication span (``c10d::*``, ``gloo:*``, any depth, any thread) minus
the time its op spans cover. gloo runs an all-reduce on a worker thread while the caller sits
in ``c10d::allreduce_`` and then waits, so summing both threads' spans would count one
all-reduce twice; an ``isend``'s ``gloo:send`` span lasts from enqueue until the peer has
received, overlapping the ops computed meanwhile, which are not communication. A collective
issued inside an op's range (the vocab-parallel embedding's all-reduce, the cross entropy's
all-gather, the tensor-parallel autograd nodes) is communication: the communication spans
lying wholly inside an op span are taken out of that op's time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainsim.errors import TraceError

BACKWARD_KINDS = {
    "AddmmBackward0": "matmul", "MmBackward0": "matmul", "LinearBackward0": "matmul",
    "BmmBackward0": "attention", "SoftmaxBackward0": "softmax", "MulBackward0": "softmax",
    "NativeLayerNormBackward0": "layernorm", "GeluBackward0": "gelu",
    "AddBackward0": "elementwise", "EmbeddingBackward0": "embedding",
    "MaskedFillBackward0": "embedding", "_VocabParallelCrossEntropyBackward": "cross_entropy",
    "_CopyToTpBackward": "tp_comm", "_ReduceFromTpBackward": "tp_comm",
}
"""Autograd node (``autograd::engine::evaluate_function: <Node>``) → op kind."""
ATEN_KINDS = {
    "aten::linear": "matmul", "aten::addmm": "matmul", "aten::mm": "matmul",
    "aten::matmul": "matmul", "aten::bmm": "attention", "aten::softmax": "softmax",
    "aten::_softmax": "softmax", "aten::layer_norm": "layernorm", "aten::gelu": "gelu",
    "aten::add": "elementwise", "aten::embedding": "embedding",
    "aten::cross_entropy_loss": "cross_entropy", "aten::log_softmax": "cross_entropy",
    "aten::nll_loss_nd": "cross_entropy",
}
"""Top-level aten ops of a plain Kineto trace → op kind."""
KIND_ALIASES = {"attention_score": "attention", "attention_context": "attention"}
"""The two batched GEMMs of the attention core share one backward node name (BmmBackward0),
so per-kind comparisons fold them into ``attention``."""


def kind_of_event(name: str) -> str | None:
    """The op kind a Kineto span stands for, or None (framework, not an op)."""
    if name.startswith("op:"):
        kind = name.split(":")[1]
        if kind == "action":  # a whole pipeline instruction: a container, not an op
            return None
        return KIND_ALIASES.get(kind, kind)
    if name.startswith("autograd::engine::evaluate_function: "):
        return BACKWARD_KINDS.get(name.split(": ", 1)[1], "other")
    if name.startswith("Optimizer.step"):
        return "optimizer"
    if name.startswith(("gloo:", "c10d::", "record_param_comms")):
        return "comm"
    return ATEN_KINDS.get(name)


def chrome_events(data: Any, where: str) -> list[dict[str, Any]]:
    """The event dicts of a Chrome/Kineto trace (``{"traceEvents": [...]}`` or a bare list)."""
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{where}: not a Chrome/Kineto trace (no traceEvents list)")
    return [e for e in events if isinstance(e, dict)]


def parse_kineto(data: Any, where: str = "trace") -> dict[str, Any]:
    """Spans, per-kind totals, span of the trace and peak allocated bytes of a Kineto trace.

    Returns:
        ``{"events": [{"name", "kind", "pid", "tid", "ts_us", "dur_us"}], "kind_s": {kind: s},
        "span_s": float, "peak_allocated_bytes": float}``.

    Raises:
        TraceError: not a Chrome trace, or no complete ("X") events.
    """
    raw = chrome_events(data, where)
    spans = []
    peak = 0.0
    for e in raw:
        if e.get("name") == "[memory]":
            peak = max(peak, float((e.get("args") or {}).get("Total Allocated", 0) or 0))
            continue
        if e.get("ph") != "X":
            continue
        try:
            spans.append((str(e.get("pid")), str(e.get("tid")), float(e["ts"]),
                          float(e.get("dur", 0.0)), str(e.get("name", ""))))
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"{where}: event {e.get('name')!r} lacks a numeric ts/dur") \
                from None
    if not spans:
        raise TraceError(f"{where}: no complete ('X') events; is this a Kineto trace?")
    spans.sort(key=lambda s: (s[0], s[1], s[2], -s[3]))
    kept: list[dict[str, Any]] = []
    # Ops and communication nest separately: gloo records an isend's work as a span on the
    # caller's thread from enqueue to completion, overlapping the ops that run meanwhile, so a
    # communication span must not hide the op spans that start inside it.
    open_end: dict[tuple[str, str, bool], float] = {}
    for pid, tid, ts, dur, name in spans:
        kind = kind_of_event(name)
        if kind is None:
            continue
        key = (pid, tid, kind == "comm")
        if ts < open_end.get(key, float("-inf")):  # nested inside a kept span
            continue
        open_end[key] = ts + dur
        kept.append({"name": name, "kind": kind, "pid": pid, "tid": tid, "ts_us": ts,
                     "dur_us": dur})
    by_pid = _kind_seconds(spans, kept)
    kind_s: dict[str, float] = {}
    for kinds in by_pid.values():
        for k, v in kinds.items():
            kind_s[k] = kind_s.get(k, 0.0) + v
    start = min(s[2] for s in spans)
    end = max(s[2] + s[3] for s in spans)
    return {"events": kept, "kind_s": dict(sorted(kind_s.items())),
            "kind_s_by_pid": {p: dict(sorted(k.items())) for p, k in sorted(by_pid.items())},
            "span_s": (end - start) * 1e-6, "peak_allocated_bytes": peak}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint union of [start, end) intervals."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(union: list[tuple[float, float]], a: float, b: float) -> float:
    """Length of [a, b) covered by a disjoint sorted `union`."""
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in union if x < b and y > a)


def _kind_seconds(spans: list[tuple[str, str, float, float, str]],
                  kept: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Seconds per kind per pid (module docstring): an op's top-level span minus the
    communication spans (any thread) lying wholly inside it; communication as the union of
    every communication span minus the time covered by those op pieces."""
    comm: dict[str, list[tuple[float, float]]] = {}
    for pid, _tid, ts, dur, name in spans:
        if kind_of_event(name) == "comm":
            comm.setdefault(pid, []).append((ts, ts + dur))
    comm_union = {pid: _union(ivs) for pid, ivs in comm.items()}
    out: dict[str, dict[str, float]] = {}
    pieces: dict[str, list[tuple[float, float]]] = {}
    for ev in kept:
        if ev["kind"] == "comm":
            continue
        pid, start = ev["pid"], ev["ts_us"]
        end = start + ev["dur_us"]
        inside = _union([(a, b) for a, b in comm.get(pid, []) if a >= start and b <= end])
        own = [(start, end)]
        for a, b in inside:
            own = [piece for x, y in own for piece in ((x, min(y, a)), (max(x, b), y))
                   if piece[1] > piece[0]]
        pieces.setdefault(pid, []).extend(own)
        kinds = out.setdefault(pid, {})
        kinds[ev["kind"]] = kinds.get(ev["kind"], 0.0) + sum(b - a for a, b in own) * 1e-6
    for pid, union in comm_union.items():
        busy = _union(pieces.get(pid, []))
        free = sum((b - a) - _covered(busy, a, b) for a, b in union)
        out.setdefault(pid, {})["comm"] = free * 1e-6
    return out


def read_json(path: str | Path) -> Any:
    """Load a JSON file; a truncated or non-JSON file is a TraceError naming the path."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file (expected a JSON trace)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON (truncated?) at line {exc.lineno}: "
                         f"{exc.msg}") from None


def load_kineto(path: str | Path) -> dict[str, Any]:
    """`parse_kineto` of a Kineto / torch.profiler Chrome trace file."""
    return parse_kineto(read_json(path), str(path))


def is_kineto(data: Any) -> bool:
    """Whether parsed JSON looks like a Chrome/Kineto trace rather than a trainsim trace."""
    return (isinstance(data, dict) and "traceEvents" in data) or isinstance(data, list)
