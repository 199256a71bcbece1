"""Run a sweep's scenarios into one Parquet table, resumably.

The table has one row per scenario, in the spec's order (`scenario` is its index): inputs
(model, cluster, the plan entry or planner as JSON, one column per knob, and the plan that ran
in full as `resolved_plan`), outputs (iteration time, samples/s, tokens/s, MFU, peak memory in
GiB, OOM, energy in J and price in $ per iteration) and `error`, and `key`, the scenario's
content hash (spec.py). There is no wall-clock column, so the same spec gives the same table,
row for row, whatever executor ran it and however many runs it took.

Why it is built this way:

* **Failures are rows.** A plan that does not fit the cluster, a planner that finds nothing,
  any TrainsimError: the row has `error` set and empty figures. An OOM plan keeps its figures,
  `oom` true and an `error` saying by how much it misses. A bug (any other exception) is also a
  row, with `error` starting "internal error" — and those rows are recomputed on the next run,
  since a fixed trainsim should not be stuck with them.
* **Resumable.** Finished rows are written every `checkpoint_s` seconds (longer when the
  table is big: at least 5× the last write) by writing a temporary file beside the table and
  `os.replace`-ing it, so a sweep killed at any moment (Ctrl-C, SIGKILL, a lost machine)
  leaves a valid table of finished rows. A rerun reads it, skips every key present, and
  computes only the missing scenarios. Rows whose key is no longer in the spec (a changed
  spec, or another spec's table) are the user's results: the run is refused, before any work,
  unless `drop_stale` (they are dropped, so the table describes the spec that wrote it) or
  `force` (start over). One run at a time
  writes a table: a second is refused while the first holds `.TABLE.lock` (flock, released
  by the kernel when the first ends, however it ends).
* **Batched.** Scenarios go to workers in small batches (about 8 per worker, at most 32
  scenarios each), so workers stay busy, progress moves and checkpoints have rows to save.
  Each worker process keeps one Oracle per (model, cluster) across batches: models and
  clusters load once, and a plan that several knob settings resolve to runs once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.errors import SpecError, TrainsimError
from trainsim.hwmodels.cluster import Cluster, parse_cluster
from trainsim.search.methods import get_planner
from trainsim.search.oracle import Oracle, Summary
from trainsim.search.planner import SearchSpec, run_search
from trainsim.search.sweep.executors import make_executor
from trainsim.search.sweep.spec import Scenario, SweepSpec, canonical_json
from trainsim.simulator.own_files import make_parent
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.plan_defaults import DEFAULT_GLOBAL_BATCH, plan_fields
from trainsim.workloads.plan_file import TRAINSIM_VERSION
from trainsim.workloads.zoo import get_model

GIB = 2.0**30
METADATA_KEY = b"trainsim.sweep"
"""Parquet schema metadata key: JSON with the format, trainsim's version, the knob columns and
the number of scenarios the spec has (a table with fewer rows is unfinished)."""
FORMAT = "trainsim-sweep"
INTERNAL = "internal error"
"""Prefix of the `error` of a scenario that hit a bug: recomputed on the next run."""
PYARROW_INSTALL = "`sim sweep` reads and writes Parquet and needs pyarrow: " \
                  "pip install 'trainsim[data]'"

INPUT_COLUMNS = ("scenario", "key", "model", "cluster", "plan", "planner")
OUTPUT_COLUMNS = ("resolved_plan", "num_gpus", "iteration_time_s", "samples_per_s",
                  "tokens_per_s", "mfu", "peak_memory_gib", "oom", "energy_j", "cost_usd",
                  "error")
"""Columns after the knob columns (`resolved_plan`: the full plan that ran, as JSON)."""
BATCH_PER_WORKER = 8
MAX_BATCH = 32


@dataclass(frozen=True, slots=True)
class SweepRun:
    """What one `run_sweep` call did."""

    path: Path
    """The table."""
    total: int
    """Scenarios in the spec."""
    rows: int
    """Rows in the table now (== total when the sweep is finished)."""
    computed: int
    """Scenarios computed by this call."""
    skipped: int
    """Scenarios found in the table already (not recomputed)."""
    failed: int
    """Rows with `error` set (OOM included)."""
    oom: int
    """Rows whose plan runs out of memory."""
    interrupted: bool
    """Ctrl-C stopped the run (the finished rows are saved)."""
    dropped: int = 0
    """Rows of the old table whose scenario is no longer in the spec (removed)."""

    @property
    def finished(self) -> bool:
        return self.rows == self.total


def _pyarrow() -> Any:
    try:
        import pyarrow as pa  # optional dependency (trainsim[data]): only sweeps need it
        import pyarrow.parquet  # loads pa.parquet
    except ImportError:
        raise SpecError(PYARROW_INSTALL) from None
    return pa


# --- one scenario -------------------------------------------------------------------------

_ORACLES: dict[tuple[str, str], Oracle] = {}
"""Per worker process: one Oracle per (model, cluster) name pair (module docstring)."""


def _oracle(model: str, cluster: str) -> Oracle:
    key = (model, cluster)
    if key not in _ORACLES:
        if len(_ORACLES) >= 16:  # a long sweep over many pairs: keep memory bounded
            _ORACLES.pop(next(iter(_ORACLES)))
        spec: ModelSpec = get_model(model)
        hw: Cluster = parse_cluster(cluster)
        _ORACLES[key] = Oracle(spec, hw)
    return _ORACLES[key]


def _plan_json(plan: ParallelPlan) -> str:
    return canonical_json(plan.to_dict())


def _figures(summary: Summary) -> dict[str, Any]:
    def finite(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else float(x)

    row: dict[str, Any] = {
        "iteration_time_s": finite(summary.iteration_time_s),
        "samples_per_s": finite(summary.samples_per_s),
        "tokens_per_s": finite(summary.tokens_per_s),
        "mfu": finite(summary.mfu),
        "peak_memory_gib": finite(summary.peak_memory_bytes / GIB),
        "oom": bool(summary.oom),
        "energy_j": finite(summary.energy_j),
        "cost_usd": finite(summary.cost_usd),
        "error": None,
    }
    if summary.oom:
        peaks = summary.peak_memory_bytes_per_rank or (summary.peak_memory_bytes,)
        caps = summary.memory_capacity_bytes_per_rank or (math.inf,) * len(peaks)
        peak, cap = max(zip(peaks, caps), key=lambda pc: pc[0] / pc[1] if pc[1] > 0
                        else math.inf)
        row["error"] = (f"out of memory: peak {peak / GIB:.2f} GiB > {cap / GIB:.2f} GiB "
                        f"on a GPU")
    return row


def _failed(message: str) -> dict[str, Any]:
    return {"iteration_time_s": None, "samples_per_s": None, "tokens_per_s": None,
            "mfu": None, "peak_memory_gib": None, "oom": False, "energy_j": None,
            "cost_usd": None, "error": message}


def run_scenario(s: Scenario) -> dict[str, Any]:
    """One scenario's table row (without its knob columns, which the writer adds): never
    raises for a user error — the row's `error` says what went wrong."""
    row: dict[str, Any] = {"scenario": s.index, "key": s.key, "model": s.model,
                           "cluster": s.cluster, "resolved_plan": None, "num_gpus": None}
    try:
        oracle = _oracle(s.model, s.cluster)
        row["num_gpus"] = oracle.cluster.num_gpus
        if s.planner is None:
            fields = plan_fields(oracle.model, oracle.cluster, None, s.fields())
            plan = ParallelPlan.build(oracle.model, oracle.cluster, **fields)
            row["resolved_plan"] = _plan_json(plan)
            row.update(_figures(oracle.evaluate(plan)))
            return row
        p = s.planner
        limit = p.get("memory_limit_gb")
        request = SearchSpec(model=oracle.model, cluster=oracle.cluster,
                             global_batch=s.knobs.get("global_batch", DEFAULT_GLOBAL_BATCH),
                             memory_limit_bytes=None if limit is None else limit * 1e9,
                             time_budget_s=p["time_budget_s"], objective=p["objective"],
                             top_k=1)
        options = {} if p.get("max_evals") is None else {"max_evals": p["max_evals"]}
        result = run_search(get_planner(p["method"], **options), request, oracle=oracle)
        best = result.best
        if best is None or best.plan is None:
            row.update(_failed(f"no plan found: {result.no_fit_reason()}"))
            return row
        row["resolved_plan"] = _plan_json(best.plan)
        row.update(_figures(best.summary))
    except TrainsimError as exc:
        row.update(_failed(f"{type(exc).__name__}: {exc}"))
    except Exception as exc:  # noqa: BLE001 -- a bug: keep going, recompute the row next run
        row.update(_failed(f"{INTERNAL} ({type(exc).__name__}): {exc}"))
    return row


