"""`sim calibrate ops` (issue 13, item 7b): per-class roofline factors and launch overhead
fitted to measured op times, written to a calibration file every command accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim import api
from trainsim.errors import DataFileError
from trainsim.hwmodels.calibration import load_calibration
from trainsim.hwmodels.gpus import get_gpu
from trainsim.hwmodels.opcost import OpEfficiency, RooflineCostModel
from trainsim.validate.profile_db import ProfileDB, ProfileRow
from trainsim.validate.roofline_fit import fit_op_efficiency

GPU = get_gpu("A100-SXM4-40GB")
TRUE = OpEfficiency(compute_scale={"gemm": 0.8, "batched_gemm": 0.6, "elementwise": 1.0},
                    memory_scale=0.7, launch_overhead_s=6e-6)


def _synthetic_profile(truth: OpEfficiency, noise: float = 0.0) -> ProfileDB:
    """Op times a machine whose roofline is `truth` would measure (GEMMs, attention and
    element-wise ops over three orders of magnitude), with a deterministic ±noise."""
    model = RooflineCostModel(op_efficiency={GPU.name: truth})
    rows = []
    sizes = [2 ** i for i in range(6, 14)]
    for i, n in enumerate(sizes):
        wiggle = 1.0 + noise * (1 if i % 2 else -1)
        for kind, flops, moved in (("matmul", 2.0 * n * n * 1024, 2.0 * (2 * n * 1024 + n * n)),
                                   ("attention_score", 2.0 * 16 * n * n * 64,
                                    2.0 * 16 * (2 * n * 64 + n * n)),
                                   ("layernorm", 8.0 * n * 1024, 4.0 * n * 1024),
                                   ("gelu", 10.0 * n * 4096, 4.0 * n * 4096)):
            t = model.estimate(kind, flops, moved, GPU, dtype="fp16").time_s * wiggle
            rows.append(ProfileRow(kind=kind, shape=(n,), flops=flops, bytes_moved=moved,
                                   time_s=t))
    rows.append(ProfileRow(kind="optimizer", shape=(1000,), pass_="step", flops=1e4,
                           bytes_moved=1e5, time_s=1e-4))
    return ProfileDB(meta={"device": "cuda", "command": "synthetic"}, rows=tuple(rows))


def test_fit_recovers_known_factors_and_overhead() -> None:
    """Noise-free times from a known roofline give back its factors: a fit that can fail."""
    fit = fit_op_efficiency(_synthetic_profile(TRUE), GPU)
    got = fit.efficiency
    assert got.compute_scale["gemm"] == pytest.approx(0.8, rel=0.02)
    assert got.compute_scale["batched_gemm"] == pytest.approx(0.6, rel=0.02)
    assert got.memory_scale == pytest.approx(0.7, rel=0.02)
    assert got.launch_overhead_s == pytest.approx(6e-6, rel=0.05)
    assert fit.mape_after < 0.005 < fit.mape_before
    assert fit.holdout_mape < 0.01
    assert fit.skipped == ("optimizer",)


def test_fitted_record_reproduces_the_fit_in_the_cost_model() -> None:
    """The record, applied by the roofline, predicts what the fit says it predicts."""
    db = _synthetic_profile(TRUE, noise=0.05)
    fit = fit_op_efficiency(db, GPU)
    model = RooflineCostModel(op_efficiency={GPU.name: fit.efficiency})
    errors = [abs(model.estimate(r.kind, r.flops, r.bytes_moved, GPU).time_s / r.time_s - 1)
              for r in db.rows if r.kind != "optimizer"]
    assert sum(errors) / len(errors) == pytest.approx(fit.mape_after, rel=1e-6)
    assert fit.mape_after < fit.mape_before


def test_too_few_rows_is_one_clear_line() -> None:
    db = ProfileDB(rows=(ProfileRow(kind="matmul", shape=(8,), flops=1e6, bytes_moved=1e4,
                                    time_s=1e-5),))
    with pytest.raises(DataFileError, match="1 op rows trainsim can price; the fit needs"):
        fit_op_efficiency(db, GPU)


def test_cli_writes_a_calibration_that_simulate_accepts(tmp_path: Path, sim) -> None:
    profile = tmp_path / "a100.csv"
    profile.write_text(_synthetic_profile(TRUE, noise=0.02).to_csv(), encoding="utf-8")
    out = tmp_path / "cal.json"
    code, stdout, stderr = sim(["calibrate", "ops", str(profile), "--gpu", GPU.name,
                                "--out", str(out)])
    assert code == 0, stderr
    assert "held-out op-time MAPE" in stdout and "gemm" in stdout
    cal = load_calibration(out)
    assert cal.op_efficiency[GPU.name].compute_scale["gemm"] == pytest.approx(0.8, rel=0.1)
    assert "sim calibrate ops" in json.loads(out.read_text())["op_efficiency"][GPU.name][
        "source"]
    plain = api.simulate("gpt3-125m", "1xA100-SXM4-40GB", dp=1, global_batch=8)
    slower = api.simulate("gpt3-125m", "1xA100-SXM4-40GB", dp=1, global_batch=8,
                          options=api.calibration_options(out))
    assert slower.iteration_time_s > plain.iteration_time_s  # factors < 1: a slower GPU
    # an existing file is not overwritten; a GPU outside the catalog is one line, exit 2
    code, _, stderr = sim(["calibrate", "ops", str(profile), "--gpu", GPU.name,
                           "--out", str(out)])
    assert code == 2 and "--out" in stderr and len(stderr.strip().splitlines()) == 1
    code, _, stderr = sim(["calibrate", "ops", str(profile), "--gpu", "Z100", "--out",
                           str(tmp_path / "x.json")])
    assert code == 2 and "Z100" in stderr


@pytest.mark.parametrize(("record", "message"), [
    ({"compute_scale": {"gemm": 0.001}, "memory_scale": 1.0, "launch_overhead_s": None,
      "source": "x"}, r"gemm=0.001 must be in \[0.02, 50\]"),
    ({"compute_scale": {"tensor": 1.0}, "memory_scale": 1.0, "launch_overhead_s": None,
      "source": "x"}, "compute_scale.tensor: unknown efficiency class"),
    ({"compute_scale": {}, "memory_scale": 1.0, "launch_overhead_s": 1.0, "source": "x"},
     r"launch_overhead_s=1.0 must be in \[0, 0.01\]"),
])
def test_bad_op_efficiency_records_name_the_field(tmp_path: Path, record: dict,
                                                  message: str) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"trainsim_calibration": 1,
                                "op_efficiency": {GPU.name: record}}), encoding="utf-8")
    with pytest.raises(DataFileError, match=message) as info:
        load_calibration(path)
    assert "\n" not in str(info.value)
