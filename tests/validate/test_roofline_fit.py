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


def _kineto_trace(truth: OpEfficiency) -> dict:
    """A GPU Kineto trace as torch.profiler writes it (cpu_op spans with Input Dims / Input
    type, kernel spans linked by External id) whose kernel times a `truth` roofline gives."""
    model = RooflineCostModel(op_efficiency={GPU.name: truth})
    events: list[dict] = []
    ext = 0
    bf16 = "c10::BFloat16"
    for n in (128, 256, 512, 1024, 2048, 4096, 8192):
        ops = [("aten::mm", [[n, 1024], [1024, n]], [bf16, bf16], "matmul",
                2.0 * n * n * 1024, 2.0 * (2 * n * 1024 + n * n)),
               ("aten::bmm", [[16, n, 64], [16, 64, n]], [bf16, bf16], "attention_score",
                2.0 * 16 * n * n * 64, 2.0 * 16 * (2 * n * 64 + n * n)),
               ("aten::native_layer_norm", [[n, 1024], [], [1024], [1024], []],
                [bf16, "ScalarList", bf16, bf16, "Scalar"], "layernorm", 8.0 * n * 1024,
                2.0 * (2 * n * 1024 + 2 * 1024))]
        for name, dims, types, kind, flops, moved in ops:
            for repeat in range(3):  # repeats merge into one row at their median
                ext += 1
                us = model.estimate(kind, flops, moved, GPU).time_s * 1e6 * (1 + 0.01 * repeat)
                events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1,
                               "ts": ext * 100.0, "dur": 5.0,
                               "args": {"External id": ext, "Input Dims": dims,
                                        "Input type": types}})
                events.append({"ph": "X", "cat": "kernel", "name": "some_kernel", "pid": 0,
                               "tid": 7, "ts": ext * 100.0 + 1, "dur": us,
                               "args": {"External id": ext}})
    return {"traceEvents": events}


def test_kineto_trace_rows_and_fit() -> None:
    """Kernel times are summed per aten op (not the CPU span), shapes give the zoo's FLOPs and
    bytes, repeats merge, and the fit recovers the factors that made the times."""
    from trainsim.validate.kineto_ops import kineto_profile

    db = kineto_profile(_kineto_trace(TRUE))
    assert db.meta["device"] == "cuda"
    assert {r.kind for r in db.rows} == {"matmul", "attention_score", "layernorm"}
    assert all(r.repeats == 3 for r in db.rows) and len(db.rows) == 21
    mm = next(r for r in db.rows if r.kind == "matmul" and r.shape == (512, 512, 1024))
    assert mm.flops == 2.0 * 512 * 512 * 1024
    assert mm.bytes_moved == 2.0 * (2 * 512 * 1024 + 512 * 512)
    fit = fit_op_efficiency(db, GPU)
    assert fit.efficiency.compute_scale["gemm"] == pytest.approx(0.8, rel=0.05)
    assert fit.efficiency.memory_scale == pytest.approx(0.7, rel=0.05)


def test_a_real_cpu_profiler_trace_is_read(tmp_path: Path) -> None:
    """torch.profiler's own export (CPU: no kernels, so op spans time the ops)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    from trainsim.validate.kineto_ops import kineto_profile
    from trainsim.validate.trace_import import read_json

    a, b, bias = torch.randn(64, 128), torch.randn(128, 32), torch.randn(32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            torch.mm(a, b)
            torch.addmm(bias, a, b)
            torch.bmm(torch.randn(4, 16, 8), torch.randn(4, 8, 16))
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    db = kineto_profile(read_json(path), str(path))
    assert db.meta["device"] == "cpu"
    shapes = {(r.kind, r.shape): r for r in db.rows}
    assert shapes[("matmul", (64, 32, 128))].flops == 2.0 * 64 * 32 * 128
    assert shapes[("attention_score", (4, 16, 16, 8))].flops == 2.0 * 4 * 16 * 16 * 8
    assert all(r.time_s > 0 for r in db.rows)


def test_a_trace_without_shapes_is_one_clear_line(tmp_path: Path, sim) -> None:
    path = tmp_path / "noshapes.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5, "pid": 1,
         "tid": 1, "args": {}}]}), encoding="utf-8")
    code, _, stderr = sim(["calibrate", "ops", str(path), "--gpu", GPU.name, "--out",
                           str(tmp_path / "c.json")])
    assert code == 2 and "record_shapes=True" in stderr
    code, _, stderr = sim(["calibrate", "ops", str(tmp_path / "missing.csv"), "--gpu",
                           GPU.name, "--out", str(tmp_path / "c.json")])
    assert code == 2 and "no such file" in stderr


def test_a_cpu_profile_or_a_fit_at_a_bound_is_refused() -> None:
    """Op times measured on a CPU, or whose fitted factors sit at the fit's bounds (times of
    another device: a CPU runs these ops ~50x slower), are refused with one line; such a file
    once calibrated an A100 to 1.4 % MFU."""
    db = _synthetic_profile(TRUE)
    cpu = ProfileDB(meta={**db.meta, "device": "cpu"}, rows=db.rows)
    with pytest.raises(Exception, match=r"measured on device 'cpu'"):
        api.calibrate_ops(cpu, GPU.name)
    hundredfold = ProfileDB(meta=db.meta, rows=tuple(
        ProfileRow(kind=r.kind, shape=r.shape, pass_=r.pass_, flops=r.flops,
                   bytes_moved=r.bytes_moved, time_s=r.time_s * 100) for r in db.rows))
    with pytest.raises(DataFileError, match=r"sits at the bound .* not of this GPU \(A100-SXM4-40GB\)"):
        fit_op_efficiency(hundredfold, GPU)
