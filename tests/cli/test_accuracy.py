"""`sim accuracy`: tables and a scatter page from a published-runs CSV; a bad CSV path or
content is one line and exit 2; output paths are checked before any work."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from trainsim.cli import main
from trainsim.simulator.own_files import HTML_MARKER
from trainsim.validate.published_runs import COLUMNS, SHARED_DATA_ENV

ROW = {
    "source": "hand", "name": "tiny-run", "gpu": "A100-SXM4-80GB", "nodes": "1",
    "gpus_per_node": "2", "params_b": "", "layers": "2", "hidden": "256", "heads": "4",
    "kv_heads": "2", "ffn": "512", "seq": "128", "vocab": "1000", "tp": "1", "pp": "1",
    "cp": "1", "dp": "2", "global_batch": "8", "micro_batch": "2", "virtual_stages": "",
    "sequence_parallel": "", "recompute": "none", "zero": "0", "dtype": "bf16",
    "framework": "torchtitan", "ref_kind": "tokens_per_s_per_gpu", "ref_value": "1000",
    "notes": "",
}


def _csv(tmp_path: Path, rows: list[dict[str, str]]) -> Path:
    path = tmp_path / "runs.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["accuracy", *args])
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


@pytest.mark.slow  # about 1 s: the first run here imports plotly and the numba engine
def test_tables_plot_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _csv(tmp_path, [ROW, {**ROW, "ref_kind": "peak_memory_gib", "ref_value": "5"},
                           {**ROW, "name": "cp-run", "cp": "2", "dp": "1"}])
    plot, out_json = tmp_path / "acc.html", tmp_path / "acc.json"
    code, out, err = _run(capsys, str(path), "--plot", str(plot), "--json", str(out_json))
    assert code == 0, err
    assert "tiny-run" in out and "MAPE" in out and "overall" in out
    assert plot.read_text(encoding="utf-8").count(HTML_MARKER) == 1
    doc = json.loads(out_json.read_text(encoding="utf-8"))
    lines = {r["line"] for r in doc["rows"]} | {r["line"] for r in doc["not_expressible"]}
    assert lines == {2, 3, 4}
    assert {s["kind"] for s in doc["stats"]} == {"tokens_per_s_per_gpu", "peak_memory_gib"}
    if doc["not_expressible"]:  # until plans model context parallelism
        assert "cannot express" in out and "cp=2" in out
    # its own page is replaced on a rerun; the JSON file is the user's: --force
    assert _run(capsys, str(path), "--plot", str(plot))[0] == 0
    code, _, err = _run(capsys, str(path), "--plot", str(plot), "--json", str(out_json))
    assert code == 2 and "--force" in err


@pytest.mark.parametrize(("content", "needle"), [
    (None, "no such CSV"),
    (",".join(COLUMNS[:-1]) + "\n", "misses column 'notes'"),
    (",".join(COLUMNS) + "\n" + ",".join(["x"] * len(COLUMNS)) + "\n", ":2: field 'nodes'"),
])
def test_bad_csv_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        content: str | None, needle: str) -> None:
    path = tmp_path / "runs.csv"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    code, _, err = _run(capsys, str(path), "--plot", str(tmp_path / "a.html"))
    assert code == 2
    assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "a.html").exists()


def test_existing_plot_is_refused_before_work(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "mine.html"
    plot.write_text("my notes", encoding="utf-8")
    code, out, err = _run(capsys, str(tmp_path / "absent.csv"), "--plot", str(plot))
    assert code == 2 and "exists" in err and "--force" in err and out == ""
    assert plot.read_text(encoding="utf-8") == "my notes"
    path = _csv(tmp_path, [ROW])
    assert _run(capsys, str(path), "--plot", str(plot), "--force")[0] == 0
    assert HTML_MARKER in plot.read_text(encoding="utf-8")


def test_missing_reference_data_says_where(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHARED_DATA_ENV, str(tmp_path / "nowhere"))
    code, _, err = _run(capsys, "--plot", str(tmp_path / "a.html"))
    assert code == 2 and "no published runs" in err and SHARED_DATA_ENV in err
