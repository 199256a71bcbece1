"""A sweep spec: its YAML schema, its checks, and its expansion into keyed scenarios.

A spec names models × clusters × plans (or planners) × knobs::

    models: [gpt3-1.3b, gpt3-2.7b]          # zoo names or model files
    clusters: [4xV100-SXM2-32GB]            # cluster specs or cluster YAML files
    plans:                                  # plan field sets, each combined with every knob value
      - {pp: 4}
      - {dp: 2, tp: 2}
    planners:                               # or/and: run a planner, record its best plan
      - {method: grid, time_budget_s: 5}
      - {method: hetero, max_evals: 200}     # hetero/fasop/uniform: counted, not timed
    knobs:                                  # any ParallelPlan field -> the values to try
      global_batch: [64, 128]
      recompute: [none, full]

Design choices (and why):

* A plan entry is a set of *overrides to the default plan* (workloads/plan_defaults.py), as
  `sim simulate --tp 2` flags are: `{tp: 2}` gets dp from the cluster's size and the default
  global batch, so one entry fits clusters of different sizes. With neither `plans` nor
  `planners`, the sweep runs the default plan (`plans: [{}]`).
* Everything that can be checked before the work starts is: unknown keys, model and cluster
  names (loaded once here), knob names (ParallelPlan fields), value types, duplicates, and
  the size (at most MAX_SCENARIOS). Each problem is one line naming the offending key. Whether
  a *value* makes a valid plan (dp×tp×pp against the cluster, a recompute policy name, memory)
  is the scenario's answer, recorded as a row with `error` set, not a refusal of the sweep.
* Planners choose the plan's fields themselves, so with `planners` the only knob is
  `global_batch` (the one input a planner takes); other knobs are refused.
* A scenario's key is the sha256 of its canonical JSON (sorted keys, no spaces) and trainsim's
  version, plus the sha256 of any model or cluster *file* it reads: a changed input, file or
  trainsim release recomputes the row; an unchanged one is skipped on rerun. Its position in
  the spec (`index`) is not part of the key, so reordering a spec reuses every row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainsim.errors import DataFileError, SpecError, TrainsimError, read_user_text, unknown_name
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.methods import EVALUATION_BUDGET_METHODS, PLANNERS
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.plan_file import TRAINSIM_VERSION
from trainsim.workloads.zoo import get_model

MAX_SCENARIOS = 100_000
"""Sweeps larger than this are refused before any work starts (a table of 100,000 rows is
about 10 MB; split bigger studies into several specs)."""

SPEC_KEYS = ("models", "clusters", "plans", "planners", "knobs", "description")
"""Top-level keys a spec may have (`description` is free text, not part of any key)."""

PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(ParallelPlan))
"""Names a plan entry or a knob may set."""

PLANNER_KEYS = ("method", "time_budget_s", "objective", "memory_limit_gb", "max_evals")
"""Keys of a planner entry: `method` (required) and the options `sim search` takes;
`max_evals` (hetero, fasop, uniform: `sim search --max-evals`) bounds the search by Oracle
evaluations, so its row is the same on any machine whenever that budget runs out before
`time_budget_s`."""

PLANNER_KNOBS = ("global_batch",)
"""The knobs a planner scenario takes (a planner chooses every other plan field)."""

DEFAULT_PLANNER_BUDGET_S = 10.0
"""A planner entry's `time_budget_s` when it gives none."""

EXAMPLE_NAME = "example"
"""`sim sweep example` runs this built-in spec (the README's example; no file needed)."""

