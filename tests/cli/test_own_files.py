"""The Quickstart can be run twice: trainsim replaces the timelines and traces it wrote itself
(they carry its marker), never a file it did not write (that still needs --force)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.cli import main
from trainsim.simulator.own_files import written_by_trainsim

RUN = ["simulate", "--model", "gpt3-125m", "--global-batch", "8", "--json"]


def _code(capsys: pytest.CaptureFixture[str], *args: str) -> int:
    with pytest.raises(SystemExit) as info:
        main([*RUN, *args])
    capsys.readouterr()
    return int(info.value.code or 0)


def test_a_rerun_replaces_its_own_timeline_and_trace(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    html, trace = tmp_path / "t.html", tmp_path / "t.json"
    assert _code(capsys, "--timeline", str(html), "--trace", str(trace)) == 0
    assert written_by_trainsim(html) and written_by_trainsim(trace)
    assert _code(capsys, "--timeline", str(html), "--trace", str(trace)) == 0


def test_a_users_file_of_the_same_name_is_kept(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    mine = tmp_path / "t.html"
    mine.write_text("<html><head><title>my notes</title></head></html>")
    assert not written_by_trainsim(mine)
    assert _code(capsys, "--timeline", str(mine)) == 2
    assert "my notes" in mine.read_text()
