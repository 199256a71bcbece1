"""Traces and profiles carry a SHA-256 of their content; an edited or damaged file is refused
with one line (issue 18: `sim validate` accepted a corrupted trace), an old file without a
hash still loads, and every committed trace and profile matches its hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.cli import main
from trainsim.errors import DataFileError, TraceError
from trainsim.validate.profile_db import HASH_KEY, ProfileDB
from trainsim.validate.trace_record import MeasuredTrace, content_hash


@pytest.mark.parametrize("name", ["tiny-gpt-dp2.json", "tiny-gpt-pp2.json",
                                  "tiny-gpt-tp2.json", "tiny-t5-dp2.json"])
def test_committed_traces_match_their_hash(traces_dir: Path, name: str) -> None:
    data = json.loads((traces_dir / name).read_text(encoding="utf-8"))
    assert data["sha256"] == content_hash(data)
    MeasuredTrace.load(traces_dir / name)


def test_edited_trace_is_refused(traces_dir: Path, tmp_path: Path, capsys) -> None:
    data = json.loads((traces_dir / "tiny-gpt-dp2.json").read_text(encoding="utf-8"))
    data["iteration_times_s"][0] *= 0.5  # a "better" measurement typed in by hand
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(TraceError, match="does not match its sha256"):
        MeasuredTrace.load(bad)
    with pytest.raises(SystemExit) as info:
        main(["validate", str(bad), "--profile", str(traces_dir / "profile.csv")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "sha256" in err and len(err.strip().splitlines()) == 1


def test_trace_without_hash_still_loads(traces_dir: Path, tmp_path: Path) -> None:
    data = json.loads((traces_dir / "tiny-gpt-dp2.json").read_text(encoding="utf-8"))
    del data["sha256"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data), encoding="utf-8")
    assert MeasuredTrace.load(old).model == "tiny-gpt"


def test_edited_profile_is_refused(traces_dir: Path, tmp_path: Path) -> None:
    text = (traces_dir / "profile.csv").read_text(encoding="utf-8")
    head, body = text.split("\n", 1)
    assert f'"{HASH_KEY}"' in head
    lines = body.splitlines()
    lines[1] = lines[1].replace(",10,", ",11,", 1)  # one row's repeat count changed
    bad = tmp_path / "profile.csv"
    bad.write_text(head + "\n" + "\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataFileError, match="do not match"):
        ProfileDB.load(bad)


def test_profile_round_trip_keeps_meta_clean(traces_dir: Path, tmp_path: Path) -> None:
    db = ProfileDB.load(traces_dir / "profile.csv")
    assert HASH_KEY not in db.meta
    db.save(tmp_path / "again.csv")
    assert ProfileDB.load(tmp_path / "again.csv").rows == db.rows
