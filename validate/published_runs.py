"""Published training runs (throughput, peak memory) against trainsim's predictions.

`sim accuracy` and bench/accuracy.py check the cost models against public measurements
(../shared/data/published/training_runs.csv, schema in its SOURCES.md). This module reads and
checks such a CSV, turns each row into what trainsim simulates (ModelSpec, Cluster,
ParallelPlan) — or says in one line why it cannot yet (an unknown GPU, a dtype the GPU lacks,
context parallelism, a missing shape or global batch), so no row is dropped silently — runs
the expressible ones and computes MAPE and mean signed error per group.

Expressibility is asked of the catalog and the plan, not hard-coded: a GPU is looked up in
the catalog, a dtype against the GPU's and the plan's checks, `cp` against ParallelPlan's
fields, so features others add are picked up without a change here.

Settings the schema has no column for but a row's name or notes state -- torch.compile, an
interleaved schedule, AsyncTP -- are read from them ("as above" taken as the previous row of the same
source), and each reading is listed with the row's assumptions.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import DataFileError, TrainsimError
from trainsim.hwmodels.cluster import Cluster, parse_cluster_spec
from trainsim.hwmodels.gpus import get_gpu
from trainsim.simulator.engines import run_program
from trainsim.workloads.framework import apply_framework, get_framework, list_frameworks
from trainsim.workloads.lowering import LoweringOptions, lower
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

SHARED_DATA_ENV = "TRAINSIM_SHARED_DATA"
CSV_IN_SHARED = Path("published") / "training_runs.csv"
COLUMNS = ("source", "name", "gpu", "nodes", "gpus_per_node", "params_b", "layers", "hidden",
           "heads", "kv_heads", "ffn", "seq", "vocab", "tp", "pp", "cp", "dp", "global_batch",
           "micro_batch", "virtual_stages", "sequence_parallel", "recompute", "zero", "dtype",
           "framework", "ref_kind", "ref_value", "notes")
REQUIRED = ("source", "name", "gpu", "nodes", "gpus_per_node", "seq", "tp", "pp", "dp",
            "dtype", "framework", "ref_kind", "ref_value")
"""Cells that must not be empty; every other one may be (the page did not state it)."""
_INTS = ("nodes", "gpus_per_node", "layers", "hidden", "heads", "kv_heads", "ffn", "seq",
         "vocab", "tp", "pp", "cp", "dp", "global_batch", "micro_batch", "virtual_stages")
THROUGHPUT, MEMORY = "tokens_per_s_per_gpu", "peak_memory_gib"
REF_KINDS = (THROUGHPUT, MEMORY)
RECOMPUTE = ("none", "selective", "full")
FRAMEWORK_ALIASES: dict[str, str] = {}
"""CSV framework names trainsim profiles under another name (none now: NeMo has its profile)."""
GROUPINGS = ("GPU generation", "framework", "source", "overall")
GIB = 2**30


@dataclass(frozen=True, slots=True)
class PublishedRun:
    """One checked CSV row: a configuration and one published measurement of it."""

    line: int
    """Line of the CSV where the row starts (the header is line 1)."""
    cells: dict[str, str] = field(compare=False)
    """The row's raw cells by column, stripped."""

    def text(self, key: str) -> str:
        return self.cells[key]

    def integer(self, key: str) -> int | None:
        """The integer in column `key`; None where the cell is empty."""
        return int(self.cells[key]) if self.cells[key] else None

    @property
    def source(self) -> str:
        return self.cells["source"]

    @property
    def name(self) -> str:
        return self.cells["name"]

    @property
    def said(self) -> str:
        """Name and notes in lower case: where a row states what the schema has no column for
        (torch.compile, an interleaved schedule, AsyncTP)."""
        return f"{self.name} {self.cells.get('notes', '')}".lower()

    @property
    def ref_kind(self) -> str:
        return self.cells["ref_kind"]

    @property
    def ref_value(self) -> float:
        return float(self.cells["ref_value"])

    @property
    def gpus(self) -> int:
        """GPUs of the run: nodes × GPUs per node."""
        return int(self.cells["nodes"]) * int(self.cells["gpus_per_node"])

    @property
    def config_key(self) -> tuple[str, ...]:
        """The configuration alone: rows that share it are one simulation."""
        return tuple(self.cells[c] for c in COLUMNS if c not in ("ref_kind", "ref_value", "notes"))