EXAMPLE_SPEC = """\
description: trainsim's built-in example sweep (sim sweep example)
models: [gpt3-2.7b, gpt3-6.7b]   # gpt3-6.7b runs out of memory under some plans (oom rows)
clusters: [4xV100-SXM2-32GB, 8xA100-SXM4-40GB]
plans:
  - {pp: 4}
  - {tp: 2}
  - {dp: 3}          # a bad plan on both clusters: recorded as a row with its error
knobs:
  global_batch: [32, 64]
  recompute: [none, full]
"""
"""A 48-scenario spec (2 models × 2 clusters × 3 plans × 4 knob settings) with a bad plan and
OOM plans on purpose: a couple of seconds on two cores."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """One point of a sweep: a model on a cluster under a plan (or a planner) and knob values."""

    index: int
    """Position in the spec's expansion (the table's row order)."""
    model: str
    """The model as the spec names it."""
    cluster: str
    """The cluster as the spec names it."""
    plan: dict[str, Any] | None
    """Plan field overrides of a plan entry (knobs not included); None for a planner."""
    planner: dict[str, Any] | None
    """A planner entry (`method`, options); None for a plan scenario."""
    knobs: dict[str, Any]
    """Knob name -> this scenario's value."""
    key: str
    """Content hash: sha256 of the canonical JSON and trainsim's version (module docstring)."""

    def fields(self) -> dict[str, Any]:
        """The plan overrides this scenario runs: the plan entry's fields, then the knobs."""
        return {**(self.plan or {}), **self.knobs}


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """A checked sweep spec (the YAML's fields, normalised)."""

    models: tuple[str, ...]
    clusters: tuple[str, ...]
    plans: tuple[dict[str, Any], ...]
    planners: tuple[dict[str, Any], ...]
    knobs: dict[str, tuple[Any, ...]]
    """Knob name -> values, in the spec's order (the scenario order varies the last fastest)."""
    where: str = "sweep spec"
    """How errors name the spec (its path, or "sweep spec")."""
    file_hashes: dict[str, str] = dataclasses.field(default_factory=dict)
    """sha256 of each model or cluster given as a file, by the name the spec uses."""

    @property
    def size(self) -> int:
        """Number of scenarios the spec expands to."""
        return (len(self.models) * len(self.clusters) * (len(self.plans) + len(self.planners))
                * math.prod(len(v) for v in self.knobs.values()))

    def scenarios(self) -> list[Scenario]:
        """Every scenario in a fixed order: model, cluster, plan entries then planner entries,
        then knob values (the last knob varies fastest)."""
        names = list(self.knobs)
        combos = [dict(zip(names, values, strict=True))
                  for values in itertools.product(*(self.knobs[n] for n in names))]
        entries: list[tuple[dict[str, Any] | None, dict[str, Any] | None]] = [
            (p, None) for p in self.plans] + [(None, p) for p in self.planners]
        out: list[Scenario] = []
        for model in self.models:
            for cluster in self.clusters:
                for plan, planner in entries:
                    for knobs in combos:
                        key = scenario_key(model, cluster, plan, planner, knobs,
                                           self.file_hashes)
                        out.append(Scenario(index=len(out), model=model, cluster=cluster,
                                            plan=plan, planner=planner, knobs=knobs, key=key))
        return out


def canonical_json(doc: Any) -> str:
    """Sorted keys, no spaces, strict floats: one text per value, on any machine."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)


def scenario_key(model: str, cluster: str, plan: Mapping[str, Any] | None,
                 planner: Mapping[str, Any] | None, knobs: Mapping[str, Any],
                 file_hashes: Mapping[str, str] | None = None) -> str:
    """sha256 (hex) of a scenario's canonical JSON, the file hashes it reads and trainsim's
    version: equal inputs give equal keys in any process, changed ones a new key."""
    files = file_hashes or {}
    doc = {"model": model, "cluster": cluster, "plan": plan, "planner": planner,
           "knobs": knobs, "files": {n: files[n] for n in (model, cluster) if n in files},
           "trainsim": TRAINSIM_VERSION}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def _json_value(value: Any, where: str) -> Any:
    """`value` if it is plain JSON (null, bool, finite number, string, lists and maps of them);
    a SpecError naming `where` otherwise (YAML dates, NaN, ...)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SpecError(f"{where}: {value!r} is not a finite number")
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SpecError(f"{where}: key {k!r} must be a string")
            out[k] = _json_value(v, f"{where}.{k}")
        return out
    raise SpecError(f"{where}: {value!r} is not a number, string, true/false, list or null")


