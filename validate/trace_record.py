"""`sim trace`: record real training iterations into a trainsim measured trace (JSON).

A `MeasuredTrace` holds what `sim validate` compares against: the model and plan, the
machine, per-iteration wall times after warm-up (the slowest rank's, each iteration starting
from a barrier), per-rank compute / data-parallel-sync / optimizer times, seconds per op kind
(on CPU the median of clocked iterations, validate/op_clock.py), peak memory, and the per-op
spans of one profiled iteration (torch.profiler, trainsim's ``op:<kind>:<name>`` ranges).

**Peak memory on CPU** (no ``max_memory_allocated`` there): the parameters' and Adam states'
bytes, counted from the tensors, plus the peak of the profiler's "Total Allocated" over one
profiled iteration — the bytes allocated since the iteration began and still alive
(activations, gradients, temporaries). Gradients are freed (set to None) before it begins, so
they are counted in the second term. tracemalloc does not see torch's allocator and RSS keeps
freed pages, so neither is used. **On CUDA** (``--device cuda``) the peak is
``torch.cuda.max_memory_allocated`` over the profiled iteration, which includes the parameters
and optimizer states resident on the GPU.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import TraceError
from trainsim.validate.devices import cpu_binding
from trainsim.validate.profiler import FILLER_GEMM, machine_metadata
from trainsim.validate.small_models import get_validation_model
from trainsim.validate.torch_parallel import WORKER_THREADS, rank_layout, run_parallel
from trainsim.validate.trace_import import KIND_ALIASES, is_kineto, load_kineto, read_json

FORMAT = "trainsim-trace"
HASH_KEY = "sha256"
"""Field holding the SHA-256 of the rest of the trace (canonical JSON); absent in old traces."""


def content_hash(data: dict[str, Any]) -> str:
    """SHA-256 of `data` without its HASH_KEY, as canonical JSON (sorted keys, no spaces)."""
    body = {k: v for k, v in data.items() if k != HASH_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
VERSION = 1
PLAN_FIELDS = ("dp", "tp", "pp", "micro_batch_size", "num_micro_batches")
PLAN_ALIASES = {"dp2": {"dp": 2}, "pp2": {"pp": 2}, "tp2": {"tp": 2}, "single": {},
                "dp2pp1": {"dp": 2}}


def parse_plan(text: str, *, micro_batch_size: int, num_micro_batches: int | None) -> dict[str, int]:
    """``dp2``, ``pp2``, ``tp2`` or ``dp=2,tp=1,pp=1`` → the plan's fields.

    Micro-batches default to 2·pp (1F1B fills its pipeline) and 2 without a pipeline.
    """
    key = text.strip().lower()
    plan = {"dp": 1, "tp": 1, "pp": 1}
    if key in PLAN_ALIASES:
        plan.update(PLAN_ALIASES[key])
    else:
        try:
            for part in key.split(","):
                name, value = part.split("=")
                if name.strip() not in ("dp", "tp", "pp"):
                    raise ValueError(name)
                plan[name.strip()] = int(value)
        except ValueError:
            raise TraceError(f"plan {text!r}: expected dp2, pp2, tp2 or dp=N,tp=N,pp=N") \
                from None
    if min(plan.values()) < 1:
        raise TraceError(f"--plan {text!r}: degrees must be >= 1")
    if micro_batch_size < 1:
        raise TraceError(f"--micro-batch {micro_batch_size} must be an integer >= 1")
    if num_micro_batches is not None and num_micro_batches < 1:
        raise TraceError(f"--micro-batches {num_micro_batches} must be an integer >= 1")
    plan["micro_batch_size"] = micro_batch_size
    plan["num_micro_batches"] = num_micro_batches if num_micro_batches is not None \
        else 2 * plan["pp"]
    return plan


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredTrace:
    """One measured training run (module docstring)."""

    model: str
    """Validation or zoo model name."""
    plan: dict[str, int] = field(hash=False)
    """dp, tp, pp, micro_batch_size, num_micro_batches (schedule 1F1B, fp32)."""
    iteration_times_s: tuple[float, ...]
    """Per measured iteration, the slowest rank's wall time."""
    ranks: tuple[dict[str, Any], ...] = ()
    """Per rank: rank, stage, replica, tp_index, compute_s, dp_sync_s, optimizer_s (medians),
    state_bytes, peak_allocated_bytes, peak_memory_bytes, kind_s (per op kind: on CPU since
    2026-11-27 the median of clocked iterations, validate/op_clock.py; before, and on GPUs,
    from the profiled iteration)."""
    events: tuple[dict[str, Any], ...] = ()
    """Op spans of the profiled iteration: rank, name, kind, ts_us (from its start), dur_us."""
    machine: dict[str, Any] = field(default_factory=dict, hash=False)
    """Where and how it was recorded (CPU, cores, torch, threads, command, load)."""

    def __post_init__(self) -> None:
        check_trace(self)

    @property
    def iteration_time_s(self) -> float:
        """Median measured iteration time."""
        return statistics.median(self.iteration_times_s)

    @property
    def peak_memory_bytes(self) -> float:
        """Largest per-rank peak memory."""
        return max((float(r.get("peak_memory_bytes", 0.0)) for r in self.ranks), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"format": FORMAT, "version": VERSION, "model": self.model, "plan": self.plan,
                "machine": self.machine, "iteration_times_s": list(self.iteration_times_s),
                "ranks": list(self.ranks), "events": list(self.events)}

    def save(self, path: str | Path, *, force: bool = False) -> None:
        """Write the JSON trace with its content hash (`sha256`, checked at load, so an edited
        or damaged trace is refused rather than validated); refuses to overwrite without
        `force`."""
        path = Path(path)
        if path.exists() and not force:
            raise TraceError(f"{path} exists; pass --force to overwrite it")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        data[HASH_KEY] = content_hash(data)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, data: Any, where: str = "trace") -> MeasuredTrace:
        """Parse the JSON form; a Kineto trace or anything else is a TraceError."""

        if is_kineto(data):
            raise TraceError(f"{where}: a plain Kineto/Chrome trace has no model or plan; "
                             f"convert it with: sim trace --import {where} --model M --plan P")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TraceError(f"{where}: not a trainsim trace (field format must be {FORMAT!r})")
        if data.get("version") != VERSION:
            raise TraceError(f"{where}: trace version {data.get('version')!r} is not {VERSION}")
        for key, kind in (("model", str), ("plan", dict), ("iteration_times_s", list),
                          ("ranks", list), ("events", list), ("machine", dict)):
            if key not in data and key in ("events", "machine"):
                continue
            if key not in data:
                raise TraceError(f"{where}: field {key!r} is missing")
            if not isinstance(data[key], kind):
                raise TraceError(f"{where}: field {key}={_short(data[key])} must be a "
                                 f"{_TYPE_WORDS[kind]}")
        try:
            trace = cls(model=data["model"], plan=dict(data["plan"]),
                        iteration_times_s=tuple(data["iteration_times_s"]),
                        ranks=tuple(data["ranks"]), events=tuple(data.get("events", ())),
                        machine=dict(data.get("machine", {})))
        except TraceError as exc:
            msg = str(exc)
            raise TraceError(f"{where}:{msg[len('trace:'):]}" if msg.startswith("trace:")
                             else msg) from None
        # after the field checks, so a malformed field is named; this catches the rest
        if HASH_KEY in data and data[HASH_KEY] != content_hash(data):
            raise TraceError(f"{where}: content does not match its {HASH_KEY} (the trace was "
                             "edited or damaged after it was recorded); record it again")
        return trace

    @classmethod
    def load(cls, path: str | Path) -> MeasuredTrace:
        """Read a trainsim trace file."""

        return cls.from_dict(read_json(path), str(path))


