"""`sim trace` and `sim profile` refuse, before spawning any worker, what cannot run here:
more processes than CPUs, a model whose Adam state exceeds the memory, options out of range."""

from __future__ import annotations

import os

import pytest

from trainsim.cli import main
from trainsim.errors import TraceError
from trainsim.validate.worker_limits import (
    TRAINING_STATE_BYTES_PER_PARAM,
    WORKER_OVERHEAD_BYTES,
    check_memory,
    check_processes,
    training_memory_bytes,
)


def _one_error_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    return err[0]


def test_process_cap() -> None:
    """With 4 CPUs, 4 processes pass and 5 fail naming the option and the limit."""
    check_processes("--processes", 4, cpus=4)
    with pytest.raises(TraceError, match=r"--processes: 5 worker processes .* at most 4"):
        check_processes("--processes", 5, cpus=4)
    with pytest.raises(TraceError, match="at least 1"):
        check_processes("--processes", 0, cpus=4)


def test_memory_estimate_is_16_bytes_per_parameter_per_replica() -> None:
    """fp32 weight + gradient + Adam m and v = 16 B per parameter (Kingma & Ba Alg. 1), once
    per data-parallel replica, plus the per-worker overhead: 1e9 parameters at dp=2 on 4
    workers = 32 GB + 4 overheads."""
    assert TRAINING_STATE_BYTES_PER_PARAM == 16
    assert training_memory_bytes(1e9, 2, 4) == 32e9 + 4 * WORKER_OVERHEAD_BYTES
    check_memory("--model", "m", 1e9, available_bytes=2 * 10**9)
    with pytest.raises(TraceError, match=r"--model m: needs at least 3 GB .* 2\.0 GB"):
        check_memory("--model", "m", 3e9, available_bytes=2 * 10**9)
    assert training_memory_bytes(1e9, 2, 4, 1e6) == 32e9 + 4 * WORKER_OVERHEAD_BYTES + 2e6


@pytest.mark.parametrize("argv", [
    ["profile", "--warmup", "1000000000000"],
    ["profile", "--micro-batch", "1000000000000"],
    ["trace", "--micro-batches", "1000000000000"],
    ["trace", "--micro-batch", "1000000000000"],
    ["trace", "--iterations", "99999999"],
])
def test_work_that_would_not_finish_is_refused_before_spawning(argv, tmp_path, capsys) -> None:
    """Regression (found by tests/test_fuzz_cli.py): a huge --warmup / --micro-batches ran until
    killed, a huge --micro-batch died in a worker with a torch allocation error; now one line
    and exit 2 before any worker starts (the call budget MAX_CALLS, activations in the
    memory estimate)."""
    line = _one_error_line(capsys, [*argv, "--out", str(tmp_path / "x")])
    assert "limit of 100,000" in line or "micro-batch's activations" in line


def test_trace_with_more_workers_than_cpus_is_refused(tmp_path, capsys) -> None:
    """`sim trace --plan dp=N` with N = CPUs + 1 exits 2 naming --plan and the CPU count,
    without spawning (it used to fork N workers and hang)."""
    n = (os.cpu_count() or 1) + 1
    line = _one_error_line(capsys, ["trace", "--model", "micro-gpt", "--plan", f"dp={n}",
                                    "--out", str(tmp_path / "t.json")])
    assert "--plan" in line and f"{os.cpu_count()} CPUs" in line
    assert not (tmp_path / "t.json").exists()


def test_trace_of_a_huge_model_is_refused(tmp_path, capsys) -> None:
    """GPT-3 175B at dp2 needs 2 × 175e9 × 16 B = 5.6 TB of Adam state: exit 2 naming
    --model instead of a worker killed by the OOM killer."""
    line = _one_error_line(capsys, ["trace", "--model", "gpt3-175b", "--plan", "dp2",
                                    "--out", str(tmp_path / "t.json")])
    assert "--model gpt3-175b" in line and "GB" in line


@pytest.mark.parametrize(("args", "needle"), [
    (["--micro-batch", "-1"], "--micro-batch -1"),
    (["--processes", "0"], "--processes 0"),
    (["--processes", "100000"], "at most"),
    (["--repeats", "0"], "--repeats 0"),
    (["--warmup", "-1"], "--warmup -1"),
    (["--model", "gpt3-175b"], "--model gpt3-175b"),
])
def test_profile_options_are_checked(tmp_path, capsys, args, needle) -> None:
    """Bad `sim profile` options are one error line naming the option (not a ValueError
    traceback or 100000 forked workers)."""
    line = _one_error_line(capsys, ["profile", "--out", str(tmp_path / "p.csv"), *args])
    assert needle in line


@pytest.mark.parametrize(("args", "needle"), [
    (["--micro-batch", "0"], "--micro-batch 0"),
    (["--micro-batches", "-2"], "--micro-batches -2"),
    (["--iterations", "0"], "--iterations 0"),
])
def test_trace_options_are_checked(tmp_path, capsys, args, needle) -> None:
    """Bad `sim trace` counts are one error line naming the option."""
    line = _one_error_line(capsys, ["trace", "--model", "micro-gpt", "--out",
                                    str(tmp_path / "t.json"), *args])
    assert needle in line
