"""Every `sim` command in the README runs as written, in order, in a fresh folder (outputs of
one command feed the next, e.g. --save-plan then --plan). Only search budgets shrink: the
wall clock's, or for the planners that count Oracle evaluations (hetero, fasop, uniform) a
count instead, so that they run the same plans however loaded the machine; bench/ scripts
are benchmarks and run elsewhere."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from trainsim.cli import main
from trainsim.search.methods import EVALUATION_BUDGET_METHODS

REPO = Path(__file__).resolve().parents[1]
SMALLER = {"--time-budget-s": "5"}
NEEDS_REFERENCE_DATA = ("sim calibrate", "sim accuracy")
"""README commands that read ../shared/data (Perseus' profiles), and those that use what they
write (calibration.json): left out where the data is absent (a fresh clone elsewhere), never
under CI."""
"""Options shrunk for the test: the search's wall-clock budget."""
COUNTED = {"--time-budget-s": "3600"}
EVALUATIONS = ["--max-evals", "30"]
"""A search by a planner with an evaluation budget (`EVALUATION_BUDGET_METHODS`) runs 30 plans
(the README's hetero search finds its first plan that fits memory at the 25th) under a wall
clock long enough never to stop it: 5 s of wall clock ran out before the 25th on a loaded
machine."""


def readme_sim_commands() -> list[str]:
    """The `sim ...` lines of the README's bash blocks, continuations joined, comments cut."""
    text = (REPO / "README.md").read_text()
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("sim "):
                commands.append(line)
    return commands


def _args(command: str) -> list[str]:
    words = shlex.split(command)[1:]
    counted = words[0] == "search" and "--method" in words \
        and words[words.index("--method") + 1] in EVALUATION_BUDGET_METHODS
    shrunk = COUNTED if counted else SMALLER
    args = [shrunk.get(words[i - 1], w) if i else w for i, w in enumerate(words)]
    return [*args, *EVALUATIONS] if counted else args


def test_searches_that_count_evaluations_are_bounded_by_them() -> None:
    """The README's hetero search runs under a count of evaluations, not 5 s of wall clock."""
    hetero = next(c for c in readme_sim_commands() if "--method hetero" in c)
    args = _args(hetero)
    assert args[-2:] == EVALUATIONS
    assert args[args.index("--time-budget-s") + 1] == "3600"
    grid = next(c for c in readme_sim_commands() if "--method aceso" in c)
    assert "--max-evals" not in _args(grid) and "5" in _args(grid)


def test_the_readme_has_sim_commands() -> None:
    commands = readme_sim_commands()
    assert len(commands) >= 15 and all(c.startswith("sim ") for c in commands)


@pytest.mark.slow
def test_every_readme_command_runs_as_written(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "traces").symlink_to(REPO / "traces", target_is_directory=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    failed = []
    try:
        shared = Path(os.environ.get("TRAINSIM_SHARED_DATA", REPO.parent / "shared" / "data"))
        if shared.is_dir():  # an installed (not editable) trainsim cannot find ../shared itself
            monkeypatch.setenv("TRAINSIM_SHARED_DATA", str(shared.resolve()))
        for command in readme_sim_commands():
            if (command.startswith(NEEDS_REFERENCE_DATA) or "calibration.json" in command) \
                    and not shared.is_dir() \
                    and os.environ.get("CI", "").lower() != "true":
                continue
            with pytest.raises(SystemExit) as info:
                main(_args(command))
            err = capsys.readouterr().err
            if info.value.code not in (0, None):
                failed.append(f"{command}\n  -> exit {info.value.code}: {err.strip()[-300:]}")
    finally:
        os.chdir(cwd)
    assert not failed, "\n".join(failed)
