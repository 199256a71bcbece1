"""Calibration files: `sim calibrate dvfs` writes one, `sim simulate --calibration FILE` uses it
(its coefficients replace the catalog's), and a bad file is one line with exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainsim.cli import main
from trainsim.errors import DataFileError
from trainsim.hwmodels.calibration import Calibration, load_calibration
from trainsim.hwmodels.clock_scaling import ClockScaling, clock_scaling
from trainsim.hwmodels.gpus import get_gpu

RUN = ["simulate", "--model", "gpt3-125m", "--cluster", "2xA40", "--pp", "2",
       "--global-batch", "8", "--seq-len", "512", "--json"]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def _calibration(tmp_path: Path, scaling: ClockScaling) -> Path:
    path = tmp_path / "cal.json"
    cal = Calibration({"A40": scaling}, {}, {"clock_scaling.A40": "test"})
    path.write_text(json.dumps(cal.to_json()), encoding="utf-8")
    return path


def test_calibration_changes_only_clocked_runs(capsys, tmp_path: Path) -> None:
    """A calibration with every GEMM fully clock-bound and no knee makes an A40 run at 870 MHz
    slower than the catalog's fit (c < 1) does, and leaves the top-clock run unchanged."""
    path = _calibration(tmp_path, ClockScaling(gemm_clock_bound_fraction=1.0))
    runs = {}
    for extra in ([], ["--calibration", str(path)]):
        for freq in ([], ["--freq-mhz", "870"]):
            code, out, err = _run(capsys, *RUN, *extra, *freq)
            assert code == 0, err
            runs[(bool(extra), bool(freq))] = json.loads(out)["iteration_time_s"]
    assert runs[(True, False)] == runs[(False, False)]
    assert runs[(True, True)] > runs[(False, True)] * 1.1


def test_round_trip(tmp_path: Path) -> None:
    scaling = ClockScaling(gemm_clock_bound_fraction=0.5, sustained_clock_mhz=1500.0)
    cal = load_calibration(_calibration(tmp_path, scaling))
    assert cal.clock_scaling == {"A40": scaling}
    assert cal.sources["clock_scaling.A40"] == "test"


@pytest.mark.parametrize(("content", "needle"), [
    ("{}", "not a trainsim calibration file"),
    ("not json", "not a JSON calibration file"),
    (('{"trainsim_calibration": 1, "clock_scaling": {"A40": {"gemm_clock_bound_fraction": 2,'
     ' "sustained_clock_mhz": null, "cap_sharpness": 8, "source": ""}}}'),
     "clock_scaling.A40: gemm_clock_bound_fraction=2.0 must be in [0, 1]"),
    ('{"trainsim_calibration": 1, "clock_scaling": {"A41": {}}}', "A41"),
    ('{"trainsim_calibration": 1, "power": {"A40": {"v_min_ratio": 0.5}}}', "power.A40"),
])
def test_bad_calibration_is_one_line_exit_2(capsys, tmp_path: Path, content: str,
                                             needle: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    code, _, err = _run(capsys, *RUN, "--calibration", str(path))
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_profile_and_calibration_together_refused(capsys, tmp_path: Path) -> None:
    path = _calibration(tmp_path, ClockScaling())
    code, _, err = _run(capsys, *RUN, "--calibration", str(path), "--profile", str(path))
    assert code == 2 and "not both" in err


def test_calibrate_refuses_existing_out_before_fitting(capsys, tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    out.write_text("mine", encoding="utf-8")
    code, _, err = _run(capsys, "calibrate", "dvfs", "--out", str(out), "--perseus",
                        str(tmp_path))
    assert code == 2 and "--out" in err and out.read_text(encoding="utf-8") == "mine"


@pytest.mark.slow
def test_calibrate_dvfs_fits_the_a40(capsys, tmp_path: Path, shared_subdir) -> None:
    """On the two A40 stage profiles alone, the fit reproduces the catalog's A40 coefficients
    (the catalog is this command's output) and writes a file `--calibration` accepts."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    for src in shared_subdir("perseus/stage_profile").glob("*+a40_bf16.csv"):
        shutil.copy(src, folder / src.name)
    out = tmp_path / "cal.json"
    code, stdout, err = _run(capsys, "calibrate", "dvfs", "--perseus", str(folder), "--out",
                             str(out))
    assert code == 0, err
    cal = load_calibration(out)
    assert set(cal.clock_scaling) == {"A40"}
    catalog = clock_scaling("A40")
    assert cal.clock_scaling["A40"].gemm_clock_bound_fraction == pytest.approx(
        catalog.gemm_clock_bound_fraction, abs=0.01)
    assert cal.clock_scaling["A40"].sustained_clock_mhz == pytest.approx(
        catalog.sustained_clock_mhz, rel=0.01)
    assert "A40" in stdout


@pytest.mark.slow
def test_energy_frontier_takes_a_calibration(capsys, tmp_path: Path) -> None:
    """Model mode: a calibration with the plain 1/f rule (no knee) changes the frontier's
    intrinsic saving against the catalog's fitted A100 coefficients; all-max time at the top
    clock stays the same."""
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(Calibration({"A100-SXM4-40GB": ClockScaling()}, {}, {})
                              .to_json()), encoding="utf-8")
    base = ["energy", "frontier", "--model", "gpt3-125m", "--cluster", "2xA100-SXM4-40GB",
            "--pp", "2", "--microbatches", "4", "--unit-s", "0.005", "--json"]
    out = []
    for extra in ([], ["--calibration", str(cal)]):
        code, stdout, err = _run(capsys, *base, *extra)
        assert code == 0, err
        out.append(json.loads(stdout))
    assert out[0]["all_max"] == out[1]["all_max"]
    assert out[0]["intrinsic"]["saving"] != out[1]["intrinsic"]["saving"]


def test_energy_profile_mode_refuses_a_calibration(capsys, tmp_path: Path, shared_subdir) -> None:
    cal = _calibration(tmp_path, ClockScaling())
    csv = shared_subdir("perseus/stage_profile") / "gpt3-175b+a40_bf16.csv"
    code, _, err = _run(capsys, "energy", "frontier", "--profile", str(csv), "--gpu", "A40",
                        "--microbatches", "4", "--calibration", str(cal))
    assert code == 2 and "model mode" in err


def test_gemm_efficiency_scale_speeds_up_gemms_only(tmp_path: Path) -> None:
    """A gemm_efficiency record scales the achieved tensor-core fraction of GEMM-class ops
    (capped at 1) and leaves element-wise ops alone; out-of-range scales are refused."""

    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"trainsim_calibration": 1, "gemm_efficiency": {
        "A100-SXM4-80GB": {"scale": 1.1, "source": "test"}}}), encoding="utf-8")
    cal = load_calibration(path)
    gpu = get_gpu("A100-SXM4-80GB")
    fitted, plain = cal.cost_model(), Calibration().cost_model()
    g1 = fitted.estimate("matmul", 1e12, 1e8, gpu)
    g0 = plain.estimate("matmul", 1e12, 1e8, gpu)
    assert g0.compute_s / g1.compute_s == pytest.approx(1.1)
    e1 = fitted.estimate("gelu", 1e6, 1e8, gpu)
    assert e1.time_s == plain.estimate("gelu", 1e6, 1e8, gpu).time_s
    path.write_text(json.dumps({"trainsim_calibration": 1, "gemm_efficiency": {
        "A100-SXM4-80GB": {"scale": 50, "source": "test"}}}), encoding="utf-8")
    with pytest.raises(DataFileError, match="scale=50"):
        load_calibration(path)
