"""The GPU catalog: one `GpuSpec` per GPU type, read from `data/gpus.json`.

Peak throughput is not stored as a number but derived from the chip's structure, so that it
can be evaluated at any SM clock for DVFS:

    peak(dtype, f) = SMs × FLOP/clock/SM(dtype) × f

(the counting used by NVIDIA's whitepapers, e.g. A100: 108 × 2048 × 1.41 GHz = 312 TFLOPS,
Ampere whitepaper Table 1). The vendor's datasheet figure is kept beside it
(`datasheet_tflops`) and the tests check that the two agree for every GPU and dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any

from trainsim.errors import DataFileError, UnknownNameError, unknown_name
from trainsim.hwmodels.datafiles import (
    GB_BYTES,
    GIB_BYTES,
    MHZ_HZ,
    TFLOPS_FLOPS,
    check_keys,
    load_json,
    number,
    unknown,
)

DTYPES: tuple[str, ...] = ("fp16", "bf16", "tf32", "fp32", "fp8")
"""Data types the catalog knows; a GPU lists the subset it runs natively. fp16, bf16, tf32 and
fp8 are tensor-core peaks (fp8: Hopper's FP8 tensor cores, E4M3/E5M2 inputs); fp32 is the CUDA
cores' (no tensor cores)."""

_FILE = "gpus.json"
_REQUIRED = (
    "architecture", "chip", "form_factor", "sm_count", "flops_per_clock_per_sm", "memory_gib",
    "memory_bandwidth_gbps", "tdp_w", "idle_power_w", "sm_clock_min_mhz", "sm_clock_max_mhz",
    "sm_clock_step_mhz", "base_clock_mhz", "boost_clock_mhz", "nvlink_bandwidth_gbps",
    "pcie_gen", "default_node_type", "sources",
)  # fmt: skip
_OPTIONAL = tuple(f"datasheet_{d}_tflops" for d in DTYPES) + ("datasheet_clock_mhz",)


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """One GPU type: structure, memory, clocks, power and links. SI units throughout."""

    name: str
    """Catalog name, e.g. ``"A100-SXM4-40GB"``."""
    architecture: str
    """Architecture family (``"Volta"``, ``"Ampere"``, ``"Hopper"``)."""
    chip: str
    """Die (``"GV100"``, ``"GA100"``, ``"GA102"``, ``"GH100"``)."""
    form_factor: str
    """Board form factor (``"SXM2"``, ``"SXM4"``, ``"SXM5"``, ``"PCIe"``)."""
    sm_count: int
    """Streaming multiprocessors enabled on this product."""
    flops_per_clock_per_sm: Mapping[str, float] = field(hash=False)
    """Dense FLOP per clock per SM by dtype (tensor cores for fp16/bf16/tf32/fp8, CUDA cores for
    fp32)."""
    datasheet_tflops: Mapping[str, float] = field(hash=False)
    """Vendor's dense peak by dtype, TFLOP/s, for cross-checking `peak_flops`."""
    datasheet_clock_mhz: Mapping[str, float] = field(hash=False)
    """SM clock at which each datasheet peak is quoted (H100 quotes fp32 at 1980 MHz)."""
    memory_bytes: int
    """Device memory capacity."""
    memory_bandwidth_bytes_per_s: float
    """Peak device-memory bandwidth."""
    tdp_w: float
    """Board power limit (TDP)."""
    idle_power_w: float
    """Power drawn while idle or blocked on communication (Perseus' P_blocking)."""
    sm_clock_min_mhz: float
    """Lowest supported SM clock."""
    sm_clock_max_mhz: float
    """Highest SM clock the DVFS model uses (the clock the tensor peak is quoted at)."""
    sm_clock_step_mhz: float
    """Spacing of supported SM clocks."""
    base_clock_mhz: float
    """Base clock (informative)."""
    boost_clock_mhz: float
    """Boost clock: the default frequency of `peak_flops`."""
    nvlink_bandwidth_bytes_per_s: float | None
    """Aggregate NVLink bandwidth per GPU, both directions summed as NVIDIA quotes it; None if none."""
    pcie_gen: int
    """PCIe generation of the host link."""
    default_node_type: str
    """Node type used when a cluster spec names none."""
    sources: Mapping[str, str] = field(hash=False, compare=False, repr=False)
    """Source of every figure, by data-file field name."""

    def __post_init__(self) -> None:
        where = f"{_FILE}: gpus.{self.name}"
        if self.sm_count <= 0:
            raise DataFileError(f"{where}: sm_count={self.sm_count} must be > 0")
        if not 0 < self.sm_clock_min_mhz <= self.sm_clock_max_mhz:
            raise DataFileError(
                f"{where}: sm_clock_min_mhz={self.sm_clock_min_mhz} must be in "
                f"(0, sm_clock_max_mhz={self.sm_clock_max_mhz}]"
            )
        if self.boost_clock_mhz > self.sm_clock_max_mhz:
            raise DataFileError(
                f"{where}: boost_clock_mhz={self.boost_clock_mhz} exceeds "
                f"sm_clock_max_mhz={self.sm_clock_max_mhz}"
            )
        if not 0 < self.idle_power_w < self.tdp_w:
            raise DataFileError(f"{where}: idle_power_w={self.idle_power_w} must be in (0, tdp_w)")
        bad = sorted(set(self.flops_per_clock_per_sm) - set(DTYPES))
        if bad:
            raise DataFileError(f"{where}: flops_per_clock_per_sm has unknown dtype(s) {bad}")
        for dtype in self.flops_per_clock_per_sm:
            if dtype not in self.datasheet_tflops:
                raise DataFileError(f"{where}: missing field datasheet_{dtype}_tflops")

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Dtypes this GPU runs natively, in catalog order."""
        return tuple(d for d in DTYPES if d in self.flops_per_clock_per_sm)

    def peak_flops(self, dtype: str = "fp16", freq_mhz: float | None = None) -> float:
        """Dense peak FLOP/s = SMs × FLOP/clock/SM × f (Ampere whitepaper's counting).

        Args:
            dtype: one of `dtypes`.
            freq_mhz: SM clock; default the boost clock.

        Raises:
            UnknownNameError: the GPU has no native path for `dtype` (e.g. bf16 on V100, fp8 on
                A100).
        """
        per_sm = self.flops_per_clock_per_sm.get(dtype)
        if per_sm is None:
            if dtype in DTYPES:
                raise UnknownNameError(
                    f"dtype={dtype!r} is not supported by {self.name} ({self.architecture} has "
                    f"no {dtype} tensor-core path); use one of {', '.join(self.dtypes)}")
            raise unknown_name(f"dtype on {self.name}", dtype, self.dtypes)
        f_mhz = self.boost_clock_mhz if freq_mhz is None else freq_mhz
        return self.sm_count * per_sm * f_mhz * MHZ_HZ

    def datasheet_flops(self, dtype: str = "fp16") -> float:
        """The vendor's quoted dense peak for `dtype` in FLOP/s."""
        if dtype not in self.datasheet_tflops:
            raise unknown_name(f"dtype on {self.name}", dtype, self.dtypes)
        return self.datasheet_tflops[dtype] * TFLOPS_FLOPS

    def frequencies_mhz(self) -> list[int]:
        """Supported SM clocks, ascending: min + k × step up to max (rounded to whole MHz)."""
        steps = math.floor(
            (self.sm_clock_max_mhz - self.sm_clock_min_mhz) / self.sm_clock_step_mhz + 1e-9
        )
        freqs = [
            round(self.sm_clock_min_mhz + k * self.sm_clock_step_mhz) for k in range(steps + 1)
        ]
        if freqs[-1] != round(self.sm_clock_max_mhz):
            freqs.append(round(self.sm_clock_max_mhz))
        return freqs

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain JSON-able values (SI units), for `sim hw show --json`."""
        return {
            "name": self.name,
            "architecture": self.architecture,
            "chip": self.chip,
            "form_factor": self.form_factor,
            "sm_count": self.sm_count,
            "flops_per_clock_per_sm": dict(self.flops_per_clock_per_sm),
            "peak_flops": {d: self.peak_flops(d) for d in self.dtypes},
            "datasheet_tflops": dict(self.datasheet_tflops),
            "datasheet_clock_mhz": dict(self.datasheet_clock_mhz),
            "memory_bytes": self.memory_bytes,
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "tdp_w": self.tdp_w,
            "idle_power_w": self.idle_power_w,
            "sm_clock_min_mhz": self.sm_clock_min_mhz,
            "sm_clock_max_mhz": self.sm_clock_max_mhz,
            "sm_clock_step_mhz": self.sm_clock_step_mhz,
            "base_clock_mhz": self.base_clock_mhz,
            "boost_clock_mhz": self.boost_clock_mhz,
            "nvlink_bandwidth_bytes_per_s": self.nvlink_bandwidth_bytes_per_s,
            "pcie_gen": self.pcie_gen,
            "default_node_type": self.default_node_type,
            "sources": dict(self.sources),
        }


def _parse_gpu(name: str, raw: Mapping[str, Any]) -> GpuSpec:
    where = f"{_FILE}: gpus.{name}"
    check_keys(where, raw, _REQUIRED, _OPTIONAL)
    per_sm = raw["flops_per_clock_per_sm"]
    if not isinstance(per_sm, Mapping) or not per_sm:
        raise DataFileError(f"{where}: flops_per_clock_per_sm must be a non-empty object")
    per_sm = {d: number(where, f"flops_per_clock_per_sm.{d}", v) for d, v in per_sm.items()}
    datasheet = {
        d: number(where, f"datasheet_{d}_tflops", raw[f"datasheet_{d}_tflops"])
        for d in DTYPES
        if f"datasheet_{d}_tflops" in raw
    }
    clock_max = number(where, "sm_clock_max_mhz", raw["sm_clock_max_mhz"])
    ds_clock = {d: clock_max for d in datasheet}
    ds_clock.update(
        {
            d: number(where, f"datasheet_clock_mhz.{d}", v)
            for d, v in raw.get("datasheet_clock_mhz", {}).items()
        }
    )
    nvlink = raw["nvlink_bandwidth_gbps"]
    return GpuSpec(
        name=name,
        architecture=str(raw["architecture"]),
        chip=str(raw["chip"]),
        form_factor=str(raw["form_factor"]),
        sm_count=int(number(where, "sm_count", raw["sm_count"])),
        flops_per_clock_per_sm=_frozen(per_sm),
        datasheet_tflops=_frozen(datasheet),
        datasheet_clock_mhz=_frozen(ds_clock),
        memory_bytes=int(number(where, "memory_gib", raw["memory_gib"]) * GIB_BYTES),
        memory_bandwidth_bytes_per_s=number(
            where, "memory_bandwidth_gbps", raw["memory_bandwidth_gbps"]
        )
        * GB_BYTES,
        tdp_w=number(where, "tdp_w", raw["tdp_w"]),
        idle_power_w=number(where, "idle_power_w", raw["idle_power_w"]),
        sm_clock_min_mhz=number(where, "sm_clock_min_mhz", raw["sm_clock_min_mhz"]),
        sm_clock_max_mhz=clock_max,
        sm_clock_step_mhz=number(where, "sm_clock_step_mhz", raw["sm_clock_step_mhz"]),
        base_clock_mhz=number(where, "base_clock_mhz", raw["base_clock_mhz"]),
        boost_clock_mhz=number(where, "boost_clock_mhz", raw["boost_clock_mhz"]),
        nvlink_bandwidth_bytes_per_s=None
        if nvlink is None
        else number(where, "nvlink_bandwidth_gbps", nvlink) * GB_BYTES,
        pcie_gen=int(number(where, "pcie_gen", raw["pcie_gen"])),
        default_node_type=str(raw["default_node_type"]),
        sources=_frozen(raw["sources"]),
    )


@cache
def _catalog() -> dict[str, GpuSpec]:
    data = load_json(_FILE)
    check_keys(_FILE, data, ("gpus",), ("_about",))
    return {name: _parse_gpu(name, raw) for name, raw in data["gpus"].items()}


@cache
def _lower_index() -> dict[str, str]:
    return {name.lower(): name for name in _catalog()}


def list_gpus() -> list[str]:
    """Names of every GPU type in the catalog, in file order."""
    return list(_catalog())


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU type up by name (case-insensitive).

    Raises:
        UnknownNameError: listing the closest valid names.
    """
    canonical = _lower_index().get(name.strip().lower())
    if canonical is None:
        raise unknown("GPU type", name, list_gpus())
    return _catalog()[canonical]
