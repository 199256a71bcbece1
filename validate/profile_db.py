"""The profile database: measured op and collective times from `sim profile`.

One CSV file (pandas; parquet would need pyarrow). Its first line is
``# trainsim-profile v1 {json}`` holding the machine metadata (CPU model, cores, torch version,
threads and processes used, date); then one row per measurement:

========== =========================================================================
kind       zoo op kind (``matmul``, ``softmax``, ...), ``optimizer`` (Adam step),
           ``model:<name>`` (a whole model's forward and backward), or a
           collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``p2p``,
           ``all_reduce_after_compute``)
shape      the zoo op's shape joined by ``x`` (``512x768x256``); params for ``optimizer``;
           the micro-batch size for ``model:``; empty for collectives
pass       ``fwd``, ``bwd`` (the whole backward of the op), ``step``, ``fwdbwd`` (a whole
           model's micro-batch), ``fwd_in_model`` / ``bwd_in_model`` (kind
           ``model:<name>:<op kind>``: the seconds a micro-batch's forward / backward spends in
           that kind inside the whole model) or ``comm``
group_size processes in the collective (1 for ops)
size_bytes collective payload S as the simulator's formulas take it (0 for ops)
flops      the zoo's FLOPs of that pass at that shape (workloads/ops.py)
bytes_moved the zoo's bytes of that pass
time_s     median over the repeats, every process timing at once; p25_s / p75_s the quartiles
repeats    timed repeats (after warm-up)
solo_s     median per-call time of the same op with the other processes idle (waiting in a
           barrier); 0 when not measured (collectives; profiles of one process; files
           written before the column existed, which load with 0)
========== =========================================================================
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import DataFileError

HASH_KEY = "sha256"
"""Header field holding the SHA-256 of the CSV rows below it; absent in old profiles."""
HEADER = "# trainsim-profile v1 "
COLUMNS = ("kind", "shape", "pass", "group_size", "size_bytes", "flops", "bytes_moved", "time_s",
           "p25_s", "p75_s", "repeats", "solo_s")
OPTIONAL_COLUMNS = {"solo_s": 0.0}
"""Columns a file may lack (older profiles), with the value they read as."""
PASSES = ("fwd", "bwd", "step", "fwdbwd", "comm", "fwd_in_model", "bwd_in_model")
NOT_OPS = ("comm", "fwdbwd", "fwd_in_model", "bwd_in_model")
"""Passes of rows that are not one op: collectives, whole models and ops timed inside one."""
WHOLE_MODEL = "model:"
"""Kind prefix of a whole model's row (``model:tiny-gpt``, pass ``fwdbwd``) and of its ops'
forwards and backwards timed inside it (``model:tiny-gpt:layernorm``, passes ``fwd_in_model``
and ``bwd_in_model``: one micro-batch's total of that kind)."""
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p", "all_reduce_after_compute")
"""Collective kinds of ``comm`` rows (the last: an all-reduce timed after GEMMs on every
process, what it adds to a training loop; validate/profiler.py)."""


def shape_key(shape: tuple[int, ...] | None) -> str:
    """``(512, 768, 256)`` → ``"512x768x256"`` (``""`` for None)."""
    return "" if not shape else "x".join(str(int(d)) for d in shape)


def parse_shape(text: str) -> tuple[int, ...]:
    """Inverse of `shape_key`."""
    return tuple(int(d) for d in text.split("x")) if text else ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileRow:
    """One measurement (see the module docstring for the fields)."""

    kind: str
    shape: tuple[int, ...] = ()
    pass_: str = "fwd"
    """``fwd``, ``bwd``, ``step``, ``fwdbwd``, ``comm``, ``fwd_in_model`` or ``bwd_in_model``
    (``pass`` in the file)."""
    group_size: int = 1
    size_bytes: float = 0.0
    flops: float = 0.0
    bytes_moved: float = 0.0
    time_s: float
    p25_s: float = 0.0
    p75_s: float = 0.0
    repeats: int = 1
    solo_s: float = 0.0
    """Median per-call time with the other processes idle; 0 when not measured."""

    def __post_init__(self) -> None:
        if self.pass_ not in PASSES:
            raise DataFileError(f"profile row {self.kind}: pass={self.pass_!r} is not one of "
                                f"{', '.join(PASSES)}")
        if not self.time_s > 0:
            raise DataFileError(f"profile row {self.kind} {shape_key(self.shape)}: "
                                f"time_s={self.time_s!r} must be > 0")
        if not self.solo_s >= 0:
            raise DataFileError(f"profile row {self.kind} {shape_key(self.shape)}: "
                                f"solo_s={self.solo_s!r} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileDB:
    """Machine metadata plus measured rows."""

    meta: dict[str, Any] = field(default_factory=dict, hash=False)
    """Machine and run metadata (device, cpu_model, cores, torch, threads, processes, ...)."""
    rows: tuple[ProfileRow, ...] = ()

    def ops(self, kind: str, pass_: str) -> list[ProfileRow]:
        """Rows of one op kind and pass."""
        return [r for r in self.rows if r.kind == kind and r.pass_ == pass_]

    def whole_model(self, name: str) -> ProfileRow | None:
        """The ``model:<name>`` row (a whole model's micro-batch), or None."""
        rows = [r for r in self.rows if r.pass_ == "fwdbwd" and r.kind == WHOLE_MODEL + name]
        return rows[0] if rows else None

    def in_model(self, name: str, pass_: str, micro_batch: int) -> dict[str, float]:
        """Per op kind, the seconds one micro-batch (of `micro_batch` samples) spent in that
        kind's forwards (`pass_` ``fwd_in_model``) or backwards (``bwd_in_model``) of model
        `name`, timed inside the whole model (empty without such rows)."""
        prefix = f"{WHOLE_MODEL}{name}:"
        return {r.kind[len(prefix):]: r.time_s for r in self.rows
                if r.pass_ == pass_ and r.kind.startswith(prefix)
                and r.shape == (micro_batch,)}

    def op_rows(self) -> list[ProfileRow]:
        """Rows that time one op (not a collective, not a whole model)."""
        return [r for r in self.rows if r.pass_ not in NOT_OPS]

    def collectives(self) -> list[ProfileRow]:
        """Collective rows."""
        return [r for r in self.rows if r.pass_ == "comm"]

    def has_solo(self) -> bool:
        """Whether op rows carry solo timings (a profile of 2+ processes since solo_s)."""
        return any(r.solo_s > 0 for r in self.op_rows())

    def kinds(self) -> list[str]:
        """Op kinds with measurements, sorted."""
        return sorted({r.kind for r in self.op_rows()})

    def to_frame(self) -> Any:
        """The rows as a pandas DataFrame with `COLUMNS`."""
        import pandas as pd

        data = [{"kind": r.kind, "shape": shape_key(r.shape), "pass": r.pass_,
                 "group_size": r.group_size, "size_bytes": r.size_bytes, "flops": r.flops,
                 "bytes_moved": r.bytes_moved, "time_s": r.time_s, "p25_s": r.p25_s,
                 "p75_s": r.p75_s, "repeats": r.repeats, "solo_s": r.solo_s} for r in self.rows]
        return pd.DataFrame(data, columns=list(COLUMNS))

    def to_csv(self) -> str:
        """The file's text: header line and CSV rows (stable order, repr-exact floats)."""
        frame = self.to_frame().sort_values(["pass", "kind", "group_size", "size_bytes", "flops",
                                             "shape"], kind="stable")
        body = frame.to_csv(index=False, lineterminator="\n")
        meta = {**self.meta, HASH_KEY: hashlib.sha256(body.encode("utf-8")).hexdigest()}
        return HEADER + json.dumps(meta, sort_keys=True) + "\n" + body

    def save(self, path: str | Path, *, force: bool = False) -> None:
        """Write the database; refuses to overwrite an existing file without `force`."""
        path = Path(path)
        if path.exists() and not force:
            raise DataFileError(f"{path} exists; pass --force to overwrite it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_csv(), encoding="utf-8")

    @classmethod
    def from_csv(cls, text: str, where: str = "profile") -> ProfileDB:
        """Parse the file's text.

        Raises:
            DataFileError: no header line, bad JSON metadata, missing columns, or bad values.
        """
        import pandas as pd

        first, _, body = text.partition("\n")
        if not first.startswith(HEADER):
            raise DataFileError(f"{where}: not a trainsim profile database (first line must "
                                f"start with {HEADER.strip()!r})")
        try:
            meta = json.loads(first[len(HEADER):])
        except json.JSONDecodeError as exc:
            raise DataFileError(f"{where}: metadata line is not JSON ({exc.msg})") from None
        if not isinstance(meta, dict):
            raise DataFileError(f"{where}: metadata line must be a JSON object")
        digest = meta.pop(HASH_KEY, None)
        if digest is not None and digest != hashlib.sha256(body.encode("utf-8")).hexdigest():
            raise DataFileError(f"{where}: rows do not match the {HASH_KEY} in the header (the "
                                "profile was edited or damaged after `sim profile` wrote it); "
                                "profile again")
        try:
            frame = pd.read_csv(io.StringIO(body), dtype={"shape": str}, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise DataFileError(f"{where}: bad CSV ({str(exc).strip()})") from None
        for column, value in OPTIONAL_COLUMNS.items():
            if column not in frame.columns:
                frame[column] = value
        missing = [c for c in COLUMNS if c not in frame.columns]
        if missing:
            raise DataFileError(f"{where}: missing column(s) {', '.join(missing)}")
        rows = []
        for i, rec in enumerate(frame.to_dict("records")):
            try:
                rows.append(ProfileRow(
                    kind=str(rec["kind"]), shape=parse_shape(str(rec["shape"])),
                    pass_=str(rec["pass"]), group_size=int(rec["group_size"]),
                    size_bytes=float(rec["size_bytes"]), flops=float(rec["flops"]),
                    bytes_moved=float(rec["bytes_moved"]), time_s=float(rec["time_s"]),
                    p25_s=float(rec["p25_s"]), p75_s=float(rec["p75_s"]),
                    repeats=int(rec["repeats"]), solo_s=float(rec["solo_s"])))
            except (TypeError, ValueError) as exc:
                raise DataFileError(f"{where}: row {i + 1}: {exc}") from None
        return cls(meta=meta, rows=tuple(rows))

    @classmethod
    def load(cls, path: str | Path) -> ProfileDB:
        """Read a database file (see `from_csv`)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DataFileError(f"{path}: not a text file (expected a profile CSV)") from None
        return cls.from_csv(text, str(path))
