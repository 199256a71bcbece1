"""Packaging: the wheel holds only `trainsim/…`, and `sim --help` works from any folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


def _sim_command() -> list[str]:
    exe = shutil.which("sim")
    return [exe] if exe else [sys.executable, "-m", "trainsim.cli"]


@pytest.mark.slow  # a fresh interpreter importing the CLI
def test_sim_help_from_any_folder(tmp_path: Path) -> None:
    """`sim --help` runs outside the repository and lists the command groups."""
    out = subprocess.run([*_sim_command(), "--help"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    for group in ("hw", "models", "simulate"):
        assert group in out.stdout


@pytest.mark.slow  # copies the tree and builds a wheel with pip
def test_wheel_contains_only_trainsim(tmp_path: Path, repo_root: Path) -> None:
    """A wheel built from the tracked files holds nothing outside `trainsim/` (and its
    dist-info), ships the data files, and leaves tests/bench/traces out."""
    if not (repo_root / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs a git checkout to list tracked files")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=repo_root,
                           capture_output=True, text=True, check=True).stdout.split()
    src = tmp_path / "src"
    for name in files:
        if (repo_root / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo_root / name, src / name)
    dist = tmp_path / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)]
    # Build with the installed setuptools when it is recent enough; else let pip isolate.
    build = subprocess.run([*cmd, "--no-build-isolation"], capture_output=True, text=True,
                           timeout=300, check=False)
    if build.returncode != 0:
        build = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if build.returncode != 0:
        pytest.fail(f"wheel build failed: {build.stderr[-2000:]}")
    wheel = next(dist.glob("trainsim-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    outside = [n for n in names if not n.startswith(("trainsim/", "trainsim-"))]
    assert outside == []
    assert "trainsim/cli.py" in names
    assert "trainsim/hwmodels/data/gpus.json" in names
    assert "trainsim/workloads/data/models.yaml" in names
    assert not any(n.startswith(("trainsim/tests/", "trainsim/bench/")) for n in names)


def test_every_package_folder_is_in_the_wheel_list(repo_root: Path) -> None:
    """A new subpackage (a folder with __init__.py) missing from pyproject's `packages` would
    be left out of a non-editable install, and importing it would fail there only."""
    import tomllib

    listed = set(tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"][
        "setuptools"]["packages"])
    skip = {"tests", "bench", "traces", "build", "dist"}
    found = {"trainsim." + ".".join(p.parent.relative_to(repo_root).parts)
             for p in repo_root.rglob("__init__.py")
             if p.parent != repo_root and not set(p.relative_to(repo_root).parts) & skip
             and not any(part.startswith(".") or part.endswith(".egg-info")
                         for part in p.relative_to(repo_root).parts)}
    assert found - listed == set()
