"""Per-instruction time/energy options per SM frequency: the input of the energy planner.

Perseus (Chung et al., SOSP'24, §4.1) profiles every pipeline instruction (forward, backward) of
every stage at every supported SM frequency and keeps, per instruction, the (time, energy)
options. This module holds that table as an `EnergyProfile`, loads it from a Perseus-style CSV
(``stage,instruction,frequency,time,energy``; time in seconds per micro-batch instruction, energy
in joules per GPU) with strict checks, or builds it from trainsim's own DVFS/power model for any
plan the engine can lower (`profile_from_model`).

Blocking power (what a GPU draws while it waits on a pipeline peer, Perseus §2.2) is the GPU
type's `idle_power_w` in hwmodels/data/gpus.json (83.64 W A100-SXM4 and 70.38 W A40, measured
by Perseus).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.errors import DataFileError, SpecError
from trainsim.hwmodels.cluster import Cluster
from trainsim.hwmodels.gpus import get_gpu
from trainsim.workloads.lowering import LoweringOptions, stage_layout
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import ParallelPlan

#: Instruction names of the 1F1B pipeline, in Perseus's CSV spelling.
INSTRUCTIONS: tuple[str, ...] = ("forward", "backward")

#: CSV header of a Perseus stage profile.
CSV_COLUMNS: tuple[str, ...] = ("stage", "instruction", "frequency", "time", "energy")

#: Measured profiles are noisy: a higher frequency may be this much slower than a lower one
#: (the Perseus A40 profiles have up to +10.5% over a lower clock) before the row is rejected as
#: non-monotone garbage.
MONOTONE_TOLERANCE: float = 0.25


@dataclass(frozen=True, kw_only=True, slots=True)
class InstructionOptions:
    """The frequency options of one instruction of one stage, fastest clock first."""

    freq_mhz: np.ndarray
    """SM clocks (MHz), descending."""
    time_s: np.ndarray
    """Time per micro-batch instruction at each clock (s)."""
    energy_j: np.ndarray
    """Energy per instruction per GPU at each clock (J)."""

    def __post_init__(self) -> None:
        n = len(self.freq_mhz)
        if n == 0 or len(self.time_s) != n or len(self.energy_j) != n:
            raise SpecError("instruction options need equally long, non-empty freq/time/energy")
        if np.any(~np.isfinite(self.time_s)) or np.any(self.time_s <= 0):
            raise SpecError(f"instruction options: time_s={self.time_s!r} must be finite > 0")
        if np.any(~np.isfinite(self.energy_j)) or np.any(self.energy_j < 0):
            raise SpecError(f"instruction options: energy_j={self.energy_j!r} must be >= 0")

    def at(self, freq_mhz: float) -> tuple[float, float]:
        """(time_s, energy_j) at a profiled clock; SpecError for an unprofiled one."""
        hits = np.flatnonzero(self.freq_mhz == freq_mhz)
        if len(hits) == 0:
            raise SpecError(f"frequency {freq_mhz} MHz is not profiled "
                            f"(profiled: {int(self.freq_mhz.min())}-{int(self.freq_mhz.max())})")
        k = int(hits[0])
        return float(self.time_s[k]), float(self.energy_j[k])


@dataclass(frozen=True, kw_only=True, slots=True)
class EnergyProfile:
    """Per (stage, instruction) frequency options of one pipeline, plus blocking power."""

    num_stages: int
    """Pipeline stages (one GPU, or one tensor-parallel group of identical GPUs, each)."""
    options: Mapping[tuple[int, str], InstructionOptions]
    """(stage, instruction) -> options; instruction in INSTRUCTIONS."""
    blocking_power_w: float
    """Power a GPU draws while blocked on pipeline communication (W, Perseus §2.2)."""
    source: str = ""
    """Where the profile came from (a path or "model:<name>"), for reports."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form: gpu, model, ..."""

    def __post_init__(self) -> None:
        if isinstance(self.num_stages, bool) or not isinstance(self.num_stages, int) \
                or self.num_stages < 1:
            raise SpecError(f"energy profile num_stages={self.num_stages!r} must be >= 1")
        if not math.isfinite(self.blocking_power_w) or self.blocking_power_w < 0:
            raise SpecError(
                f"energy profile blocking_power_w={self.blocking_power_w!r} must be >= 0")
        for stage in range(self.num_stages):
            for inst in INSTRUCTIONS:
                if (stage, inst) not in self.options:
                    raise SpecError(f"energy profile misses stage {stage} instruction {inst!r}")

    def max_freq_mhz(self, stage: int, instruction: str) -> float:
        """Highest profiled clock of one instruction."""
        return float(self.options[(stage, instruction)].freq_mhz.max())

    def common_frequencies_mhz(self) -> list[float]:
        """Clocks profiled for every instruction, descending (ZeusGlobal's knob)."""
        sets = [set(o.freq_mhz.tolist()) for o in self.options.values()]
        return sorted(set.intersection(*sets), reverse=True)


