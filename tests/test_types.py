"""The type checker passes with 0 errors: mypy over the whole package, with the strict flags
on the core packages (pyproject.toml [tool.mypy])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

mypy = pytest.importorskip("mypy", reason="mypy is in the test extras")


@pytest.mark.slow
def test_mypy_reports_no_errors(tmp_path: Path) -> None:
    # The repository root is the `trainsim` package (DESIGN.md §1): mypy sees it through a link.
    (tmp_path / "trainsim").symlink_to(REPO, target_is_directory=True)
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
               "--cache-dir", str(tmp_path / ".mypy_cache"), "-p", "trainsim"]
    run = subprocess.run(command, check=False, cwd=tmp_path, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