def _names(doc: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = doc.get(key)
    if value is None:
        raise SpecError(f"{where}: '{key}' is missing (a list of {key}, e.g. {key}: "
                        f"[{'gpt3-1.3b' if key == 'models' else '4xV100-SXM2-32GB'}])")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where}: '{key}' must be a non-empty list of names")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name.strip():
            raise SpecError(f"{where}: {key}[{i}]={name!r} must be a non-empty name")
    _no_duplicates(value, f"{where}: {key}")
    return tuple(value)


def _no_duplicates(values: Sequence[Any], where: str) -> None:
    seen: set[str] = set()
    for v in values:
        text = canonical_json(v)
        if text in seen:
            raise SpecError(f"{where} lists {v!r} twice")
        seen.add(text)


def _entries(doc: Mapping[str, Any], key: str, where: str) -> tuple[dict[str, Any], ...]:
    value = doc.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where}: '{key}' must be a non-empty list of mappings")
    out = []
    allowed = PLAN_FIELDS if key == "plans" else PLANNER_KEYS
    for i, entry in enumerate(value):
        entry = {} if entry is None else entry
        if not isinstance(entry, Mapping):
            raise SpecError(f"{where}: {key}[{i}] must be a mapping of "
                            f"{'plan fields' if key == 'plans' else 'planner options'}, "
                            f"not {entry!r}")
        for name in entry:
            if name not in allowed:
                what = "plan field" if key == "plans" else "planner option"
                raise SpecError(f"{where}: {key}[{i}]: "
                                f"{unknown_name(what, str(name), allowed)}")
        out.append(_json_value(dict(entry), f"{where}: {key}[{i}]"))
    _no_duplicates(out, f"{where}: {key}")
    return tuple(out)


def _planner(entry: dict[str, Any], where: str) -> dict[str, Any]:
    """A planner entry with its defaults filled, checked."""
    method = entry.get("method")
    if method is None:
        raise SpecError(f"{where}: 'method' is missing (one of {', '.join(PLANNERS)})")
    if method not in PLANNERS:
        raise SpecError(f"{where}: {unknown_name('search method', str(method), PLANNERS)}")
    budget = entry.get("time_budget_s", DEFAULT_PLANNER_BUDGET_S)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) \
            or not 0 < budget <= 3600:
        raise SpecError(f"{where}: time_budget_s={budget!r} must be a number of seconds in "
                        f"(0, 3600]")
    out = {"method": method, "time_budget_s": float(budget),
           "objective": entry.get("objective", "throughput")}
    if not isinstance(out["objective"], str):
        raise SpecError(f"{where}: objective={out['objective']!r} must be throughput, cost or "
                        f"energy")
    limit = entry.get("memory_limit_gb")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise SpecError(f"{where}: memory_limit_gb={limit!r} must be a positive number")
        out["memory_limit_gb"] = float(limit)
    evals = entry.get("max_evals")
    if evals is not None:
        if isinstance(evals, bool) or not isinstance(evals, int) or evals < 1:
            raise SpecError(f"{where}: max_evals={evals!r} must be a whole number >= 1")
        if method not in EVALUATION_BUDGET_METHODS:
            raise SpecError(f"{where}: max_evals applies to "
                            f"{', '.join(EVALUATION_BUDGET_METHODS)}; method {method} is "
                            f"bounded by time_budget_s only")
        out["max_evals"] = evals
    return out