def run_batch(batch: Sequence[Scenario]) -> list[dict[str, Any]]:
    """The rows of a batch of scenarios (what executors run in workers)."""
    return [run_scenario(s) for s in batch]


# --- the table ----------------------------------------------------------------------------


def _knob_type(pa: Any, values: Sequence[Any]) -> Any:
    """A knob column's Arrow type: bool, int64, float64 or string when every value is one
    kind (nulls aside); otherwise string holding each value's JSON."""
    given = [v for v in values if v is not None]
    if given and all(isinstance(v, bool) for v in given):
        return pa.bool_()
    if given and all(isinstance(v, int) and not isinstance(v, bool) for v in given):
        return pa.int64()
    if given and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in given):
        return pa.float64()
    return pa.string()


def _knob_cell(value: Any, kind: Any, pa: Any) -> Any:
    if value is None:
        return None
    if kind == pa.string() and not isinstance(value, str):
        return canonical_json(value)
    if kind == pa.float64():
        return float(value)
    return value


def table_schema(spec: SweepSpec) -> Any:
    """The table's Arrow schema for `spec` (its knob columns typed from the spec's values)."""
    pa = _pyarrow()
    fields = [pa.field("scenario", pa.int64()), pa.field("key", pa.string()),
              pa.field("model", pa.string()), pa.field("cluster", pa.string()),
              pa.field("plan", pa.string()), pa.field("planner", pa.string())]
    fields += [pa.field(name, _knob_type(pa, values)) for name, values in spec.knobs.items()]
    fields += [pa.field("resolved_plan", pa.string()), pa.field("num_gpus", pa.int64())]
    fields += [pa.field(name, pa.float64()) for name in
               ("iteration_time_s", "samples_per_s", "tokens_per_s", "mfu", "peak_memory_gib")]
    fields += [pa.field("oom", pa.bool_()), pa.field("energy_j", pa.float64()),
               pa.field("cost_usd", pa.float64()), pa.field("error", pa.string())]
    meta = {"format": FORMAT, "version": 1, "trainsim": TRAINSIM_VERSION,
            "knobs": list(spec.knobs), "scenarios": spec.size}
    return pa.schema(fields, metadata={METADATA_KEY: canonical_json(meta).encode()})


