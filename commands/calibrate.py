"""`sim calibrate ...`: fit cost-model coefficients to measurements, into a calibration file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from trainsim import api
from trainsim.commands.output import check_new_file, print_table, stderr_console, user_errors
from trainsim.errors import SpecError
from trainsim.simulator.own_files import make_parent

app = typer.Typer(help="Fit cost-model coefficients to measurements (writes a calibration "
                       "file that `sim simulate --calibration FILE` uses).",
                  no_args_is_help=True)

SHARED_DATA_ENV = "TRAINSIM_SHARED_DATA"


def default_perseus_dir() -> Path | None:
    """Perseus' stage profiles in the reference data: $TRAINSIM_SHARED_DATA, else
    ../shared/data beside the repository (a development checkout); None when absent."""
    env = os.environ.get(SHARED_DATA_ENV)
    root = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    folder = root / "perseus" / "stage_profile"
    return folder if folder.is_dir() else None


@app.command("dvfs")
@user_errors
def dvfs_command(
    perseus: Path | None = typer.Option(None, "--perseus", help="Folder of Perseus stage "
                                        "profiles ({model}+{gpu}_bf16.csv); default: the "
                                        "reference data's perseus/stage_profile."),
    out: Path = typer.Option(Path("calibration.json"), "--out", help="Calibration file."),
    write_catalog: bool = typer.Option(False, "--write-catalog", help="Also make the fit the "
                                       "catalog's defaults (hwmodels/data; for developers)."),
    force: bool = typer.Option(False, "--force", help="Overwrite --out if it exists."),
) -> None:
    """Fit the DVFS time split (clock-bound GEMM share, sustained clock) and power curve of
    every GPU with Perseus stage profiles; print the fitted values and their errors."""
    check_new_file(out, force, "--out")
    folder = perseus or default_perseus_dir()
    if folder is None:
        raise SpecError("give --perseus DIR (the Perseus artifact's stage_profile/ folder); "
                        f"no reference data found (set {SHARED_DATA_ENV})")
    console = stderr_console(quiet=False)
    with console.status("fitting...") as status:
        cal = api.calibrate_dvfs(folder, on_gpu=lambda g: status.update(f"fitting {g} "
                                                                          "(about 30 s)..."))
    make_parent(out).write_text(json.dumps(cal.to_json(), indent=2) + "\n", encoding="utf-8")
    rows = [[g, f"{s.gemm_clock_bound_fraction:.3f}",
             "-" if s.sustained_clock_mhz is None else f"{s.sustained_clock_mhz:.0f}",
             f"{s.cap_sharpness:.1f}", f"{cal.power[g].v_min_ratio:.3f}",
             "-" if cal.power[g].voltage_knee_mhz is None
             else f"{cal.power[g].voltage_knee_mhz:.0f}",
             f"{cal.power[g].memory_bound_activity:.3f}",
             f"{cal.power[g].dynamic_power_max_w:.1f}",
             cal.sources[f"clock_scaling.{g}"].rsplit("RMS ", 1)[-1].split(" ")[0],
             cal.sources[f"power.{g}"].rsplit("RMS ", 1)[-1].split(" ")[0]]
            for g, s in sorted(cal.clock_scaling.items())]
    print_table("DVFS calibration (fit to Perseus measured stage profiles)",
                ["GPU", "GEMM clock-bound", "sustained MHz", "knee p", "V ratio r", "V knee MHz",
                 "a_mem", "P_dyn W", "time RMS", "power RMS"], rows)
    typer.echo(f"wrote {out}")
    if write_catalog:
        # deferred: start-up time (scipy.optimize and the energy planner's modules)
        from trainsim.search.energy.dvfs_fit import write_catalog as _write
        for path in _write(cal):
            typer.echo(f"updated {path}")


@app.command("ops")
@user_errors
def ops_command(
    profile: Path = typer.Argument(..., help="Measured op times: a `sim profile` CSV (e.g. "
                                   "recorded with --device cuda on the GPU named by --gpu), or "
                                   "a PyTorch profiler (Kineto) trace .json recorded with "
                                   "record_shapes=True, or a kernels.csv of "
                                   "bench/gpu_record.py."),
    gpu: str = typer.Option(..., "--gpu", help="Catalog GPU the profile was measured on."),
    dtype: str = typer.Option("fp16", "--dtype", help="Precision the profile's GEMMs ran in."),
    out: Path = typer.Option(Path("calibration.json"), "--out", help="Calibration file."),
    force: bool = typer.Option(False, "--force", help="Overwrite --out if it exists."),
) -> None:
    """Fit the roofline's efficiency factor per op class (gemm, batched_gemm, flash_attention,
    elementwise), its memory-bandwidth factor and the launch overhead of one GPU to a profile's
    measured op times; print the op-time error before and after, and on held-out rows."""
    check_new_file(out, force, "--out")
    if not profile.is_file():
        raise SpecError(f"{profile}: no such file (a sim profile CSV or a Kineto trace .json)")
    fit, cal = api.calibrate_ops(profile, gpu, dtype)
    rows = [[c.cls, str(c.rows), f"{c.factor:.3f}", f"{c.mape_before:.1%}",
             f"{c.mape_after:.1%}"] for c in fit.classes]
    rows.append(["memory bandwidth", "", f"{fit.efficiency.memory_scale:.3f}", "", ""])
    overhead = fit.efficiency.launch_overhead_s or 0.0
    rows.append(["launch overhead", "", f"{overhead * 1e6:.2f} µs", "", ""])
    rows.append(["all ops", str(fit.rows), "", f"{fit.mape_before:.1%}",
                 f"{fit.mape_after:.1%}"])
    print_table(f"op-time calibration of {fit.gpu} ({profile.name})",
                ["class", "rows", "factor", "MAPE catalog", "MAPE fitted"], rows)
    typer.echo(f"held-out op-time MAPE (two-fold): {fit.holdout_mape:.1%}")
    if fit.skipped:
        typer.echo(f"left out (no roofline class): {', '.join(fit.skipped)}")
    make_parent(out).write_text(json.dumps(cal.to_json(), indent=2) + "\n", encoding="utf-8")
    typer.echo(f"wrote {out}")