def _knobs(doc: Mapping[str, Any], where: str) -> dict[str, tuple[Any, ...]]:
    value = doc.get("knobs")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: 'knobs' must map plan fields to lists of values")
    out: dict[str, tuple[Any, ...]] = {}
    for name, values in value.items():
        if name not in PLAN_FIELDS:
            raise SpecError(f"{where}: knobs: {unknown_name('plan field', str(name), PLAN_FIELDS)}")
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise SpecError(f"{where}: knobs.{name} must list at least one value")
        checked = [_json_value(v, f"{where}: knobs.{name}[{i}]") for i, v in enumerate(values)]
        _no_duplicates(checked, f"{where}: knobs.{name}")
        out[str(name)] = tuple(checked)
    return out


def parse_spec(doc: Any, where: str = "sweep spec") -> SweepSpec:
    """Check a spec document (the YAML's mapping) and load its models and clusters once, so
    every problem shows before the work starts, as one line naming the key."""
    if not isinstance(doc, Mapping):
        raise SpecError(f"{where}: expected a mapping with models, clusters, plans or "
                        f"planners, and knobs")
    for key in doc:
        if key not in SPEC_KEYS:
            raise SpecError(f"{where}: {unknown_name('key', str(key), SPEC_KEYS)}")
    models = _names(doc, "models", where)
    clusters = _names(doc, "clusters", where)
    plans = _entries(doc, "plans", where)
    planners = tuple(_planner(p, f"{where}: planners[{i}]")
                     for i, p in enumerate(_entries(doc, "planners", where)))
    knobs = _knobs(doc, where)
    if not plans and not planners:
        plans = ({},)
    for i, plan in enumerate(plans):
        both = sorted(set(plan) & set(knobs))
        if both:
            raise SpecError(f"{where}: plans[{i}] sets {both[0]!r}, which is also a knob; "
                            f"set it in one place")
    if planners:
        other = [k for k in knobs if k not in PLANNER_KNOBS]
        if other:
            raise SpecError(f"{where}: knobs.{other[0]}: with planners, the only knob is "
                            f"global_batch (a planner chooses the other plan fields)")
    spec = SweepSpec(models=models, clusters=clusters, plans=plans, planners=planners,
                     knobs=knobs, where=where)
    if spec.size > MAX_SCENARIOS:
        raise SpecError(f"{where}: {spec.size:,} scenarios; at most {MAX_SCENARIOS:,} "
                        f"(split the sweep into several specs)")
    hashes: dict[str, str] = {}
    checks: tuple[tuple[str, Sequence[str], Callable[[str], object]], ...] = (
        ("models", models, get_model), ("clusters", clusters, parse_cluster))
    for field_name, names, load in checks:
        for i, name in enumerate(names):
            try:
                load(name)
            except TrainsimError as exc:
                raise SpecError(f"{where}: {field_name}[{i}]: {exc}") from None
            hashes.update(_file_hash(name))
    return dataclasses.replace(spec, file_hashes=hashes)


def _file_hash(name: str) -> dict[str, str]:
    path = Path(name)
    if not path.is_file():
        return {}
    return {name: hashlib.sha256(path.read_bytes()).hexdigest()}


def load_spec(source: str | Path | Mapping[str, Any]) -> SweepSpec:
    """A checked spec from a YAML file, the built-in name `example`, or a mapping."""
    if isinstance(source, Mapping):
        return parse_spec(source)
    if str(source) == EXAMPLE_NAME and not Path(source).exists():
        return parse_spec(yaml.safe_load(EXAMPLE_SPEC), "sweep spec 'example'")
    path = Path(source)
    where = f"sweep spec {str(path)!r}"
    if not path.exists():
        raise SpecError(f"{where} does not exist (give a YAML file, or '{EXAMPLE_NAME}' for "
                        f"the built-in example)")
    if not path.is_file():
        raise SpecError(f"{where} is not a file")
    try:
        doc = yaml.safe_load(read_user_text(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise DataFileError(f"{where} is not valid YAML{at}") from None
    return parse_spec(doc, where)


__all__ = ["EXAMPLE_NAME", "EXAMPLE_SPEC", "MAX_SCENARIOS", "PLAN_FIELDS", "Scenario",
           "SweepSpec", "canonical_json", "load_spec", "parse_spec", "scenario_key"]
