"""Shared fixtures: where the repository, its committed traces and the reference data live.

Reference data (Perseus, Aceso, ... measurements) is not in this repository: it sits in
``../shared/data`` beside the clone, or wherever ``TRAINSIM_SHARED_DATA`` points. A test that
needs it asks for a folder under it and is skipped when the folder is missing — except under
CI (``CI=true``), which always has the data, so there a missing folder fails the test.

In a test::

    def test_x(shared_subdir):
        folder = shared_subdir("perseus/stage_profile")   # skip / fail when missing

One test per data file, chosen at collection time::

    @pytest.mark.shared_files("aceso/profiled-time-miniset", "*.csv")
    def test_y(shared_file: Path): ...

Collection cannot skip one test (``pytest.skip`` there skips the whole module, ``pytest.fail``
aborts the whole run), and a test module cannot import this conftest under
``--import-mode=importlib``. So the marker is expanded here (``pytest_generate_tests``) by the
plain function ``shared_files``, which never raises: when the folder is missing it gives one
placeholder case, which the ``shared_file`` fixture turns into a skip, or under CI a failure,
when that test runs.

Tests slower than about a second carry ``@pytest.mark.slow``; ``pytest -m "not slow"`` is the
quick run, the full suite (CI) runs everything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA_ENV = "TRAINSIM_SHARED_DATA"


def in_ci() -> bool:
    """True on CI (``CI=true``), where the reference data must be present."""
    return os.environ.get("CI", "").lower() == "true"


def shared_data_path() -> Path:
    """The reference-data folder, whether it exists or not: ``$TRAINSIM_SHARED_DATA`` when set,
    else ``../shared/data`` relative to the repository root."""
    env = os.environ.get(SHARED_DATA_ENV)
    return Path(env).expanduser().resolve() if env else REPO_ROOT.parent / "shared" / "data"


def _missing(path: Path) -> str:
    where = (f"{SHARED_DATA_ENV} is set" if os.environ.get(SHARED_DATA_ENV) else
             f"the default; set {SHARED_DATA_ENV} to use another folder")
    return f"reference data not found at {path} ({where})"


def require_shared(sub: str | os.PathLike[str] = "") -> Path:
    """The folder ``sub`` under the reference data; skips the calling test when it is missing,
    fails it under CI. Call it from a test or fixture, not at import time."""
    path = shared_data_path() / sub
    if not path.is_dir():
        if in_ci():
            pytest.fail(_missing(path) + " — required when CI=true", pytrace=False)
        pytest.skip(_missing(path))
    return path


@dataclass(frozen=True)
class MissingSharedData:
    """Placeholder case that ``shared_files`` returns when its folder is missing or empty."""

    sub: str
    pattern: str


def shared_files(sub: str | os.PathLike[str], pattern: str = "*") -> list:
    """Parameter values for the ``shared_file`` fixture (indirect parametrisation): the files
    matching ``pattern`` in ``sub`` under the reference data, sorted, with their relative paths
    as ids. Safe at collection time: when the folder is missing, or holds no match, it returns
    one placeholder case that the ``shared_file`` fixture skips (fails under CI)."""
    folder = shared_data_path() / sub
    files = sorted(folder.glob(pattern)) if folder.is_dir() else []
    if not files:
        return [pytest.param(MissingSharedData(os.fspath(sub), pattern),
                             id="shared-data-missing")]
    return [pytest.param(p, id=p.relative_to(folder).as_posix()) for p in files]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (which is the ``trainsim`` package folder)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def traces_dir(repo_root: Path) -> Path:
    """``traces/``: the committed measured traces and their ``profile.csv``."""
    return repo_root / "traces"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The reference-data folder; skips the test when it is missing (fails under CI)."""
    return require_shared()


@pytest.fixture(scope="session")
def shared_subdir(shared_data: Path) -> Callable[[str], Path]:
    """``shared_subdir("perseus/stage_profile")``: a folder under the reference data; skips the
    test when it is missing (fails under CI). Session-scoped, so fixtures of any scope can use
    it: ``@pytest.fixture(scope="module") def data(shared_subdir): return shared_subdir("aceso")``.
    """
    return require_shared