def _full_row(s: Scenario, result: Mapping[str, Any], schema: Any, pa: Any
              ) -> dict[str, Any]:
    """A table row: the scenario's inputs (its index in *this* spec) and `result`'s outputs."""
    row: dict[str, Any] = {
        "scenario": s.index, "key": s.key, "model": s.model, "cluster": s.cluster,
        "plan": None if s.plan is None else canonical_json(s.plan),
        "planner": None if s.planner is None else canonical_json(s.planner)}
    for name, value in s.knobs.items():
        row[name] = _knob_cell(value, schema.field(name).type, pa)
    for name in OUTPUT_COLUMNS:
        row[name] = result.get(name)
    return row


def write_table(path: Path, rows: Mapping[int, Mapping[str, Any]], schema: Any) -> None:
    """Write `rows` (by scenario index) in index order, atomically: a temporary file beside
    `path`, then `os.replace`, so a reader (or a kill) never sees half a table."""
    pa = _pyarrow()
    ordered = [rows[i] for i in sorted(rows)]
    table = pa.Table.from_pylist(ordered, schema=schema)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # run_sweep made its folder
    try:
        pa.parquet.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_table(path: str | Path) -> Any:
    """A sweep table (pyarrow.Table); one line when `path` is not one."""
    pa = _pyarrow()
    where = Path(path)
    if not where.is_file():
        raise SpecError(f"sweep table {str(where)!r} does not exist" if not where.exists()
                        else f"sweep table {str(where)!r} is not a file")
    try:
        table = pa.parquet.read_table(where)
    except Exception as exc:  # noqa: BLE001 -- ArrowInvalid, OSError...: not Parquet
        raise SpecError(f"{where} is not a sweep table: not a Parquet file "
                        f"({type(exc).__name__})") from None
    meta = table_metadata(table)
    if meta.get("format") != FORMAT:
        raise SpecError(f"{where} is not a sweep table (no trainsim sweep metadata)")
    return table


def table_metadata(table: Any) -> dict[str, Any]:
    """The sweep metadata of a table ({} when it has none)."""
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        return {}
    try:
        meta = json.loads(raw)
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _previous_results(path: Path, force: bool) -> dict[str, dict[str, Any]]:
    """Rows of an existing table by key (outputs only matter), {} when starting over."""
    if force or not path.exists():
        return {}
    try:
        table = read_table(path)
    except SpecError as exc:
        raise SpecError(f"--out {exc}; pass --force to replace it") from None
    return {r["key"]: r for r in table.to_pylist()
            if not str(r.get("error") or "").startswith(INTERNAL)}


