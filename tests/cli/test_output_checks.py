"""commands/output.py: output paths are checked before the work, by writing there (root passes
permission bits, so `os.access` alone lets /proc and read-only mounts through)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from trainsim.commands.output import check_new_file, check_out_dir
from trainsim.errors import SpecError


def test_a_folder_that_refuses_new_files_is_refused_up_front(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder whose permission bits allow writing but which refuses a new file (what /proc
    and a read-only mount do, even to root) is named, for a file and for an --out folder."""
    check_new_file(tmp_path / "plan.json", force=False, what="--save-plan")

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    with pytest.raises(SpecError, match=r"--save-plan .*plan.json.*is not writable "
                                        r"\(Read-only file system\)"):
        check_new_file(tmp_path / "plan.json", force=False, what="--save-plan")
    with pytest.raises(SpecError, match=r"--out .* is not writable"):
        check_out_dir(tmp_path / "out", ["a.html"], force=False)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc on this system")
def test_proc_is_refused() -> None:
    with pytest.raises(SpecError, match=r"folder '/proc' is not writable"):
        check_new_file(Path("/proc/x.json"), force=False, what="--timeline")