def default_csv_path() -> Path:
    """Where `sim accuracy` reads by default: $TRAINSIM_SHARED_DATA/published/training_runs.csv,
    else ../shared/data/published/training_runs.csv beside the repository (tests' convention);
    the path may not exist."""
    env = os.environ.get(SHARED_DATA_ENV)
    root = Path(env).expanduser() if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    return root / CSV_IN_SHARED


def _check_cell(where: str, key: str, value: str) -> None:
    """Raise DataFileError naming the file, line and field when `value` is malformed."""
    def bad(want: str) -> DataFileError:
        return DataFileError(f"{where}: field {key!r}={value!r} must be {want}")

    if not value:
        if key in REQUIRED:
            raise DataFileError(f"{where}: field {key!r} is empty (required)")
        return
    if key in _INTS and not (value.isascii() and value.isdigit() and int(value) >= 1):
        raise bad("a positive integer")
    if key in ("params_b", "ref_value"):
        try:
            number = float(value)
        except ValueError:
            raise bad("a positive number") from None
        if not number > 0 or number == float("inf"):
            raise bad("a positive number")
    if key == "ref_kind" and value not in REF_KINDS:
        raise bad(" or ".join(REF_KINDS))
    if key == "recompute" and value not in RECOMPUTE:
        raise bad(" | ".join(RECOMPUTE))
    if key == "zero" and value not in ("0", "1", "2", "3"):
        raise bad("0, 1, 2 or 3")
    if key == "sequence_parallel" and value.lower() not in ("true", "false", "1", "0"):
        raise bad("true or false")


