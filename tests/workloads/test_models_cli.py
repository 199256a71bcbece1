"""`sim models list` and `sim models show`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli import app, main
from trainsim.workloads.zoo import get_model, list_models

runner = CliRunner()


def test_list_shows_every_model() -> None:
    """`sim models list` prints a table with every zoo model."""
    result = runner.invoke(app, ["models", "list"], terminal_width=160)
    assert result.exit_code == 0, result.output
    for name in list_models():
        assert name in result.output


def test_show_human_output() -> None:
    """`sim models show gpt3-1.3b` prints the exact parameter count and the layer table."""
    result = runner.invoke(app, ["models", "show", "gpt3-1.3b"])
    assert result.exit_code == 0, result.output
    assert "gpt3-1.3b" in result.output
    assert f"{get_model('gpt3-1.3b').parameters():,}" in result.output
    assert "block" in result.output and "head" in result.output


def test_show_json_has_contract_keys() -> None:
    """--json prints parameters, layers, hidden, heads, flops_per_token and
    activation_bytes_per_token, honouring --seq-len and --micro-batch."""
    result = runner.invoke(app, ["models", "show", "t5-770m", "--json", "--seq-len", "1024",
                                 "--micro-batch", "2"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("parameters", "layers", "hidden", "heads", "flops_per_token",
                "activation_bytes_per_token", "decoder_layers", "decoder_seq_len"):
        assert key in data
    assert data["seq_len"] == 1024 and data["micro_batch_size"] == 2
    assert data["parameters"] == get_model("t5-770m").parameters()


def test_show_json_is_deterministic() -> None:
    """The same command prints byte-identical JSON twice."""
    args = ["models", "show", "wresnet-500m", "--json"]
    assert runner.invoke(app, args).output == runner.invoke(app, args).output


def test_show_user_yaml(tmp_path: Path) -> None:
    """A YAML path works like a zoo name."""
    path = tmp_path / "tiny.yaml"
    path.write_text("family: gpt\nnum_layers: 2\nhidden: 64\nnum_heads: 4\nvocab_size: 100\n"
                    "seq_len: 32\n")
    result = runner.invoke(app, ["models", "show", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["name"] == "tiny"


def test_unknown_model_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown name exits with code 2 and one error line naming close matches."""
    with pytest.raises(SystemExit) as exc:
        main(["models", "show", "gpt3-1.3x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown model 'gpt3-1.3x'" in err and "gpt3-1.3b" in err


def test_malformed_yaml_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A broken YAML model exits with code 2 and one line naming the file."""
    path = tmp_path / "broken.yaml"
    path.write_text("family: gpt\nnum_layers: [\n")
    with pytest.raises(SystemExit) as exc:
        main(["models", "show", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "broken.yaml" in err


def test_config_missing_field_exits_2(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A config.json missing a field exits with code 2 naming the field."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    with pytest.raises(SystemExit) as exc:
        main(["models", "show", str(path)])
    assert exc.value.code == 2
    assert "'hidden_size'" in capsys.readouterr().err
