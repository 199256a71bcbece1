"""Perseus profile CSV loading and its one-line errors."""

from __future__ import annotations

import pytest

from trainsim.cli import main
from trainsim.errors import DataFileError
from trainsim.search.energy.planner import load_dag
from trainsim.search.energy.profile import load_perseus_csv

HEADER = "stage,instruction,frequency,time,energy\n"
GOOD = HEADER + "".join(
    f"{s},{inst},{f},{t},{e}\n"
    for s in (0, 1)
    for inst, base in (("forward", 0.002), ("backward", 0.004))
    for f, t, e in ((1410, base, 1.0), (1200, base * 1.5, 0.8)))


def write(tmp_path, text: str):
    path = tmp_path / "p.csv"
    path.write_text(text)
    return path


def test_loads_options_fastest_first(tmp_path) -> None:
    """Rows become per (stage, instruction) options sorted by descending frequency."""
    prof = load_perseus_csv(write(tmp_path, GOOD), blocking_power_w=83.64)
    assert prof.num_stages == 2
    opts = prof.options[(1, "backward")]
    assert opts.freq_mhz.tolist() == [1410, 1200]
    assert opts.time_s.tolist() == pytest.approx([0.004, 0.006])
    assert prof.common_frequencies_mhz() == [1410, 1200]


@pytest.mark.shared_files("perseus/stage_profile", "*.csv")
def test_reference_profiles_load(shared_file) -> None:
    """Each Perseus stage profile passes the checks (A40 noise is within tolerance)."""
    prof = load_perseus_csv(shared_file, blocking_power_w=70.0)
    assert prof.num_stages == 8


@pytest.mark.parametrize(("text", "needle"), [
    (GOOD.replace("1,backward,1200,0.006,0.8\n", "1,backward,1200,0.006,-0.8\n"), "row 9: energy"),
    (GOOD.replace("stage,instruction", "stage,kind"), "header"),
    ("".join(line for line in GOOD.splitlines(True) if not line.startswith("1,")), None),
    (GOOD + "3,forward,1410,0.002,1.0\n3,backward,1410,0.004,1.0\n", "stage 2"),
    (GOOD.replace("0,forward,1410,0.002,1.0", "0,forward,1410,0.009,1.0"), "row 2"),
    (GOOD.replace("0,forward,1410,0.002", "0,forward,1410,abc"), "non-numeric"),
    (GOOD.replace("0,forward,1200", "0,sideways,1200"), "instruction='sideways'"),
    (GOOD + "0,forward,1410,0.002,1.0\n", "duplicate"),
])
def test_bad_rows_raise_one_line(tmp_path, text: str, needle: str | None) -> None:
    """Negative energy, bad header, missing or skipped stages, non-monotone time, junk: one line
    naming the row (or the missing stage/instruction)."""
    with pytest.raises(DataFileError) as info:
        load_perseus_csv(write(tmp_path, text), blocking_power_w=10.0, num_stages=2
                         if needle is None else None)
    message = str(info.value)
    assert "\n" not in message
    if needle is not None:
        assert needle in message
    else:
        assert "no row for stage 1" in message


def test_missing_instruction(tmp_path) -> None:
    """A stage without its backward rows is rejected naming stage and instruction."""
    text = "".join(line for line in GOOD.splitlines(True) if not line.startswith("0,backward"))
    with pytest.raises(DataFileError, match="stage 0 instruction 'backward'"):
        load_perseus_csv(write(tmp_path, text), blocking_power_w=10.0)


def _write_profile(path, freqs) -> None:
    rows = ["stage,instruction,frequency,time,energy"]
    for stage in (0, 1):
        for inst, base in (("forward", 0.05), ("backward", 0.1)):
            rows += [f"{stage},{inst},{f},{base * max(freqs) / f},{base * 300}" for f in freqs]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


@pytest.mark.parametrize(("name", "freqs", "gpu", "needle"), [
    ("m+a40_bf16.csv", (1200, 1740), "A100-SXM4-40GB", "outside --gpu A100-SXM4-40GB"),
    ("m+a100_sxm_bf16.csv", (1200, 1410), "A40", "names GPU A100"),
])
def test_profile_of_another_gpu_is_refused(tmp_path, capsys, name, freqs, gpu, needle) -> None:
    """Regression (issue 18): `sim energy` accepted a profile measured on another GPU than
    --gpu and planned the wrong device with no word; now exit 2 naming both."""
    path = tmp_path / name
    _write_profile(path, freqs)
    with pytest.raises(SystemExit) as info:
        main(["energy", "frontier", "--profile", str(path), "--gpu", gpu, "--microbatches",
              "2"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_profile_of_the_same_gpu_is_accepted(tmp_path) -> None:
    path = tmp_path / "m+a100_sxm_bf16.csv"
    _write_profile(path, (1200, 1410))
    dag = load_dag(2, profile=path, gpu="A100-SXM4-80GB")
    assert dag is not None
