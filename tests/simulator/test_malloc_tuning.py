"""`sim` keeps freed memory in the heap at start-up (simulator/malloc_tuning.py): glibc's mmap
and trim thresholds raised, unless the user tuned malloc; the Python API is left alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainsim import cli
from trainsim.simulator import malloc_tuning

_PROBE = """
import ctypes, sys
from trainsim.simulator.malloc_tuning import keep_freed_memory
applied = keep_freed_memory()
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2"):  # glibc < 2.33
    print("no-mallinfo2")
    sys.exit(0)
info = libc.mallinfo2
info.restype = MallInfo2
import numpy as np
before = info().hblks
a = np.ones(4 * 2**20)  # 32 MiB: above glibc's largest dynamic mmap threshold
print(applied, info().hblks - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
@pytest.mark.parametrize("env", [{}, {"MALLOC_MMAP_THRESHOLD_": "131072"}])
def test_large_arrays_come_from_the_heap_unless_the_user_tuned_malloc(env) -> None:
    """In a fresh process: applied, a 32 MiB array is no mmapped block (glibc's `hblks` does
    not grow); with the user's own setting, not applied and the array is mmapped."""
    import os

    environ = {k: v for k, v in os.environ.items() if k not in malloc_tuning.USER_SETTINGS}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**environ, **env},
                         capture_output=True, text=True, check=True).stdout.split()
    if out == ["no-mallinfo2"]:
        pytest.skip("glibc before 2.33 has no mallinfo2 to count mmapped blocks")
    if not env:
        assert out == ["True", "0"]
    else:
        assert out == ["False", "1"]


def test_sim_applies_it_at_start_up(monkeypatch) -> None:
    called: list[bool] = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: called.append(True) or True)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert called == [True]


def test_skipped_off_linux(monkeypatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert malloc_tuning.keep_freed_memory.__wrapped__() is False
