"""CPU cost figures measured by this project's microbenchmarks (bench/cpu_ops.py,
bench/gloo_collectives.py), read from validate/data.

* **Adam on CPU.** torch's CPU default Adam (neither foreach nor fused: a Python loop over the
  parameter tensors, each ~10 eager element-wise ops) costs a fixed time per tensor (dispatch of
  those ops) plus a time per parameter (their memory traffic: p, grad, exp_avg, exp_avg_sq and
  the temporaries, streamed from DRAM because an iteration's forward and backward evict the
  optimizer state from cache). `adam_step_s` uses the *cold* fit of bench/cpu_ops.py. The
  profile database's optimizer rows time the step back to back (state in cache), which is why
  they are not used for the step any more (traces/README.md: 5.2 ms profiled against 9.3 ms in
  the DP2 run's profiled iteration, 5.7 ms in its timed ones).
* **Copies.** ``copy_bytes_per_s``: a 64 MiB ``copy_`` (read and written bytes over its median
  time, both processes at once): what the harness's gradient flattening around an all-reduce
  streams (validate/torch_parallel.py `GRAD_COPY_TRAFFIC`), priced by `copy_s`.
* **gloo over loopback.** α (per step) and β per collective kind, fitted by
  bench/gloo_collectives.py; `gloo_alpha_beta` gives the all-reduce-after-compute fit, the
  cpu cluster's link model when a profile has no collective rows.

Each file keeps the command that produced it, the date, the machine and its reference-GEMM time:
figures are brought to another moment's machine speed by the ratio of reference-GEMM times, as
`sim validate` does with a profile (validate/compare.py `speed_factor`).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

from trainsim.errors import DataFileError

CPU_OPS_FILE = "data/cpu_ops.json"
GLOO_FILE = "data/gloo_loopback.json"


@functools.cache
def _load(name: str) -> dict[str, Any]:
    try:
        text = resources.files("trainsim.validate").joinpath(name).read_text()
        data = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise DataFileError(f"validate/{name}: {exc}") from None
    if not isinstance(data, dict):
        raise DataFileError(f"validate/{name}: expected a JSON object")
    return data


def _positive(data: dict[str, Any], *path: str) -> float:
    value: Any = data
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise DataFileError(f"validate/data: {'.'.join(path)}={value!r} must be a number >= 0")
    return float(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class AdamCpuCost:
    """Seconds of one CPU Adam step: ``per_tensor_s·T + per_param_s·N``, at the machine speed
    whose reference GEMM took ``reference_gemm_s``."""

    per_tensor_s: float
    per_param_s: float
    reference_gemm_s: float

    def step_s(self, params: float, tensors: int, speed: float = 1.0) -> float:
        """Seconds of a step over `params` parameters in `tensors` tensors, times `speed` (a
        reference-GEMM ratio: >1 on a slower machine)."""
        return speed * (self.per_tensor_s * tensors + self.per_param_s * params)


def adam_cpu_cost() -> AdamCpuCost:
    """The cold-cache Adam fit of validate/data/cpu_ops.json (module docstring).

    Raises:
        DataFileError: the file is missing or a figure is not a number >= 0.
    """
    data = _load(CPU_OPS_FILE)
    return AdamCpuCost(per_tensor_s=_positive(data, "adam_cold", "per_tensor_s"),
                       per_param_s=_positive(data, "adam_cold", "per_param_s"),
                       reference_gemm_s=_positive(data, "reference_gemm_s"))


def copy_s(moved_bytes: float, speed: float = 1.0) -> float:
    """Seconds of a memory copy moving `moved_bytes` (read and written) at the measured copy
    bandwidth of validate/data/cpu_ops.json, times `speed` (a reference-GEMM ratio: >1 on a
    slower machine).

    Raises:
        DataFileError: the file is missing or the bandwidth is not a number > 0.
    """
    bandwidth = _positive(_load(CPU_OPS_FILE), "copy_bytes_per_s")
    if bandwidth <= 0:
        raise DataFileError(f"validate/{CPU_OPS_FILE}: copy_bytes_per_s must be > 0")
    return speed * moved_bytes / bandwidth


def gloo_alpha_beta(kind: str = "all_reduce_after_compute") -> tuple[float, float]:
    """(α s per step, β bytes/s) of `kind` from validate/data/gloo_loopback.json.

    Raises:
        DataFileError: the file is missing, lacks `kind` or β is not > 0.
    """
    data = _load(GLOO_FILE)
    alpha = _positive(data, "fit", kind, "alpha_s")
    beta = _positive(data, "fit", kind, "beta_bytes_per_s")
    if beta <= 0:
        raise DataFileError(f"validate/{GLOO_FILE}: fit.{kind}.beta_bytes_per_s must be > 0")
    return alpha, beta


def param_tensors(layers: Any, tp: int) -> int:
    """Parameter tensors of `layers` (zoo layers) on one tensor-parallel rank, as the torch
    validation model holds them (validate/torch_model.py): a GEMM's weight plus its bias when
    its parameter count exceeds n·k, a norm's weight and bias (rmsnorm: weight only), an
    embedding's token and position tables."""
    count = 0
    for layer in layers:
        for op in layer.sharded_ops(tp):
            if op.params <= 0:
                continue
            if op.kind == "matmul" and op.shape and len(op.shape) == 3:
                _, n, k = op.shape
                count += 2 if op.params > n * k else 1
            elif op.kind == "rmsnorm":
                count += 1
            else:
                count += 2
    return count
