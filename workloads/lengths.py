"""Datasets as sequence-length distributions, for DynaPipe-style dynamic micro-batching.

Variable-length, multi-task training (DynaPipe, Jiang et al., EuroSys'24) is simulated from the
token counts of its samples only, never their text. A `LengthDataset` holds those counts, one
`Sample` (input tokens, plus target tokens for an encoder-decoder model) per training example.
They come from:

* `read_lengths`: a file of counts (text, CSV or Parquet), e.g. exported from a tokenized corpus;
* `tokenize_lengths`: a text or JSONL file counted with a local `tokenizer.json` (never a
  download), so lengths match the tokenizer the model trains with;
* `synthetic`: a seeded draw from a named mixture in data/length_mixtures.yaml (`flan`, a long-
  tailed multi-task mixture imitating FLAN v2; `uniform-long`, its contrast), every parameter of
  which carries a source or says "assumed".

`fit_max_len` then applies the model's maximum length (truncate, or reject with the offending
sample named), and `iteration_batches` cuts global batches by token budget as DynaPipe's data
loader receives them. Every user error is one line naming the file, line or field.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trainsim.errors import DataFileError, SpecError, unknown_name
from trainsim.workloads.data_files import read_data_yaml

MAX_TOKENS = 10_000_000
"""Largest believable token count of one sample; more is a unit mistake (bytes, characters)."""
LENGTH_COLUMNS = ("length", "input_len", "len", "tokens")
"""CSV/Parquet column names taken as input lengths when no column is named."""
TARGET_COLUMNS = ("target_len", "target")
"""CSV/Parquet column names taken as target lengths when no target column is named."""
ON_LONG_POLICIES = ("truncate", "reject")

_FILE = "data/length_mixtures.yaml"
_WHERE = f"workloads/{_FILE}"


@dataclass(frozen=True, slots=True)
class Sample:
    """Token counts of one training example."""

    input_len: int
    """Tokens (decoder-only: the sequence; encoder-decoder: the encoder input)."""
    target_len: int = 0
    """Encoder-decoder target tokens (0 for decoder-only data)."""


@dataclass(frozen=True, slots=True)
class LengthDataset:
    """The token counts of a dataset, in file (or draw) order."""

    name: str
    samples: tuple[Sample, ...]
    source: str
    """Where the lengths came from (file path, mixture name + seed, tokenizer)."""

    def lengths(self) -> npt.NDArray[np.int64]:
        """Input lengths, one per sample."""
        return np.fromiter((s.input_len for s in self.samples), dtype=np.int64,
                           count=len(self.samples))

    def targets(self) -> npt.NDArray[np.int64]:
        """Target lengths, one per sample (zeros for decoder-only data)."""
        return np.fromiter((s.target_len for s in self.samples), dtype=np.int64,
                           count=len(self.samples))

    @property
    def encoder_decoder(self) -> bool:
        """Whether any sample has target tokens (data for an encoder-decoder model)."""
        return any(s.target_len > 0 for s in self.samples)


# --------------------------------------------------------------------------------------------
# Length files


def _count(raw: object, where: str, what: str = "token count") -> int:
    """One validated token count; `where` names the file and line/row for the message."""
    if isinstance(raw, bool):
        raise SpecError(f"{where}: {raw!r} is not a {what}")
    if isinstance(raw, float):
        if not math.isfinite(raw) or raw != int(raw):
            raise SpecError(f"{where}: {raw!r} is not a whole {what}")
        value = int(raw)
    elif isinstance(raw, int):
        value = raw
    else:
        text = str(raw).strip()
        if not text:
            raise SpecError(f"{where}: empty value where a {what} belongs")
        try:
            value = int(text)
        except ValueError:
            raise SpecError(f"{where}: {text!r} is not a {what}") from None
    if value <= 0:
        raise SpecError(f"{where}: {value} is not a positive {what}")
    if value > MAX_TOKENS:
        raise SpecError(f"{where}: {value} tokens is more than any sample could hold "
                        f"(limit {MAX_TOKENS:,}); are these bytes or characters?")
    return value


def _existing(path: Path, kind: str) -> None:
    if not path.exists():
        raise SpecError(f"{kind} {path}: no such file")
    if path.is_dir():
        raise SpecError(f"{kind} {path}: is a directory, not a file")


def _text_lines(path: Path, kind: str) -> list[str]:
    _existing(path, kind)
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise SpecError(f"{kind} {path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise SpecError(f"{kind} {path}: cannot be read ({exc.strerror})") from None


def _read_text_lengths(path: Path) -> list[Sample]:
    samples: list[Sample] = []
    width = 0  # fields per line: 1 (lengths) or 2 (input/target pairs), fixed by the first line
    first = 0
    for number, line in enumerate(_text_lines(path, "lengths file"), start=1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        where = f"lengths file {path} line {number}"
        fields = [f for f in re.split(r"[,\s]+", body) if f]
        if len(fields) > 2:
            raise SpecError(f"{where}: {body!r} is neither a token count nor an "
                            f"'input,target' pair")
        if width == 0:
            width, first = len(fields), number
        elif len(fields) != width:
            kinds = {1: "a single count", 2: "an input,target pair"}
            raise SpecError(f"{where}: {kinds[len(fields)]}, but line {first} has "
                            f"{kinds[width]}; use one form throughout")
        target = _count(fields[1], where, "target token count") if width == 2 else 0
        samples.append(Sample(_count(fields[0], where), target))
    return samples


def _pick_columns(path: Path, names: Sequence[str], numeric: Sequence[str],
                  column: str | None, target_column: str | None) -> tuple[str, str | None]:
    """The input and target columns: named, else by conventional name, else the numeric one."""
    where = f"lengths file {path}"
    listing = ", ".join(names) or "none"
    for given in (column, target_column):
        if given is not None and given not in names:
            raise SpecError(f"{where}: no column {given!r} (columns: {listing})")
    target = target_column
    if target is None:
        target = next((c for c in names if c.strip().lower() in TARGET_COLUMNS
                       and c != column), None)
    if column is None:
        column = next((c for c in names if c.strip().lower() in LENGTH_COLUMNS), None)
    if column is None:
        candidates = [c for c in numeric if c != target]
        if len(candidates) != 1:
            found = ", ".join(candidates) or "none"
            raise SpecError(f"{where}: cannot tell which column holds the lengths (numeric "
                            f"columns: {found}); name it, or call it one of "
                            f"{', '.join(LENGTH_COLUMNS)}")
        column = candidates[0]
    if target == column:
        raise SpecError(f"{where}: column {column!r} cannot be both the input and the "
                        f"target lengths")
    return column, target


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_csv_lengths(path: Path, column: str | None,
                      target_column: str | None) -> list[Sample]:
    lines = _text_lines(path, "lengths file")
    rows = list(csv.reader(lines))
    numbered = [(i, row) for i, row in enumerate(rows, start=1) if any(c.strip() for c in row)]
    if not numbered:
        raise SpecError(f"lengths file {path}: no samples (the file is empty)")
    header_line, header = numbered[0]
    names = [h.strip() for h in header]
    if all(_is_number(h) for h in names):
        raise SpecError(f"lengths file {path} line {header_line}: the first row must be a "
                        f"header naming the columns, not {','.join(names)!r}")
    data = numbered[1:]
    numeric = [n for j, n in enumerate(names)
               if data and all(j < len(r) and _is_number(r[j].strip()) for _, r in data)]
    column, target = _pick_columns(path, names, numeric, column, target_column)
    col, tcol = names.index(column), (names.index(target) if target is not None else None)
    samples = []
    for line, row in data:
        where = f"lengths file {path} line {line}"
        if len(row) != len(names):
            raise SpecError(f"{where}: {len(row)} fields, but the header has {len(names)}")
        value = _count(row[col], f"{where} column {column!r}")
        tvalue = (_count(row[tcol], f"{where} column {target!r}", "target token count")
                  if tcol is not None else 0)
        samples.append(Sample(value, tvalue))
    return samples


def _read_parquet_lengths(path: Path, column: str | None,
                          target_column: str | None) -> list[Sample]:
    _existing(path, "lengths file")
    try:
        import pyarrow as pa  # optional dependency, only for Parquet files
        import pyarrow.parquet as pq
        import pyarrow.types as pat
    except ImportError:
        raise SpecError("reading Parquet needs pyarrow: pip install pyarrow") from None
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as exc:  # ArrowInvalid for a bad file
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SpecError(f"lengths file {path}: not a readable Parquet file ({first})") from None
    names = list(table.column_names)
    numeric = [f.name for f in table.schema
               if pat.is_integer(f.type) or pat.is_floating(f.type)]
    column, target = _pick_columns(path, names, numeric, column, target_column)
    inputs = table.column(column).to_pylist()
    targets = table.column(target).to_pylist() if target is not None else [0] * len(inputs)
    samples = []
    for row, (value, tvalue) in enumerate(zip(inputs, targets), start=1):
        where = f"lengths file {path} row {row}"
        if value is None or (target is not None and tvalue is None):
            raise SpecError(f"{where}: missing value in column "
                            f"{column if value is None else target!r}")
        samples.append(Sample(
            _count(value, f"{where} column {column!r}"),
            _count(tvalue, f"{where} column {target!r}", "target token count")
            if target is not None else 0))
    return samples


def read_lengths(path: str | Path, *, column: str | None = None,
                 target_column: str | None = None) -> LengthDataset:
    """A dataset's token counts from a file.

    * ``.txt`` or no suffix: one count per line, or ``input,target`` / ``input target`` /
      ``input<TAB>target`` pairs; blank lines and ``#`` comments are skipped.
    * ``.csv``: a header row; `column` holds the input lengths (default: a column named
      length, input_len, len or tokens, else the only numeric column), `target_column` the
      target lengths (default: target_len or target when present).
    * ``.parquet``: the same columns, read with pyarrow.

    Raises:
        SpecError: a missing, empty or unreadable file, or a value that is not a positive
            whole token count up to 10,000,000, naming the file and line/row.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in ("", ".txt"):
        samples = _read_text_lengths(path)
    elif suffix == ".csv":
        samples = _read_csv_lengths(path, column, target_column)
    elif suffix == ".parquet":
        samples = _read_parquet_lengths(path, column, target_column)
    else:
        raise SpecError(f"lengths file {path}: unknown format {path.suffix!r} (use .txt, .csv "
                        f"or .parquet; text to tokenize goes through --tokenizer)")
    if not samples:
        raise SpecError(f"lengths file {path}: no samples (the file is empty or only comments)")
    return LengthDataset(name=path.stem, samples=tuple(samples), source=str(path))


