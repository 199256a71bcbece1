"""Efficiency curves from recorded kernel times (validate/kernel_fit.py) and the recorded H100
data beside it (validate/data/h100_*.csv, bench/gpu_record.py)."""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from pathlib import Path

import pytest

from trainsim.errors import SpecError
from trainsim.hwmodels.gpus import get_gpu
from trainsim.validate.kernel_fit import (
    FLASH_BACKWARD,
    catalog_efficiency,
    fit_kernel_curves,
    reserved_over_allocated,
)
from trainsim.validate.published_runs import (
    MEMORY,
    THROUGHPUT,
    NotExpressible,
    express,
    predict,
    read_runs,
)

DATA = Path(__file__).resolve().parents[2] / "validate" / "data"
GPU = "H100-SXM5-80GB"
OVERHEAD = 4e-6
FLOOR = 10e-6


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["kind", "shape", "flops", "bytes", "median_s",
                                          "p25_s", "p75_s"])
        w.writeheader()
        for r in rows:
            w.writerow({"shape": "1", "flops": 0.0, "bytes": 0.0, "p25_s": 0, "p75_s": 0, **r})
    return path


def test_fit_recovers_the_efficiencies_kernels_were_made_with(tmp_path: Path) -> None:
    gpu = get_gpu(GPU)
    peak = gpu.peak_flops("bf16", gpu.sm_clock_max_mhz)
    bw = gpu.memory_bandwidth_bytes_per_s
    rows: list[dict[str, object]] = [{"kind": "launch", "median_s": FLOOR}]
    for x_us, eff in ((50.0, 0.6), (400.0, 0.7), (3000.0, 0.75)):  # one per factor-2 bin
        flops = x_us * 1e-6 * peak
        rows.append({"kind": "gemm", "flops": flops, "median_s": x_us * 1e-6 / eff + OVERHEAD})
    rows.append({"kind": "gemm", "flops": 1e-6 * peak, "median_s": 2.5 * FLOOR})  # dispatch
    fwd_us, eff_all = 1000.0, 0.8
    fwd_flops = fwd_us * 1e-6 * peak
    both = (1 + FLASH_BACKWARD) * fwd_us * 1e-6 / eff_all + 2 * OVERHEAD
    rows += [{"kind": "sdpa_causal_fwd", "shape": "8x64", "flops": fwd_flops, "median_s": 0.5e-3},
             {"kind": "sdpa_causal_fwdbwd", "shape": "8x64",
              "flops": (1 + FLASH_BACKWARD) * fwd_flops, "median_s": both}]
    rows.append({"kind": "ew_copy", "bytes": 200e-6 * bw, "median_s": 200e-6 / 0.9 + OVERHEAD})
    fit = fit_kernel_curves(_write(tmp_path / "k.csv", rows), GPU, OVERHEAD)
    assert [e for _, e in fit["gemm"]] == pytest.approx([0.6, 0.7, 0.75], abs=1e-3)
    assert [x for x, _ in fit["gemm"]] == pytest.approx([50.0, 400.0, 3000.0], abs=0.1)
    (x, e), = fit["flash_attention"]
    assert e == pytest.approx(eff_all, abs=1e-3)
    assert x == pytest.approx(fwd_us * math.sqrt(FLASH_BACKWARD), abs=0.1)
    assert fit["memory"] == [[pytest.approx(200.0, abs=0.1), pytest.approx(0.9, abs=1e-3)]]