def _row_error(path: str, line: int, message: str) -> DataFileError:
    return DataFileError(f"{path}: row {line}: {message}")


def load_perseus_csv(path: str | Path, *, blocking_power_w: float,
                     num_stages: int | None = None) -> EnergyProfile:
    """Load and check a Perseus stage profile (``stage,instruction,frequency,time,energy``).

    Checks, each failing with a one-line `DataFileError` naming the file and row: the exact
    header; numbers that parse, finite; stage an integer >= 0; instruction in INSTRUCTIONS;
    time > 0; energy >= 0; no duplicate (stage, instruction, frequency); every stage 0..S-1 has
    every instruction (S = `num_stages`, or the largest stage + 1); and time non-increasing in
    frequency up to MONOTONE_TOLERANCE (a row slower than a lower clock's by more is garbage).

    Args:
        path: CSV file.
        blocking_power_w: Blocking (P2P wait) power of the GPU type (W).
        num_stages: Expected number of stages; None infers it.
    """
    where = str(path)
    rows: dict[tuple[int, str], list[tuple[float, float, float, int]]] = {}
    seen: set[tuple[int, str, float]] = set()
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != CSV_COLUMNS:
            raise DataFileError(f"{where}: header {header!r} must be {','.join(CSV_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(CSV_COLUMNS):
                raise _row_error(where, line, f"has {len(row)} fields, expected 5: {row!r}")
            stage_s, inst, freq_s, time_s, energy_s = (c.strip() for c in row)
            try:
                stage = int(stage_s)
                freq, time_v, energy = float(freq_s), float(time_s), float(energy_s)
            except ValueError:
                raise _row_error(where, line, f"non-numeric value in {row!r}") from None
            if stage < 0:
                raise _row_error(where, line, f"stage={stage} must be >= 0")
            if inst not in INSTRUCTIONS:
                raise _row_error(where, line, f"instruction={inst!r} must be one of "
                                              f"{', '.join(INSTRUCTIONS)}")
            if not (math.isfinite(freq) and freq > 0):
                raise _row_error(where, line, f"frequency={freq_s} must be a positive number")
            if not (math.isfinite(time_v) and time_v > 0):
                raise _row_error(where, line, f"time={time_s} must be a positive number")
            if not math.isfinite(energy) or energy < 0:
                raise _row_error(where, line, f"energy={energy_s} must be >= 0 (negative "
                                              "energy is not a measurement)")
            if (stage, inst, freq) in seen:
                raise _row_error(where, line, f"duplicate stage {stage} {inst} at {freq_s} MHz")
            seen.add((stage, inst, freq))
            rows.setdefault((stage, inst), []).append((freq, time_v, energy, line))
    if not rows:
        raise DataFileError(f"{where}: no rows")
    stages = num_stages if num_stages is not None else max(s for s, _ in rows) + 1
    for stage in range(stages):
        for inst in INSTRUCTIONS:
            if (stage, inst) not in rows:
                raise DataFileError(f"{where}: no row for stage {stage} instruction {inst!r} "
                                    f"(every stage 0..{stages - 1} needs forward and backward)")
    extra = sorted(s for s, _ in rows if s >= stages)
    if extra:
        raise DataFileError(f"{where}: stage {extra[0]} is beyond num_stages={stages}")
    options: dict[tuple[int, str], InstructionOptions] = {}
    for key, entries in rows.items():
        entries.sort(key=lambda e: e[0])  # ascending frequency
        best_s = math.inf
        for freq, time_v, _, line in entries:
            if time_v > best_s * (1.0 + MONOTONE_TOLERANCE):
                raise _row_error(
                    where, line, f"stage {key[0]} {key[1]} at {freq:g} MHz takes {time_v:g} s, "
                    f"over {MONOTONE_TOLERANCE:.0%} slower than at a lower clock ({best_s:g} s): "
                    "time must fall as frequency rises")
            best_s = min(best_s, time_v)
        entries.reverse()
        options[key] = InstructionOptions(
            freq_mhz=np.array([e[0] for e in entries]),
            time_s=np.array([e[1] for e in entries]),
            energy_j=np.array([e[2] for e in entries]))
    return EnergyProfile(num_stages=stages, options=options, blocking_power_w=blocking_power_w,
                         source=where)


def blocking_power_of(gpu_name: str) -> float:
    """Blocking power of a GPU type: its `idle_power_w` from hwmodels/data/gpus.json."""
    return float(get_gpu(gpu_name).idle_power_w)


def profile_from_model(model: ModelSpec, cluster: Cluster,
                       plan: ParallelPlan | Mapping[str, Any], *,
                       frequencies_mhz: Sequence[float] | None = None,
                       options: LoweringOptions | None = None) -> EnergyProfile:
    """Options of every stage's forward and backward from trainsim's DVFS/power model.

    The costs are those `workloads.lowering.lower` itself uses (`lowering.stage_layout`: same
    stage partition, placement and cost model), at every clock of `frequencies_mhz` (default:
    every supported clock of the stage's GPU, `GpuSpec.frequencies_mhz()`, which includes its
    maximum). The roofline time scales with f_max/f in its compute part only
    (hwmodels/opcost.py). A backward option is the backward plus the recompute before it,
    which `lower` runs at the backward's clock (the recompute task of action "sBj").

    Energies are per pipeline stage *as the engine counts it*: a folded program rank stands for
    the stage's g = dp × tp GPUs (`SimResult.energy_j` counts it g times), so every option's
    energy and the blocking power are g × the per-GPU values, and blocking power is the
    cluster's idle power of the stage's GPU (`Cluster.idle_power_w`, what `lower` puts in
    `Program.idle_power_w`). With that, `InstructionDag.evaluate` of a plan is exactly the
    engine's energy rule on the program `lower` emits with `LoweringOptions(communication=
    False, optimizer_step=False)` (search/energy/lowered.py adds the rest).

    Args:
        model: The model (names and files are resolved above, by `trainsim.api.load_model`).
        cluster: The cluster (`trainsim.api.load_cluster` resolves specs).
        plan: ParallelPlan or dict of its fields; schedule "1f1b", one stage per rank.
        frequencies_mhz: Clocks to profile (None: every supported clock of the GPU).
        options: LoweringOptions for the cost path (cost model, embedding/head placement).

    Raises:
        SpecError: the plan is not a plain 1F1B pipeline, its micro-batches differ in shape,
            or its stages differ in g × idle power (the planner has one blocking power).
    """
    spec, hw = model, cluster
    if not isinstance(plan, ParallelPlan):
        plan = ParallelPlan.build(spec, hw, **dict(plan))
    if plan.virtual_stages != 1 or plan.schedule != "1f1b":
        raise SpecError(f"plan.schedule={plan.schedule!r} with virtual_stages="
                        f"{plan.virtual_stages}: the energy planner handles 1F1B with one "
                        "stage per pipeline rank (schedule '1f1b', virtual_stages 1)")
    first = hw.gpu(0)
    freqs = tuple(sorted({float(f) for f in (frequencies_mhz or first.frequencies_mhz())},
                         reverse=True))
    layout = stage_layout(spec, hw, plan, freqs, options)
    shapes = set(layout.micro_batch_shapes)
    if len(shapes) != 1:
        raise SpecError(f"plan micro-batches have shapes {sorted(shapes)} (batch, seq): the "
                        "energy planner needs one shape (global_batch a multiple of "
                        "micro_batch_size × dp)")
    options_of: dict[tuple[int, str], InstructionOptions] = {}
    weights: list[float] = []
    for stage in range(plan.pp):
        ranks = layout.stage_gpu_ranks[layout.stage_to_rank[stage]]
        names = {hw.gpu(r).name for r in ranks}
        if len(names) != 1:
            raise SpecError(f"stage {stage} mixes GPU types {sorted(names)}: the energy "
                            "planner needs one GPU type per stage")
        gpu = hw.gpu(ranks[0])
        if frequencies_mhz is None and gpu.name != first.name:
            raise SpecError(f"stage {stage} runs on {gpu.name}, stage 0 on {first.name}: "
                            "give frequencies_mhz both support")
        g = float(len(ranks))
        weights.append(g * float(hw.idle_power_w(ranks[0])))
        fwd, bwd = [], []
        for f in freqs:
            c = layout.costs[(stage, f)]
            fwd.append((c.forward.time_s, g * c.forward.energy_j))
            bwd.append((c.backward.time_s + c.recompute.time_s,
                        g * (c.backward.energy_j + c.recompute.energy_j)))
        for inst, pairs in (("forward", fwd), ("backward", bwd)):
            options_of[(stage, inst)] = InstructionOptions(
                freq_mhz=np.array(freqs, dtype=float),
                time_s=np.array([p[0] for p in pairs]),
                energy_j=np.array([p[1] for p in pairs]))
    if max(weights) - min(weights) > 1e-9 * max(weights):
        raise SpecError(f"stages draw different blocking power (GPUs x idle W = {weights}): "
                        "the energy planner needs equal stages (no stage_gpus, one GPU type)")
    return EnergyProfile(num_stages=plan.pp, options=options_of,
                         blocking_power_w=weights[0], source=f"model:{spec.name}",
                         metadata={"gpu": first.name, "model": spec.name,
                                   "gpus_per_stage": len(layout.stage_gpu_ranks[0]),
                                   "num_micro_batches": len(layout.micro_batch_shapes),
                                   "plan": plan, "model_spec": spec, "cluster": hw,
                                   "options": options})