# --------------------------------------------------------------------------------------------
# Tokenized text


def _load_tokenizer(tokenizer: str | Path) -> tuple[Any, Path]:
    """A `tokenizers.Tokenizer` from a local file, without truncation or padding."""
    try:
        from tokenizers import Tokenizer  # optional dependency, only for --tokenizer
    except ImportError:
        raise SpecError("counting tokens with --tokenizer needs the tokenizers package: "
                        "pip install tokenizers") from None
    path = Path(tokenizer)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise SpecError(f"tokenizer {path}: no such file (give a tokenizer.json or the folder "
                        f"holding one)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 -- tokenizers raises a bare Exception here
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SpecError(f"tokenizer {path}: not a valid tokenizer.json ({first})") from None
    # A saved tokenizer may truncate or pad; either would hide the true lengths.
    tok.no_truncation()
    tok.no_padding()
    return tok, path


def _texts(path: Path, field: str,
           target_field: str | None) -> Iterator[tuple[int, str, str | None]]:
    """(line number, input text, target text) of each sample of a .txt or .jsonl file."""
    suffix = path.suffix.lower()
    for number, line in enumerate(_text_lines(path, "text file"), start=1):
        if not line.strip():
            continue
        if suffix != ".jsonl":
            yield number, line, None
            continue
        where = f"text file {path} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise SpecError(f"{where}: not a JSON object")
        values: list[str | None] = []
        for name in (field, target_field):
            if name is None:
                values.append(None)
                continue
            if name not in obj:
                raise SpecError(f"{where}: no field {name!r} (fields: "
                                f"{', '.join(map(str, obj)) or 'none'})")
            if not isinstance(obj[name], str):
                raise SpecError(f"{where}: field {name!r} is not a string")
            values.append(obj[name])
        yield number, str(values[0]), values[1]


def tokenize_lengths(path: str | Path, tokenizer: str | Path, *, field: str = "text",
                     target_field: str | None = None) -> LengthDataset:
    """Token counts of a text dataset, counted with a locally installed tokenizer.

    `path` is a .txt file (one sample per line) or a .jsonl file of objects with `field` and,
    for encoder-decoder data, `target_field`. `tokenizer` is a tokenizer.json file or a folder
    holding one, loaded with the `tokenizers` package; nothing is downloaded. Counts include
    the special tokens the tokenizer adds, as training sees them.

    Raises:
        SpecError: a missing package, tokenizer or text file, a malformed line, or a sample
            that tokenizes to no tokens, naming the file and line.
    """
    path = Path(path)
    if path.suffix.lower() not in ("", ".txt", ".jsonl"):
        raise SpecError(f"text file {path}: unknown format {path.suffix!r} (use .txt, one "
                        f"sample per line, or .jsonl)")
    _existing(path, "text file")
    tok, tok_path = _load_tokenizer(tokenizer)
    rows = list(_texts(path, field, target_field))
    if not rows:
        raise SpecError(f"text file {path}: no samples (the file is empty)")
    inputs = tok.encode_batch([text for _, text, _ in rows])
    targets = (tok.encode_batch([t or "" for _, _, t in rows]) if target_field is not None
               else None)
    in_name = f" field {field!r}" if path.suffix.lower() == ".jsonl" else ""
    samples = []
    for i, (number, _, _) in enumerate(rows):
        where = f"text file {path} line {number}"
        if not inputs[i].ids:
            raise SpecError(f"{where}{in_name}: tokenizes to no tokens")
        tvalue = 0
        if targets is not None:
            if not targets[i].ids:
                raise SpecError(f"{where} field {target_field!r}: tokenizes to no tokens")
            tvalue = _count(len(targets[i].ids), where, "target token count")
        samples.append(Sample(_count(len(inputs[i].ids), where), tvalue))
    return LengthDataset(name=path.stem, samples=tuple(samples),
                         source=f"{path} tokenized with {tok_path}")


# --------------------------------------------------------------------------------------------
# Synthetic mixtures


@dataclass(frozen=True, kw_only=True, slots=True)
class LengthDist:
    """One component's length distribution (see data/length_mixtures.yaml)."""

    dist: str
    """"lognormal" (median, sigma) or "uniform" (low, high)."""
    a: float
    """lognormal: median tokens; uniform: lowest length."""
    b: float
    """lognormal: sigma of the natural log; uniform: highest length."""
    source: str

    def draw(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
        if self.dist == "lognormal":
            return rng.lognormal(math.log(self.a), self.b, n)
        return rng.integers(int(self.a), int(self.b), n, endpoint=True).astype(np.float64)


@dataclass(frozen=True, kw_only=True, slots=True)
class MixtureComponent:
    """One task family (and prompt style) of a mixture."""

    name: str
    weight: float
    weight_source: str
    input: LengthDist
    target: LengthDist | None


@dataclass(frozen=True, kw_only=True, slots=True)
class LengthMixture:
    """A synthetic dataset: a weighted mixture of length distributions, clipped at the tail."""

    name: str
    description: str
    imitates: str
    max_input: int
    max_target: int
    components: tuple[MixtureComponent, ...]
    expected: Mapping[str, float]
    """Percentiles the parameters imply (input_p50, ...), checked by the tests."""


def _num(where: str, raw: object, *, positive: bool = True) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise DataFileError(f"{where}={raw!r} must be a number")
    if positive and raw <= 0:
        raise DataFileError(f"{where}={raw!r} must be positive")
    return float(raw)


def _source(where: str, raw: Mapping[str, Any]) -> str:
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        raise DataFileError(f"{where}.source: must be a non-empty string (a citation, or "
                            f"'assumed: ...')")
    return source


def _sourced_value(where: str, raw: object, *, positive: bool = True) -> tuple[float, str]:
    if not isinstance(raw, Mapping) or set(raw) != {"value", "source"}:
        raise DataFileError(f"{where}: must be a mapping with exactly 'value' and 'source'")
    return _num(f"{where}.value", raw["value"], positive=positive), _source(where, raw)


def _dist(where: str, raw: object) -> LengthDist:
    if not isinstance(raw, Mapping):
        raise DataFileError(f"{where}: must be a mapping with dist, its parameters and source")
    params = {"lognormal": ("median", "sigma"), "uniform": ("low", "high")}
    kind = raw.get("dist")
    if kind not in params:
        raise DataFileError(f"{where}.dist={kind!r} must be one of {', '.join(params)}")
    keys = params[kind]
    if set(raw) != {"dist", "source", *keys}:
        raise DataFileError(f"{where}: a {kind} needs exactly dist, {', '.join(keys)}, source")
    a, b = (_num(f"{where}.{k}", raw[k]) for k in keys)
    if kind == "uniform" and (a != int(a) or b != int(b) or a > b):
        raise DataFileError(f"{where}: low and high must be whole tokens with low <= high")
    return LengthDist(dist=kind, a=a, b=b, source=_source(where, raw))


def parse_mixtures(data: object, where: str = _WHERE) -> dict[str, LengthMixture]:
    """Validate a length_mixtures.yaml document; errors are one line naming the field."""
    if not isinstance(data, Mapping) or set(data) != {"mixtures"}:
        raise DataFileError(f"{where}: must have exactly one top-level key 'mixtures'")
    mixtures = data["mixtures"]
    if not isinstance(mixtures, Mapping) or not mixtures:
        raise DataFileError(f"{where}: mixtures must map mixture names to their fields")
    fields = {"description", "imitates", "max_input", "max_target", "expected", "components"}
    out: dict[str, LengthMixture] = {}
    for name, raw in mixtures.items():
        at = f"{where}: mixtures.{name}"
        if not isinstance(raw, Mapping) or set(raw) != fields:
            raise DataFileError(f"{at}: must have exactly the fields {', '.join(sorted(fields))}")
        max_input, _ = _sourced_value(f"{at}.max_input", raw["max_input"])
        max_target, _ = _sourced_value(f"{at}.max_target", raw["max_target"], positive=False)
        comps_raw = raw["components"]
        if not isinstance(comps_raw, Mapping) or not comps_raw:
            raise DataFileError(f"{at}.components: must map component names to their fields")
        comps = []
        for cname, craw in comps_raw.items():
            cat = f"{at}.components.{cname}"
            if not isinstance(craw, Mapping) or not {"weight", "input"} <= set(craw) or (
                    set(craw) - {"weight", "input", "target"}):
                raise DataFileError(f"{cat}: must have weight, input and optionally target")
            weight, wsource = _sourced_value(f"{cat}.weight", craw["weight"])
            target = _dist(f"{cat}.target", craw["target"]) if "target" in craw else None
            if (target is None) != (max_target == 0):
                raise DataFileError(f"{cat}: has a target distribution exactly when "
                                    f"max_target > 0")
            comps.append(MixtureComponent(name=str(cname), weight=weight, weight_source=wsource,
                                          input=_dist(f"{cat}.input", craw["input"]),
                                          target=target))
        total = sum(c.weight for c in comps)
        if abs(total - 1.0) > 1e-6:
            raise DataFileError(f"{at}.components: weights sum to {total:g}, not 1")
        expected_raw = raw["expected"]
        if not isinstance(expected_raw, Mapping):
            raise DataFileError(f"{at}.expected: must map percentiles to values, with a source")
        _source(f"{at}.expected", expected_raw)
        expected = {str(k): _num(f"{at}.expected.{k}", v)
                    for k, v in expected_raw.items() if k != "source"}
        out[str(name).lower()] = LengthMixture(
            name=str(name).lower(), description=str(raw["description"]),
            imitates=str(raw["imitates"]), max_input=int(max_input),
            max_target=int(max_target), components=tuple(comps), expected=expected)
    return out


@functools.cache
def _mixtures() -> dict[str, LengthMixture]:
    return parse_mixtures(read_data_yaml(_FILE))


def list_mixtures() -> list[str]:
    """Names of the synthetic length mixtures, in file order."""
    return list(_mixtures())


def get_mixture(name: str) -> LengthMixture:
    """A synthetic length mixture by name (case-insensitive).

    Raises:
        UnknownNameError: listing the known mixtures.
    """
    mixture = _mixtures().get(name.strip().lower())
    if mixture is None:
        raise unknown_name("length mixture", name, list_mixtures())
    return mixture


def synthetic(name: str, *, samples: int = 10_000, seed: int = 0) -> LengthDataset:
    """`samples` draws from the named mixture; the same (name, samples, seed) gives the same data.

    Each sample picks a component by weight, then its lengths; draws are rounded to whole
    tokens and clipped to [1, max_input] / [1, max_target].

    Raises:
        UnknownNameError: an unknown mixture, listing the known ones.
        SpecError: fewer than one sample.
    """
    mixture = get_mixture(name)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise SpecError(f"samples={samples!r} must be a whole number >= 1")
    rng = np.random.default_rng(seed)
    weights = np.array([c.weight for c in mixture.components])
    picks = rng.choice(len(weights), size=samples, p=weights / weights.sum())
    inputs = np.zeros(samples)
    targets = np.zeros(samples)
    for k, comp in enumerate(mixture.components):  # fixed order keeps draws reproducible
        idx = np.flatnonzero(picks == k)
        inputs[idx] = comp.input.draw(rng, idx.size)
        if comp.target is not None:
            targets[idx] = comp.target.draw(rng, idx.size)
    ins = np.clip(np.rint(inputs), 1, mixture.max_input).astype(np.int64)
    outs = (np.clip(np.rint(targets), 1, mixture.max_target).astype(np.int64)
            if mixture.max_target > 0 else np.zeros(samples, dtype=np.int64))
    return LengthDataset(
        name=mixture.name,
        samples=tuple(Sample(int(i), int(t)) for i, t in zip(ins, outs)),
        source=f"synthetic mixture {mixture.name} (samples={samples}, seed={seed}; {_WHERE})")


# --------------------------------------------------------------------------------------------
# Maximum length and global batches


def _positive(flag: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{flag} {value!r} must be a whole number >= 1")
    return value


def fit_max_len(dataset: LengthDataset, max_len: int, *, policy: str = "truncate",
                max_target_len: int | None = None) -> LengthDataset:
    """`dataset` within the model's maximum input (and target) length.

    "truncate" clips longer samples, as a data loader cutting token lists would; "reject"
    refuses the dataset, naming the first sample that does not fit. Targets are held to
    `max_target_len`, or `max_len` when it is not given.

    Raises:
        SpecError: an unknown policy, a limit below 1, or (reject) a too-long sample.
    """
    _positive("--max-len", max_len)
    target_limit = _positive("--max-target-len",
                             max_len if max_target_len is None else max_target_len)
    if policy not in ON_LONG_POLICIES:
        raise SpecError(f"--on-long {policy!r} must be one of {', '.join(ON_LONG_POLICIES)}")
    long = [i for i, s in enumerate(dataset.samples)
            if s.input_len > max_len or s.target_len > target_limit]
    if not long:
        return dataset
    if policy == "reject":
        i = long[0]
        s = dataset.samples[i]
        if s.input_len > max_len:
            what = f"{s.input_len} input tokens, more than the maximum length {max_len}"
        else:
            what = (f"{s.target_len} target tokens, more than the maximum target length "
                    f"{target_limit}")
        raise SpecError(f"sample {i} of {dataset.name} has {what} ({len(long)} samples are "
                        f"too long); --on-long truncate would clip it")
    clipped = tuple(Sample(min(s.input_len, max_len), min(s.target_len, target_limit))
                    for s in dataset.samples)
    return LengthDataset(name=dataset.name, samples=clipped,
                         source=f"{dataset.source}; {len(long)} samples truncated to "
                                f"{max_len}/{target_limit} tokens")


def iteration_batches(dataset: LengthDataset, tokens_per_batch: int, *, iterations: int,
                      seed: int = 0) -> list[tuple[Sample, ...]]:
    """`iterations` global batches cut by token budget, as DynaPipe's data loader feeds them.

    The samples are shuffled (seeded), then each batch takes samples in that order until the
    next one would push it past `tokens_per_batch` (input + target tokens). A pass over the data
    uses every sample once; its last batch may be short, and the next pass is reshuffled, so no
    batch holds a sample twice.

    Raises:
        SpecError: a budget or iteration count below 1, an empty dataset, or a budget smaller
            than the longest sample.
    """
    _positive("--tokens-per-batch", tokens_per_batch)
    _positive("--iterations", iterations)
    n = len(dataset.samples)
    if n == 0:
        raise SpecError(f"dataset {dataset.name} has no samples")
    sizes = dataset.lengths() + dataset.targets()
    longest = int(np.argmax(sizes))
    if sizes[longest] > tokens_per_batch:
        raise SpecError(f"--tokens-per-batch {tokens_per_batch} is smaller than sample "
                        f"{longest} ({int(sizes[longest])} tokens): no batch can hold it")
    rng = np.random.default_rng(seed)
    batches: list[tuple[Sample, ...]] = []
    order = rng.permutation(n)
    pos = 0
    while len(batches) < iterations:
        batch: list[Sample] = []
        used = 0
        while pos < n and used + int(sizes[order[pos]]) <= tokens_per_batch:
            batch.append(dataset.samples[order[pos]])
            used += int(sizes[order[pos]])
            pos += 1
        batches.append(tuple(batch))
        if pos == n:
            order = rng.permutation(n)
            pos = 0
    return batches