_TYPE_WORDS = {str: "string", dict: "JSON object", list: "JSON list"}

#: Per-rank fields that are durations (s) or sizes (bytes): finite numbers >= 0.
RANK_NUMBERS = ("compute_s", "dp_sync_s", "optimizer_s", "state_bytes", "peak_allocated_bytes",
                "peak_memory_bytes")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _check_count(where: str, value: Any, upper: int | None = None) -> None:
    """An index field: an int >= 0 (and < upper when given)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or \
            (upper is not None and value >= upper):
        bound = f" and < {upper}" if upper is not None else ""
        raise TraceError(f"trace: {where}={_short(value)} must be an integer >= 0{bound}")


def _check_seconds(where: str, value: Any) -> None:
    if not _is_number(value) or value < 0:
        raise TraceError(f"trace: {where}={_short(value)} must be a finite number >= 0")


def check_trace(trace: MeasuredTrace) -> None:
    """Refuse a trace whose contents cannot be what `sim trace` measured.

    `sim validate` simulates the trace's plan and reads its ranks, so a wrong type, a negative
    or non-finite duration, or a plan whose dp × tp × pp is not the number of ranks recorded
    would otherwise crash deep inside the comparison or simulate a different run.

    Raises:
        TraceError: naming the first offending field and its value.
    """
    if not isinstance(trace.model, str) or not trace.model.strip():
        raise TraceError(f"trace: model={_short(trace.model)} must be a non-empty name")
    missing = [k for k in PLAN_FIELDS if k not in trace.plan]
    if missing:
        raise TraceError(f"trace: plan misses field(s) {', '.join(missing)}")
    for k in PLAN_FIELDS:
        v = trace.plan[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TraceError(f"trace: plan.{k}={_short(v)} must be an integer >= 1")
    times = trace.iteration_times_s
    if not times:
        raise TraceError("trace: iteration_times_s must be a non-empty list of times > 0")
    for i, t in enumerate(times):
        if not _is_number(t) or t <= 0:
            raise TraceError(f"trace: iteration_times_s[{i}]={_short(t)} must be a finite "
                             f"time > 0")
    dp, tp, pp = trace.plan["dp"], trace.plan["tp"], trace.plan["pp"]
    world = dp * tp * pp
    if not trace.ranks:
        raise TraceError("trace: ranks is empty; a measured trace records every rank")
    if len(trace.ranks) != world:
        raise TraceError(f"trace: plan dp={dp} x tp={tp} x pp={pp} = {world} ranks, but ranks "
                         f"records {len(trace.ranks)}")
    for i, r in enumerate(trace.ranks):
        if not isinstance(r, dict):
            raise TraceError(f"trace: ranks[{i}]={_short(r)} must be a JSON object")
        for key, upper in (("rank", world), ("stage", pp), ("replica", dp), ("tp_index", tp)):
            if key in r:
                _check_count(f"ranks[{i}].{key}", r[key], upper)
        for key in RANK_NUMBERS:
            if key in r:
                _check_seconds(f"ranks[{i}].{key}", r[key])
        kinds = r.get("kind_s", {})
        if not isinstance(kinds, dict):
            raise TraceError(f"trace: ranks[{i}].kind_s={_short(kinds)} must be a JSON object "
                             f"of op kind -> seconds")
        for k, v in kinds.items():
            _check_seconds(f"ranks[{i}].kind_s[{k!r}]", v)
        its = r.get("iteration_times_s", [])
        if not isinstance(its, (list, tuple)):
            raise TraceError(f"trace: ranks[{i}].iteration_times_s={_short(its)} must be a list")
        for j, t in enumerate(its):
            _check_seconds(f"ranks[{i}].iteration_times_s[{j}]", t)
    for i, e in enumerate(trace.events):
        if not isinstance(e, dict):
            raise TraceError(f"trace: events[{i}]={_short(e)} must be a JSON object")
        for key in ("ts_us", "dur_us"):
            if key in e:
                _check_seconds(f"events[{i}].{key}", e[key])
        if "rank" in e:
            _check_count(f"events[{i}].rank", e["rank"], world)
        for key in ("name", "kind"):
            if key in e and not isinstance(e[key], str):
                raise TraceError(f"trace: events[{i}].{key}={_short(e[key])} must be a string")


def _load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _breakdown(iterations: list[dict[str, float]]) -> dict[str, float]:
    """Per op kind (the attention core's two as one, as the Kineto folding has them), the
    median over the clocked iterations of its seconds (validate/op_clock.py)."""
    folded = []
    for kinds in iterations:
        one: dict[str, float] = {}
        for k, v in kinds.items():
            name = KIND_ALIASES.get(k, k)
            one[name] = one.get(name, 0.0) + v
        folded.append(one)
    names = sorted({k for one in folded for k in one})
    return {k: statistics.median(one.get(k, 0.0) for one in folded) for k in names}


def record_trace(model: str, plan: dict[str, int], *, iterations: int = 10, warmup: int = 3,
                 command: str = "", device: str = "cpu") -> MeasuredTrace:
    """Run `plan` for real (validate/torch_parallel.py) on `device` (``cpu`` or ``cuda``) and
    fold the ranks into a trace."""
    import tempfile


    if iterations < 1:
        raise TraceError(f"sim trace --iterations {iterations} must be an integer >= 1")
    if warmup < 0:
        raise TraceError(f"sim trace --warmup {warmup} must be an integer >= 0")
    spec = get_validation_model(model)
    world = plan["dp"] * plan["tp"] * plan["pp"]
    load_before = _load_average()
    with tempfile.TemporaryDirectory(prefix="trainsim-trace-") as tmp:
        recs = run_parallel(spec.name, dp=plan["dp"], tp=plan["tp"], pp=plan["pp"],
                            micro_batch_size=plan["micro_batch_size"],
                            num_micro_batches=plan["num_micro_batches"], iterations=iterations,
                            warmup=warmup, out_dir=tmp, device=device)
        ranks, events = [], []
        for rec in recs:
            kin = load_kineto(Path(tmp, rec["kineto"]))
            t0 = min((e["ts_us"] for e in kin["events"]), default=0.0)
            for e in kin["events"]:
                if e["kind"] in ("other",):
                    continue
                events.append({"rank": rec["rank"], "name": e["name"], "kind": e["kind"],
                               "ts_us": round(e["ts_us"] - t0, 1), "dur_us": round(e["dur_us"], 1)})
            med = {k: statistics.median(p[k] for p in rec["parts"])
                   for k in ("compute_s", "dp_sync_s", "optimizer_s")}
            peak = rec.get("device_peak_bytes")
            if peak is None:
                peak = rec["state_bytes"] + kin["peak_allocated_bytes"]
            ranks.append({"rank": rec["rank"], "stage": rec["stage"], "replica": rec["replica"],
                          "tp_index": rec["tp_index"], **med,
                          "iteration_times_s": rec["iteration_times_s"],
                          "state_bytes": rec["state_bytes"],
                          "peak_allocated_bytes": kin["peak_allocated_bytes"],
                          "peak_memory_bytes": peak,
                          "kind_s": {k: round(v, 7) for k, v in
                                     (_breakdown(rec["breakdown"]) if rec.get("breakdown")
                                      else kin["kind_s"]).items()}})
    per_iter = [max(r["iteration_times_s"][i] for r in ranks) for i in range(iterations)]

    machine = machine_metadata(world, WORKER_THREADS, device)
    machine.update({"reference_gemm": list(FILLER_GEMM),
                    "reference_gemm_s": statistics.median(
                        t for rec in recs for t in rec["reference_gemm_s"]),
                    "load_average_before": load_before, "load_average_after": _load_average(),
                    "cpu_binding": cpu_binding(
                        [rec["cpu_core"] for rec in recs]
                        if recs and all(rec.get("cpu_core") is not None for rec in recs)
                        else None),
                    "warmup": warmup, "iterations": iterations, "command": command,
                    "breakdown": "median of clocked iterations (validate/op_clock.py)"
                                 if any(rec.get("breakdown") for rec in recs) else
                                 "one profiled iteration (torch.profiler)",
                    "memory_method": "torch.cuda.max_memory_allocated over one iteration"
                                     if device == "cuda" else
                                     "state tensors + peak of torch.profiler Total Allocated "
                                     "over one iteration (see validate/trace_record.py)"})
    return MeasuredTrace(model=spec.name, plan=dict(plan), iteration_times_s=tuple(per_iter),
                         ranks=tuple(ranks), events=tuple(events), machine=machine)


def import_kineto(path: str | Path, model: str, plan: dict[str, int],
                  iterations: int = 1) -> MeasuredTrace:
    """A trace from a plain Kineto/torch.profiler Chrome trace recorded elsewhere.

    Each pid in the file is taken as one rank, in the worker layout of `sim trace` (tp
    innermost, then dp, then pp; torch_parallel.rank_layout), so the plan's dp × tp × pp must
    be the number of pids; the iteration time is the trace's span divided
    by `iterations` (the profiled steps); peak memory is the peak of Total Allocated (the
    file has no parameter bytes).
    """

    spec = get_validation_model(model)
    kin = load_kineto(path)
    pids = sorted({e["pid"] for e in kin["events"]})
    ranks, events = [], []
    t0 = min(e["ts_us"] for e in kin["events"]) if kin["events"] else 0.0
    for r, pid in enumerate(pids):
        mine = [e for e in kin["events"] if e["pid"] == pid]
        kinds: dict[str, float] = kin["kind_s_by_pid"].get(pid, {})
        for e in mine:
            events.append({"rank": r, "name": e["name"], "kind": e["kind"],
                           "ts_us": round(e["ts_us"] - t0, 1), "dur_us": round(e["dur_us"], 1)})
        stage, replica, tp_index = rank_layout(r, plan["dp"], plan["tp"])
        ranks.append({"rank": r, "stage": stage, "replica": replica, "tp_index": tp_index,
                      "compute_s": sum(kinds.values()) / iterations,
                      "peak_allocated_bytes": kin["peak_allocated_bytes"],
                      "peak_memory_bytes": kin["peak_allocated_bytes"],
                      "kind_s": {k: v / iterations for k, v in sorted(kinds.items())}})
    return MeasuredTrace(model=spec.name, plan=dict(plan),
                         iteration_times_s=(kin["span_s"] / max(iterations, 1),),
                         ranks=tuple(ranks), events=tuple(events),
                         machine={"source": f"imported Kineto trace {Path(path).name}"})