def test_fit_refuses_a_file_of_another_kind(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(SpecError, match="kernels.csv"):
        fit_kernel_curves(path, GPU, OVERHEAD)


def test_recorded_h100_kernels_disagree_with_the_assumed_hopper_curves_as_documented() -> None:
    """hwmodels/data/SOURCES.md states what the H100 recording says about the assumed Hopper
    curves; if the catalog or the data change, that text must change with them."""
    fit = fit_kernel_curves(DATA / "h100_kernels.csv", GPU, OVERHEAD)
    large_gemm = [e / catalog_efficiency("gemm", x, GPU) for x, e in fit["gemm"] if x >= 250]
    assert large_gemm and all(0.85 <= r <= 0.95 for r in large_gemm)
    long_flash = [e / catalog_efficiency("flash_attention", x, GPU)
                  for x, e in fit["flash_attention"] if x >= 800]
    assert long_flash and all(2.2 <= r <= 2.7 for r in long_flash)


def test_recorded_h100_training_runs_are_all_expressible() -> None:
    runs = read_runs(DATA / "h100_runs.csv")
    assert len(runs) == 12
    assert not [r for r in runs if isinstance(express(r), NotExpressible)]


def test_torchtitan_logged_memory_factor_is_the_recorded_median() -> None:
    """frameworks.yaml's torchtitan factor is the median reserved / allocated ratio of the
    recorded runs (what its source says); rerecording the runs must update it."""
    from trainsim.workloads.framework import get_framework

    ratios = reserved_over_allocated(DATA / "h100_runs.csv")
    assert len(ratios) == 6 and all(1.0 < r < 1.5 for r in ratios)
    for name in ("torchtitan", "torchtitan-compile"):
        factor = get_framework(name).logged_memory_factor.value
        assert factor == pytest.approx(statistics.median(ratios), abs=5e-4)
    assert get_framework("megatron").logged_memory_factor.value == 1.0


def test_accuracy_compares_memory_as_the_stack_logs_it() -> None:
    """A torchtitan row's predicted memory is the tensors' peak times the logged-memory factor
    (torchtitan logs reserved memory); throughput is untouched."""
    run = next(r for r in read_runs(DATA / "h100_runs.csv") if r.ref_kind == "peak_memory_gib")
    expressed = express(run)
    assert not isinstance(expressed, NotExpressible)
    assert expressed.logged_memory_factor > 1.0
    logged = predict(expressed)
    allocated = predict(dataclasses.replace(expressed, logged_memory_factor=1.0))
    assert logged[MEMORY] == pytest.approx(allocated[MEMORY] * expressed.logged_memory_factor)
    assert logged[THROUGHPUT] == allocated[THROUGHPUT]


def test_reserved_over_allocated_needs_recorded_notes(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("ref_kind,notes\npeak_memory_gib,nothing here\n")
    with pytest.raises(SpecError, match="max allocated"):
        reserved_over_allocated(path)


@pytest.mark.parametrize(("argv", "message"), [
    (["/nonexistent/kernels.csv"], "No such file or directory"),
    ([str(DATA / "h100_runs.csv")], "not a kernels.csv"),
    ([str(DATA / "h100_kernels.csv"), "--gpu", "NOPE"], "unknown GPU type 'NOPE'"),
])
def test_command_line_errors_are_one_line_exit_2(argv, message, capsys) -> None:
    from trainsim.validate.kernel_fit import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_command_line_prints_measured_beside_catalog(capsys) -> None:
    from trainsim.validate.kernel_fit import main

    assert main([str(DATA / "h100_kernels.csv"), "--runs", str(DATA / "h100_runs.csv")]) == 0
    out = capsys.readouterr().out
    assert "flash_attention" in out and "median 1.203" in out


def test_kernels_csv_as_a_profile_for_sim_calibrate_ops(tmp_path: Path) -> None:
    """A kernels.csv reads as op rows (GEMM -> matmul, SDPA -> flash_attention forward and
    backward, streaming kernels -> elementwise, dispatch-bound ones left out), and
    `sim calibrate ops` fits the roofline to it."""
    from trainsim import api
    from trainsim.validate.kernel_fit import is_kernels_csv, kernels_profile

    rows: list[dict[str, object]] = [
        {"kind": "launch", "median_s": FLOOR},
        {"kind": "gemm", "shape": "256x512x512", "flops": 1e9, "bytes": 1e6, "median_s": 4e-5},
        {"kind": "gemm", "shape": "64x64x64", "flops": 5e5, "bytes": 1e4, "median_s": 1.2e-5},
        {"kind": "sdpa_causal_fwd", "shape": "8x512x512x64", "flops": 1e10, "bytes": 1e6,
         "median_s": 1e-4},
        {"kind": "sdpa_causal_fwdbwd", "shape": "8x512x512x64", "flops": 3.5e10, "bytes": 3e6,
         "median_s": 4e-4},
        {"kind": "ew_copy", "shape": "1048576", "flops": 0.0, "bytes": 4e6, "median_s": 5e-5}]
    path = _write(tmp_path / "kernels.csv", rows)
    assert is_kernels_csv(path) and not is_kernels_csv(DATA / "h100_runs.csv")
    db = kernels_profile(path)
    got = {(r.kind, r.pass_, r.shape): r for r in db.rows}
    assert set(got) == {("matmul", "fwd", (256, 512, 512)),
                        ("flash_attention", "fwd", (8, 512, 512, 64)),
                        ("flash_attention", "bwd", (8, 512, 512, 64)),
                        ("elementwise", "fwd", (1048576,))}
    bwd = got[("flash_attention", "bwd", (8, 512, 512, 64))]
    assert bwd.time_s == pytest.approx(3e-4) and bwd.flops == pytest.approx(2.5e10)
    fit, cal = api.calibrate_ops(DATA / "h100_kernels.csv", GPU, "bf16")
    factors = {c.cls: c.factor for c in fit.classes}
    assert set(factors) == {"gemm", "flash_attention", "elementwise"}
    assert fit.mape_after < fit.mape_before
    assert factors["flash_attention"] > 2.0  # the fused kernel runs far above the assumed curve
    # the eager attention GEMMs keep the catalog's curve (no factor for their class)
    scales = next(iter(cal.to_json()["op_efficiency"].values()))["compute_scale"]
    assert "batched_gemm" not in scales and scales["flash_attention"] > 2.0
    assert cal.to_json()


@pytest.mark.parametrize(("cell", "value"), [("median_s", ""), ("median_s", "-1"),
                                             ("shape", "4xq"), ("flops", "-5")])
def test_a_malformed_row_is_one_error_naming_its_line(tmp_path: Path, cell, value) -> None:
    rows: list[dict[str, object]] = [{"kind": "launch", "median_s": FLOOR},
                                     {"kind": "gemm", "shape": "2x2x2", "flops": 16.0,
                                      "bytes": 24.0, "median_s": 1e-3}]
    rows[1][cell] = value
    path = _write(tmp_path / "k.csv", rows)
    from trainsim.validate.kernel_fit import kernels_profile

    for read in (lambda: fit_kernel_curves(path, GPU, OVERHEAD), lambda: kernels_profile(path)):
        with pytest.raises(SpecError, match=r"k.csv:3: needs shape"):
            read()
