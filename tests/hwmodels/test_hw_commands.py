"""`sim hw` commands through typer's CliRunner and through cli.main (exit code 2 on errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli import app, main

RUNNER = CliRunner()


def test_list_json() -> None:
    """`sim hw list --json` lists every GPU with its peak."""
    result = RUNNER.invoke(app, ["hw", "list", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    a100 = next(d for d in data if d["name"] == "A100-SXM4-40GB")
    assert a100["peak_flops"]["fp16"] == pytest.approx(312e12, rel=1e-3)


def test_list_table() -> None:
    """`sim hw list` prints a table naming the GPUs."""
    result = RUNNER.invoke(app, ["hw", "list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "H100-SXM5-80GB" in result.output


@pytest.mark.parametrize(
    ("name", "kind"), [("a40", "gpu"), ("dgx1-v100", "node_type"), ("ib-hdr", "nic")]
)
def test_show_json(name: str, kind: str) -> None:
    """`sim hw show NAME --json` finds GPUs, node types and NICs, with sources."""
    result = RUNNER.invoke(app, ["hw", "show", name, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["kind"] == kind and data["sources"]


def test_show_table() -> None:
    """`sim hw show` prints fields and sources."""
    result = RUNNER.invoke(app, ["hw", "show", "A100-SXM4-40GB"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "idle_power_w" in result.output and "sources" in result.output


def test_cluster_json() -> None:
    """`sim hw cluster SPEC --json`: counts, price, per-group rows and link classes."""
    result = RUNNER.invoke(app, ["hw", "cluster", "1x8xA100-SXM4-40GB+7x4xA10", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["num_nodes"], data["num_gpus"]) == (8, 36)
    assert data["price_per_hour_usd"] == pytest.approx(32.7726 + 7 * 8.144)
    assert {x["kind"] for x in data["links"]} == {"nvswitch", "pcie", "nic"}


def test_cluster_table() -> None:
    """`sim hw cluster SPEC` prints the node groups."""
    result = RUNNER.invoke(app, ["hw", "cluster", "2x8xA100-SXM4-80GB"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "dgx-a100" in result.output


def test_errors_are_one_line_even_through_the_bare_app() -> None:
    """Through the bare typer app too, a user error is one `error:` line and exit code 2
    (every command wears commands.output.user_errors)."""
    for argv, words in ((["hw", "show", "A100"], "did you mean"), (["hw", "cluster", "4xx"], "4xx")):
        result = RUNNER.invoke(app, argv)
        assert result.exit_code == 2
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0]


def _main_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ")
    return err


def test_main_unknown_gpu_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """`sim hw show A100` exits 2 with one line suggesting A100 variants."""
    err = _main_error(["hw", "show", "A100"], capsys)
    assert "'A100'" in err and "A100-SXM4-40GB" in err


def test_main_malformed_spec_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """`sim hw cluster 4xx` exits 2 quoting the spec."""
    assert "'4xx'" in _main_error(["hw", "cluster", "4xx"], capsys)


def test_main_yaml_missing_field_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster YAML missing gpus_per_node exits 2 naming the file and the field."""
    path = tmp_path / "c.yaml"
    path.write_text("node_groups:\n  - {gpu: A10, nodes: 2}\n")
    err = _main_error(["hw", "cluster", str(path)], capsys)
    assert "c.yaml" in err and "gpus_per_node" in err


def test_main_success_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    """A good command through main exits 0 (typer standalone mode raises SystemExit(0))."""
    with pytest.raises(SystemExit) as info:
        main(["hw", "cluster", "4xV100-SXM2-32GB", "--json"])
    assert info.value.code in (0, None)
    assert json.loads(capsys.readouterr().out)["num_gpus"] == 4
