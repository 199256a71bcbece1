"""DVFS time and power of a GPU at SM clock f.

Time. A kernel's duration at clock f splits into a part that scales with 1/f (SM-bound work)
and a part that does not (memory-bound work), the two-component model used by Perseus
(Chung et al., SOSP'24, §4) and Zeus:

    t(f) = t(f_max) × (c × f_max / f + (1 − c)),     c = SM-bound fraction of t(f_max)

Power. CMOS dynamic power is C·V²·f (Weste & Harris, *CMOS VLSI Design*, eq. 5.10). A GPU's
voltage/frequency table holds the core voltage at a floor up to some clock and raises it
above that (below the knee only the clock drops, so power falls slowly; above it voltage and
clock rise together, so power climbs steeply -- the shape of every Perseus A100 and A40 power
sweep). With the floor r = V_floor/V(f_max), the knee f_v (default f_min: the voltage is linear
over the whole range), idle (static + blocking) power P_idle and utilisation split into an
SM-bound part u and a memory-bound part (1 − u):

    V(f)/V(f_max) = r + (1 − r) max(0, (f − f_v)/(f_max − f_v))
    P(f, u) = min(TDP, P_idle + P_dyn [u (f/f_max) (V(f)/V(f_max))² + (1 − u) a_mem])

P_dyn defaults to TDP − P_idle, so a fully SM-bound kernel at the top clock draws TDP; the
voltage floor r and knee f_v, a GPU's excess P_dyn (the A40 hits its 300 W board limit below
its top clock) and the memory-bound activity a_mem come from `data/power.json` with their
sources. At f_max the voltage ratio is 1 whatever r and f_v are, so they change power only
below the top clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from trainsim.errors import DataFileError
from trainsim.hwmodels.datafiles import check_keys, load_json, number
from trainsim.hwmodels.gpus import GpuSpec

_FILE = "power.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class PowerModel:
    """Per-GPU coefficients of the power model in the module docstring."""

    gpu_name: str
    """GPU type these coefficients belong to."""
    idle_power_w: float
    """P_idle: power while idle or blocked."""
    tdp_w: float
    """Board power limit; modelled power never exceeds it."""
    dynamic_power_max_w: float
    """P_dyn: uncapped dynamic power of a fully SM-bound kernel at f_max."""
    v_min_ratio: float
    """r = V(f_min)/V(f_max)."""
    memory_bound_activity: float
    """a_mem: dynamic activity of a memory-bound kernel, as a fraction of P_dyn; clock-independent."""
    f_min_mhz: float
    """Lowest SM clock."""
    f_max_mhz: float
    """Highest SM clock."""
    voltage_knee_mhz: float | None = None
    """f_v: clock up to which the core voltage stays at its floor r (None: f_min)."""

    def __post_init__(self) -> None:
        where = f"{_FILE}: gpus.{self.gpu_name}"
        if not 0 < self.v_min_ratio <= 1:
            raise DataFileError(f"{where}: v_min_ratio={self.v_min_ratio} must be in (0, 1]")
        if not 0 <= self.memory_bound_activity <= 1:
            raise DataFileError(
                f"{where}: memory_bound_activity={self.memory_bound_activity} must be in [0, 1]"
            )
        if self.dynamic_power_max_w <= 0:
            raise DataFileError(
                f"{where}: dynamic_power_max_w={self.dynamic_power_max_w} must be > 0"
            )
        knee = self.voltage_knee_mhz
        if knee is not None and not self.f_min_mhz <= knee < self.f_max_mhz:
            raise DataFileError(f"{where}: voltage_knee_mhz={knee} must be in "
                                f"[{self.f_min_mhz:g}, {self.f_max_mhz:g}) MHz or null")

    def voltage_ratio(self, freq_mhz: float) -> float:
        """V(f)/V(f_max): the floor r up to the knee f_v, then linear up to 1 at f_max."""
        knee = self.f_min_mhz if self.voltage_knee_mhz is None else self.voltage_knee_mhz
        span = self.f_max_mhz - knee
        x = 1.0 if span <= 0 else max(0.0, (freq_mhz - knee) / span)
        return self.v_min_ratio + (1.0 - self.v_min_ratio) * x

    def dynamic_scale(self, freq_mhz: float) -> float:
        """(f/f_max)(V(f)/V(f_max))²: SM dynamic power at f relative to f_max."""
        v = self.voltage_ratio(freq_mhz)
        return freq_mhz / self.f_max_mhz * v * v

    def power_w(self, freq_mhz: float | None = None, utilisation: float = 1.0) -> float:
        """Average board power at SM clock `freq_mhz` (default f_max).

        Args:
            freq_mhz: SM clock.
            utilisation: u, the SM-bound fraction of the busy time (1 = compute-bound kernel,
                0 = memory-bound kernel).
        """
        f = self.f_max_mhz if freq_mhz is None else freq_mhz
        activity = (
            utilisation * self.dynamic_scale(f) + (1.0 - utilisation) * self.memory_bound_activity
        )
        return min(self.tdp_w, self.idle_power_w + self.dynamic_power_max_w * activity)


def _coefficients() -> tuple[dict[str, Any], dict[str, Any]]:
    data = load_json(_FILE)
    check_keys(_FILE, data, ("default", "gpus"), ("_about",))
    fields = ("v_min_ratio", "dynamic_power_max_w", "source")
    check_keys(f"{_FILE}: default", data["default"],
               (*fields, "memory_bound_activity", "voltage_knee_mhz"))
    for name, entry in data["gpus"].items():
        check_keys(f"{_FILE}: gpus.{name}", entry, fields,
                   ("memory_bound_activity", "voltage_knee_mhz"))
    return data["default"], data["gpus"]


@cache
def power_model(gpu: GpuSpec) -> PowerModel:
    """The power model of `gpu`: its own coefficients from power.json, else the defaults."""
    default, per_gpu = _coefficients()
    entry = {**default, **per_gpu.get(gpu.name, {})}
    where = f"{_FILE}: gpus.{gpu.name}"
    dyn = entry["dynamic_power_max_w"]
    knee = entry["voltage_knee_mhz"]
    return PowerModel(
        gpu_name=gpu.name,
        idle_power_w=gpu.idle_power_w,
        tdp_w=gpu.tdp_w,
        dynamic_power_max_w=gpu.tdp_w - gpu.idle_power_w
        if dyn is None
        else number(where, "dynamic_power_max_w", dyn),
        v_min_ratio=number(where, "v_min_ratio", entry["v_min_ratio"]),
        memory_bound_activity=number(
            where, "memory_bound_activity", entry["memory_bound_activity"], positive=False
        ),
        f_min_mhz=gpu.sm_clock_min_mhz,
        f_max_mhz=gpu.sm_clock_max_mhz,
        voltage_knee_mhz=None if knee is None else number(where, "voltage_knee_mhz", knee),
    )


def power_w(gpu: GpuSpec, freq_mhz: float | None = None, utilisation: float = 1.0) -> float:
    """Board power of `gpu` at `freq_mhz` (default max clock) and SM-bound fraction `utilisation`."""
    return power_model(gpu).power_w(freq_mhz, utilisation)


def scaled_time_s(
    time_at_max_s: float, compute_fraction: float, freq_mhz: float, gpu: GpuSpec
) -> float:
    """Duration at `freq_mhz` of a task that takes `time_at_max_s` at the max clock.

    t(f) = t(f_max) (c f_max/f + 1 − c), with c = `compute_fraction` (Perseus §4).
    """
    if not 0.0 <= compute_fraction <= 1.0:
        raise ValueError(f"compute_fraction={compute_fraction} must be in [0, 1]")
    if freq_mhz <= 0:
        raise ValueError(f"freq_mhz={freq_mhz} must be > 0")
    ratio = gpu.sm_clock_max_mhz / freq_mhz
    return time_at_max_s * (compute_fraction * ratio + 1.0 - compute_fraction)