@pytest.fixture
def shared_file(request: pytest.FixtureRequest) -> Path:
    """One file from ``shared_files(...)`` (indirect parametrisation); the missing-data
    placeholder becomes a skip, or a failure under CI."""
    value = getattr(request, "param", None)
    if value is None:
        pytest.fail("the shared_file fixture needs @pytest.mark.shared_files(sub, pattern)",
                    pytrace=False)
    if isinstance(value, MissingSharedData):
        folder = require_shared(value.sub)
        msg = f"no reference files match {value.pattern!r} in {folder}"
        if in_ci():
            pytest.fail(msg + " — required when CI=true", pytrace=False)
        pytest.skip(msg)
    return Path(value)


@pytest.fixture(scope="session")
def e2e_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The costly end-to-end run, once per session (about 20 s: torch workers, gloo on
    127.0.0.1): `sim profile` of micro-gpt on 2 CPU processes into ``profile.csv``, then
    `sim trace` DP2 and TP2 into ``dp2.json`` and ``tp2.json``; returns their folder. Tests that
    use it are slow: mark them ``@pytest.mark.slow``."""
    d = tmp_path_factory.mktemp("e2e")
    run_cli(["profile", "--device", "cpu", "--model", "micro-gpt", "--out",
             str(d / "profile.csv"), "--warmup", "1", "--repeats", "2"])
    for plan in ("dp2", "tp2"):
        run_cli(["trace", "--model", "micro-gpt", "--plan", plan, "--iterations", "2",
                 "--warmup", "1", "--out", str(d / f"{plan}.json")])
    return d


def run_cli(argv: list[str]) -> None:
    """Run `sim argv` in this process and require exit code 0."""
    from trainsim.cli import main  # here, not at the top: conftest loads for every test run

    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None), f"sim {' '.join(argv)} exited {exc.code}"


@pytest.fixture
def sim(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """`sim(argv)` runs `sim argv` in this process: (exit code, stdout, stderr)."""
    from trainsim.cli import main  # here, not at the top: conftest loads for every test run

    def run(argv: list[str]) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as info:
            main(argv)
        out = capsys.readouterr()
        return int(info.value.code or 0), out.out, out.err

    return run


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Expand ``@pytest.mark.shared_files(sub, pattern="*")`` into one ``shared_file`` case per
    matching file."""
    marker = metafunc.definition.get_closest_marker("shared_files")
    if marker is None:
        return
    if "shared_file" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.shared_files needs "
                                "a `shared_file` argument")
    metafunc.parametrize("shared_file", shared_files(*marker.args, **marker.kwargs),
                         indirect=True)


@pytest.fixture
def render_dom(tmp_path: Path) -> Callable[[Path, int], tuple[str, list[str]]]:
    """`render_dom(page, height)` loads an HTML page in headless Chromium and returns the DOM
    after its scripts ran and the console lines reporting an error; skips without Chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed (apt-get install chromium)")

    def render(page: Path, height: int) -> tuple[str, list[str]]:
        done = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             "--enable-logging=stderr", "--v=0", f"--window-size=1400,{height}",
             "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
            check=True, capture_output=True, text=True, timeout=120)
        console = [ln for ln in done.stderr.splitlines() if ":CONSOLE" in ln]
        return done.stdout, [ln for ln in console if "Uncaught" in ln or "Error" in ln]

    return render


@pytest.fixture(autouse=True)
def _numpy_passes_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the one-program threshold of the compiled CSR passes: an Oracle
    built by an earlier test lowers it for the rest of the process (task_table
    `use_compiled_kernels`), which would leave the numpy paths untested in any later test."""
    from trainsim.simulator import task_table

    monkeypatch.setattr(task_table, "_THRESHOLD", [task_table.COMPILED_FROM])
