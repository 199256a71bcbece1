"""The profiler's routine native log lines are dropped; anything else written to fd 2 stays."""

from __future__ import annotations

import os

import pytest

from trainsim.validate.native_stderr import filtered_native_stderr


def test_profiler_lines_are_dropped_and_others_kept(capfd: pytest.CaptureFixture[str]) -> None:
    with filtered_native_stderr():
        os.write(2, b"USDT:2026-11-27 23:05:38 7888:7888 SyncActivityProfilerHandler.cpp:52] "
                    b"profiler_start\n")
        os.write(2, b"[rank0]:[W1127 CPUAllocator.cpp:245] Memory block of unknown size was "
                    b"allocated before the profiling started, profiler results will not\n")
        os.write(2, b"a real warning\n")
    err = capfd.readouterr().err
    assert err == "a real warning\n"


def test_lines_written_before_an_error_still_show(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), filtered_native_stderr():
        os.write(2, b"what went wrong\n")
        raise RuntimeError("stop")
    assert capfd.readouterr().err == "what went wrong\n"
    os.write(2, b"after\n")  # fd 2 is back where it was
    assert capfd.readouterr().err == "after\n"