def read_runs(path: str | Path) -> list[PublishedRun]:
    """Every row of a training_runs.csv, checked (DataFileError naming file, line and field)."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such CSV file" if not path.exists()
                            else f"{path}: not a file")
    try:
        return _read(path)
    except csv.Error as exc:
        raise DataFileError(f"{path}: not a CSV file ({exc})") from None


def _read(path: Path) -> list[PublishedRun]:
    with path.open(newline="", encoding="utf-8-sig") as handle:  # -sig: spreadsheets' BOM
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise DataFileError(f"{path}: empty file; expected the header {','.join(COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in COLUMNS if c not in header]
        unknown = [h for h in header if h not in COLUMNS]
        if missing or unknown:
            what = (f"misses column {missing[0]!r}" if missing
                    else f"has unknown column {unknown[0]!r}")
            raise DataFileError(f"{path}:1: header {what} (columns: {','.join(COLUMNS)})")
        runs, start = [], reader.line_num + 1
        above: dict[str, str] = {}  # source -> the previous row's (resolved) notes
        for cells in reader:
            where = f"{path}:{start}"
            if cells and any(c.strip() for c in cells):
                if len(cells) != len(header):
                    raise DataFileError(f"{where}: {len(cells)} cells, the header has "
                                        f"{len(header)}")
                row = {h: c.strip() for h, c in zip(header, cells, strict=True)}
                for key in COLUMNS:
                    _check_cell(where, key, row[key])
                # "Table 4 as above + AsyncTP": the row repeats the previous row's setup
                # (compile, Float8, ...), which the checks below read from its notes
                prev = above.get(row["source"])
                if prev and "as above" in row["notes"].lower():
                    row["notes"] = f"{row['notes']} [above: {prev}]"
                above[row["source"]] = row["notes"]
                runs.append(PublishedRun(line=start, cells=row))
            start = reader.line_num + 1
    return runs


@dataclass(frozen=True, slots=True)
class Expressed:
    """A row as trainsim simulates it, with what had to be assumed where the row is silent."""

    model: ModelSpec
    cluster: Cluster
    plan: ParallelPlan
    assumptions: tuple[str, ...] = ()
    logged_memory_factor: float = 1.0
    """The stack's logged peak memory over its tensors' peak (FrameworkProfile)."""


@dataclass(frozen=True, slots=True)
class NotExpressible:
    """A row trainsim cannot simulate yet, and why (one line)."""

    run: PublishedRun
    reason: str


def _model(run: PublishedRun, dtype: str, notes: list[str]) -> ModelSpec | str:
    """The row's model from its shape fields (LLaMA with kv_heads, else GPT-3's layout), or a
    reason. The style (norm, activation, biases, positions, embeddings) is the zoo's."""
    shape = {k: run.integer(k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")}
    absent = [k for k in ("layers", "hidden", "heads") if shape[k] is None]
    if absent:
        return f"model shape not stated ({', '.join(absent)} empty)"
    template = get_model("llama2-7b" if shape["kv_heads"] is not None else "gpt3-175b")
    vocab = shape["vocab"]
    if vocab is None:
        vocab = template.vocab_size
        notes.append(f"vocab not stated: {vocab} ({template.name}'s)")
    style = {k: getattr(template, k) for k in ("family", "norm", "activation", "bias", "dropout",
                                               "position_embedding", "tied_embeddings")}
    try:
        return ModelSpec(name=run.name, num_layers=shape["layers"] or 0,
                         hidden=shape["hidden"] or 0, num_heads=shape["heads"] or 0,
                         num_kv_heads=shape["kv_heads"], ffn_hidden=shape["ffn"],
                         vocab_size=vocab, seq_len=run.integer("seq") or 0, dtype=dtype,
                         source=f"{run.source}, {run.name}", **style)
    except ValueError as exc:
        return f"model shape refused: {exc}"


def _default(run: PublishedRun, key: str, value: Any, notes: list[str],
             matters: bool = True) -> Any:
    """The cell's value, or `value` where the row leaves it empty — noted as assumed when it
    `matters` (virtual stages without a pipeline do not)."""
    if run.text(key):
        return run.text(key)
    if matters:
        notes.append(f"{key} not stated: {value}")
    return value


def _micro_batch_size(run: PublishedRun, framework: str, pp: int, notes: list[str]) -> int:
    """The row's micro-batch size. A stack that splits each rank's local batch into one
    micro-batch per pipeline stage (torchtitan) publishes that local batch in the column, so
    with pp > 1 it is divided by pp (noted)."""
    given = int(_default(run, "micro_batch", 1, notes))
    if pp > 1 and get_framework(framework).pipeline_microbatches.value == "pp" \
            and given % pp == 0:
        notes.append(f"local batch {given} split into pp={pp} micro-batches of {given // pp} "
                     f"({framework}'s default)")
        return given // pp
    return given


def _async_tp(run: PublishedRun, tp: int, notes: list[str]) -> bool:
    """Whether the row overlaps its tensor-parallel collectives with compute (its notes name
    AsyncTP or TP communication overlap; the schema has no column for it)."""
    said = tp > 1 and ("asynctp" in run.said or "tp comm overlap" in run.said)
    if said:
        notes.append("AsyncTP named: tensor-parallel collectives overlapped")
    return said


def _compiled(run: PublishedRun, framework: str, notes: list[str]) -> str:
    """The framework's torch.compile profile ("<name>-compile") where the row's name or notes
    say the run was compiled (the schema has no compile column), else `framework`."""
    variant = f"{framework}-compile"
    said = "compile" in run.said
    if said and not framework.endswith("-compile") and variant in list_frameworks():
        notes.append(f"torch.compile named: profile {variant}")
        return variant
    return framework


def _default_virtual_stages(run: PublishedRun, framework: str, pp: int) -> int:
    """Model chunks per pipeline rank for a row that leaves them empty: the framework's
    default for interleaved schedules where the row names one (the schema has no schedule
    column; the run's name or notes say "interleaved"), else 1."""
    named = "interleaved" in run.said
    default = int(get_framework(framework).interleaved_virtual_stages.value)
    return default if pp > 1 and named and default > 1 else 1


def express(run: PublishedRun) -> Expressed | NotExpressible:
    """Model, cluster and plan of a row, or the reason trainsim cannot express it yet."""
    def no(reason: str) -> NotExpressible:
        return NotExpressible(run, reason)

    notes: list[str] = []
    try:
        gpu = get_gpu(run.text("gpu"))
    except TrainsimError:
        return no(f"GPU {run.text('gpu')!r} is not in trainsim's catalog")
    dtype = run.text("dtype")
    if dtype not in gpu.dtypes:
        return no(f"dtype {dtype} is not modelled on {gpu.name} (it runs {', '.join(gpu.dtypes)})")
    plan_fields = {f.name for f in dataclasses.fields(ParallelPlan)}
    cp = int(_default(run, "cp", 1, notes, matters=False))
    if cp > 1 and "cp" not in plan_fields:
        return no(f"context parallelism cp={cp} is not modelled (plans have no cp degree)")
    global_batch = run.integer("global_batch")
    if global_batch is None:
        return no("global batch not stated")
    framework = FRAMEWORK_ALIASES.get(run.text("framework").lower(), run.text("framework").lower())
    if framework not in list_frameworks():
        return no(f"framework {run.text('framework')!r} has no profile "
                  f"(known: {', '.join(list_frameworks())})")
    framework = _compiled(run, framework, notes)
    model = _model(run, dtype, notes)
    if isinstance(model, str):
        return no(model)
    published = float(run.text("params_b") or 0)
    if published and abs(model.parameters() / 1e9 - published) > 0.1 * published:
        notes.append(f"shape gives {model.parameters() / 1e9:.1f}B parameters, the row "
                     f"{published:g}B")
    model = apply_framework(model, framework)
    try:
        cluster = parse_cluster_spec(f"{run.text('nodes')}x{run.text('gpus_per_node')}x"
                                     f"{gpu.name}")
    except TrainsimError as exc:
        return no(f"cluster refused: {exc}")
    tp, pp = run.integer("tp") or 1, run.integer("pp") or 1
    profile = get_framework(framework)
    virtual = int(_default(run, "virtual_stages", _default_virtual_stages(run, framework, pp),
                           notes, matters=pp > 1))
    fields: dict[str, Any] = {
        "tp": tp, "pp": pp, "dp": run.integer("dp"),
        "global_batch": global_batch, "seq_len": run.integer("seq"), "dtype": dtype,
        "micro_batch_size": _micro_batch_size(run, framework, pp, notes),
        # an empty cell: the framework's default, which only exists with tensor parallelism
        "sp": tp > 1 and _default(
            run, "sequence_parallel",
            "true" if profile.sequence_parallel.value else "false",
            notes).lower() in ("true", "1"),
        # `selective` (torchtitan's "selective layer" / "selective op", SOURCES.md) maps to
        # the plan's selective policy: Megatron's attention-core recompute, the closest one.
        "recompute": _default(run, "recompute", "none", notes),
        # 3: FSDP / ZeRO-3; empty: 1 where the stack shards optimizer state by default
        "zero": int(_default(run, "zero",
                             int(bool(profile.distributed_optimizer.value)),
                             notes)),
        "schedule": "interleaved" if virtual > 1 else "1f1b", "virtual_stages": virtual,
        "tp_comm_overlap": _async_tp(run, tp, notes),
        # torchtitan keeps FSDP's gathered parameters over a pipelined step (no reshard)
        "reshard_after_forward": pp == 1 or bool(profile.reshard_with_pp.value),
    }
    # sp and zero are set above (the row's or the profile's): this adds the overlap flags
    fields.update(profile.plan_defaults(fields, model.family))
    if "cp" in plan_fields:
        fields["cp"] = cp
    try:
        plan = ParallelPlan.build(model, cluster, **fields)
    except TrainsimError as exc:
        return no(f"plan refused: {exc}")
    return Expressed(model, cluster, plan, tuple(notes),
                     float(profile.logged_memory_factor.value))


@dataclass(frozen=True, slots=True)
class RowResult:
    """A published value next to trainsim's prediction of it."""

    run: PublishedRun
    predicted: float
    generation: str
    """The GPU's architecture (Ampere, Hopper, ...): the "GPU generation" group."""
    oom: bool = False
    """The simulated peak exceeds the GPU's memory."""
    assumptions: tuple[str, ...] = ()

    @property
    def error(self) -> float:
        """Signed relative error (predicted − measured) / measured."""
        return (self.predicted - self.run.ref_value) / self.run.ref_value


def predict(expressed: Expressed, options: LoweringOptions | None = None,
            engine: str = "numba") -> dict[str, Any]:
    """Simulate one iteration: tokens/s per GPU (global batch × seq / time / GPUs), peak
    memory over GPUs in GiB as the stack logs it (the tensors' peak times the profile's
    `logged_memory_factor`: torchtitan reports reserved memory), and whether it runs out of
    memory (tensors alone over capacity)."""
    plan, cluster = expressed.plan, expressed.cluster
    result = run_program(lower(expressed.model, cluster, plan, options), engine=engine)
    tokens = (plan.global_batch or 0) * (plan.seq_len or expressed.model.seq_len)
    return {THROUGHPUT: tokens / result.iteration_time_s / cluster.num_gpus,
            MEMORY: result.peak_memory_bytes * expressed.logged_memory_factor / GIB,
            "oom": result.oom}


def evaluate(runs: Sequence[PublishedRun], *, options: LoweringOptions | None = None,
             engine: str = "numba",
             on_row: Callable[[int, int, PublishedRun], None] | None = None,
             ) -> tuple[list[RowResult], list[NotExpressible]]:
    """Predict every expressible row (one simulation per configuration, shared by its
    throughput and memory rows); the others come back with their reasons."""
    results: list[RowResult] = []
    skipped: list[NotExpressible] = []
    done: dict[tuple[str, ...], dict[str, Any] | NotExpressible] = {}
    for index, run in enumerate(runs):
        if on_row is not None:
            on_row(index, len(runs), run)
        key = run.config_key
        if key not in done:
            expressed = express(run)
            if isinstance(expressed, NotExpressible):
                done[key] = expressed
            else:
                try:
                    done[key] = {**predict(expressed, options, engine),
                                 "assumptions": expressed.assumptions}
                except TrainsimError as exc:
                    done[key] = NotExpressible(run, f"simulation refused: {exc}")
        outcome = done[key]
        if isinstance(outcome, NotExpressible):
            skipped.append(NotExpressible(run, outcome.reason))
        else:
            results.append(RowResult(run, float(outcome[run.ref_kind]),
                                     get_gpu(run.text("gpu")).architecture,
                                     bool(outcome["oom"]), outcome["assumptions"]))
    if on_row is not None and runs:
        on_row(len(runs), len(runs), runs[-1])
    return results, skipped


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Error statistics of one group of rows of one kind (throughput or memory)."""

    kind: str
    grouping: str
    """One of GROUPINGS."""
    group: str
    count: int
    mape: float
    """Mean |predicted − measured| / measured (a fraction: 0.1 = 10%)."""
    mean_signed_error: float
    """Mean (predicted − measured) / measured: > 0 where trainsim over-predicts."""


def _group_of(row: RowResult, grouping: str) -> str:
    return {"GPU generation": row.generation, "framework": row.run.text("framework"),
            "source": row.run.source, "overall": "all"}[grouping]


def group_stats(results: Iterable[RowResult]) -> list[GroupStats]:
    """MAPE, mean signed error and count per GPU generation, framework, source and overall,
    separately for throughput and for peak-memory rows (kinds without rows are left out)."""
    rows = list(results)
    out: list[GroupStats] = []
    for kind in REF_KINDS:
        of_kind = [r for r in rows if r.run.ref_kind == kind]
        for grouping in GROUPINGS:
            groups: dict[str, list[float]] = defaultdict(list)
            for r in of_kind:
                groups[_group_of(r, grouping)].append(r.error)
            for group, errors in sorted(groups.items()):
                out.append(GroupStats(kind, grouping, group, len(errors),
                                      sum(abs(e) for e in errors) / len(errors),
                                      sum(errors) / len(errors)))
    return out


def result_rows(results: Iterable[RowResult]) -> list[list[str]]:
    """Table rows: source, name, GPU, kind, published, predicted, error, notes."""
    def number(value: float, kind: str) -> str:
        return f"{value:,.1f}" if kind == MEMORY else f"{value:,.0f}"

    return [[r.run.source, r.run.name, r.run.text("gpu"), r.run.ref_kind,
             number(r.run.ref_value, r.run.ref_kind), number(r.predicted, r.run.ref_kind),
             f"{100 * r.error:+.1f}%", "; ".join((*(["OOM"] if r.oom else []), *r.assumptions))]
            for r in results]


def stats_rows(stats: Iterable[GroupStats]) -> list[list[str]]:
    """Table rows: kind, grouping, group, rows, MAPE, mean signed error."""
    return [[s.kind, s.grouping, s.group, str(s.count), f"{100 * s.mape:.1f}%",
             f"{100 * s.mean_signed_error:+.1f}%"] for s in stats]


def skipped_rows(skipped: Iterable[NotExpressible]) -> list[list[str]]:
    """Table rows: line, source, name, kind, reason."""
    return [[str(s.run.line), s.run.source, s.run.name, s.run.ref_kind, s.reason]
            for s in skipped]


@dataclass(frozen=True, slots=True)
class AccuracyReport:
    """What `sim accuracy` prints and bench/accuracy.py tabulates (`api.accuracy`)."""

    csv_path: Path
    results: list[RowResult]
    not_expressible: list[NotExpressible]
    stats: list[GroupStats]
    calibrated: bool = False
    """Whether a calibration's coefficients replaced the catalog's."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: rows with their predictions, the rows left out, the statistics."""
        def row(run: PublishedRun) -> dict[str, Any]:
            return {"line": run.line, "source": run.source, "name": run.name,
                    "gpu": run.text("gpu"), "framework": run.text("framework"),
                    "ref_kind": run.ref_kind, "published": run.ref_value}

        return {
            "csv": str(self.csv_path), "calibrated": self.calibrated,
            "rows": [{**row(r.run), "predicted": r.predicted, "error": r.error, "oom": r.oom,
                      "gpu_generation": r.generation, "assumed": list(r.assumptions)}
                     for r in self.results],
            "not_expressible": [{**row(s.run), "reason": s.reason}
                                for s in self.not_expressible],
            "stats": [dataclasses.asdict(s) for s in self.stats],
        }