@contextlib.contextmanager
def _table_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock beside `path` for the run; refuse when another run holds it."""
    lock = path.with_name(f".{path.name}.lock")
    with open(lock, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SpecError(f"another sweep is writing {path} (it holds {lock.name}); wait "
                            f"for it or give another --out") from None
        yield


def _batches(todo: Sequence[Scenario], workers: int) -> list[list[Scenario]]:
    size = max(1, min(MAX_BATCH, math.ceil(len(todo) / (workers * BATCH_PER_WORKER))))
    return [list(todo[i:i + size]) for i in range(0, len(todo), size)]


def run_sweep(spec: SweepSpec, out: str | Path, *, executor: str = "local",
              address: str | None = None, workers: int | None = None, force: bool = False,
              limit: int | None = None, drop_stale: bool = False, checkpoint_s: float = 2.0,
              on_progress: Callable[[int, int], None] | None = None) -> SweepRun:
    """Run every scenario of `spec` missing from the table at `out` and write the table.

    Args:
        executor: "local" (worker processes) or "ray" (executors.py).
        address: Ray address (auto, HOST:PORT); None starts a local Ray instance.
        workers: Worker processes (local) or CPUs of a local Ray instance; the CPU count
            when None.
        force: Start over: ignore (and replace) an existing table.
        drop_stale: Drop the existing table's rows of scenarios the spec no longer has
            (without it, and without `force`, such a table is refused: SpecError).
        limit: Compute at most this many missing scenarios (the first in spec order), then
            stop: a sweep split over several runs, and tests of resumption.
        checkpoint_s: Save the finished rows at least this often (module docstring).
        on_progress: Called as (scenarios in the table, total) after each batch.

    Ctrl-C stops the run: the finished rows are saved and `interrupted` is set.
    """
    pa = _pyarrow()
    path = Path(out)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise SpecError(f"--limit {limit!r} must be a positive number of scenarios")
    runner = make_executor(executor, address=address, workers=workers)
    with _table_lock(make_parent(path)):
        return _run(spec, path, runner, pa, force=force, limit=limit, drop_stale=drop_stale,
                    checkpoint_s=checkpoint_s, on_progress=on_progress)


def _run(spec: SweepSpec, path: Path, runner: Any, pa: Any, *, force: bool, limit: int | None,
         drop_stale: bool, checkpoint_s: float,
         on_progress: Callable[[int, int], None] | None) -> SweepRun:
    schema = table_schema(spec)
    scenarios = spec.scenarios()
    previous = _previous_results(path, force)
    rows: dict[int, dict[str, Any]] = {}
    todo: list[Scenario] = []
    for s in scenarios:
        old = previous.get(s.key)
        if old is not None:
            rows[s.index] = _full_row(s, old, schema, pa)
        else:
            todo.append(s)
    keys = {s.key for s in scenarios}
    dropped = sum(1 for k in previous if k not in keys)
    if dropped and not drop_stale:
        raise SpecError(f"--out {str(path)!r} holds {dropped} rows of scenarios this spec does "
                        f"not have (another spec's table; or this spec, a model or cluster file "
                        f"it names, or trainsim's version changed): give another --out, "
                        f"--drop-stale to drop those rows and resume, or --force to start over")
    skipped = len(rows)
    if limit is not None:
        todo = todo[:limit]
    by_key = {s.key: s for s in todo}
    computed = 0
    interrupted = False
    last_write, write_cost = time.monotonic(), 0.0
    if on_progress is not None:
        on_progress(len(rows), len(scenarios))
    try:
        if todo:
            width = getattr(runner, "workers", None) or 1
            for results in runner.run(run_batch, _batches(todo, width)):
                for result in results:
                    s = by_key[result["key"]]
                    rows[s.index] = _full_row(s, result, schema, pa)
                    computed += 1
                if on_progress is not None:
                    on_progress(len(rows), len(scenarios))
                now = time.monotonic()
                if now - last_write >= max(checkpoint_s, 5 * write_cost):
                    write_table(path, rows, schema)
                    write_cost = time.monotonic() - now
                    last_write = time.monotonic()
    except KeyboardInterrupt:
        interrupted = True
    write_table(path, rows, schema)
    failed = sum(1 for r in rows.values() if r["error"] is not None)
    oom = sum(1 for r in rows.values() if r["oom"])
    return SweepRun(path=path, total=len(scenarios), rows=len(rows), computed=computed,
                    skipped=skipped, failed=failed, oom=oom, interrupted=interrupted,
                    dropped=dropped)


def table_rows(table: Any) -> list[dict[str, Any]]:
    """A sweep table as a list of row dicts, in scenario order."""
    return sorted(table.to_pylist(), key=lambda r: r["scenario"])


__all__ = ["INTERNAL", "PYARROW_INSTALL", "SweepRun", "read_table", "run_batch",
           "run_scenario", "run_sweep", "table_metadata", "table_rows", "table_schema",
           "write_table"]

