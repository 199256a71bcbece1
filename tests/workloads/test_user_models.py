"""User models from YAML and Hugging Face config.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainsim.errors import DataFileError, UnknownNameError
from trainsim.workloads.zoo import get_model

# Keys as published in the Hugging Face hub's config.json of each model.
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 12, "n_embd": 768,
        "n_head": 12, "n_positions": 1024, "vocab_size": 50257, "n_inner": None}
PYTHIA_160M = {"model_type": "gpt_neox", "num_hidden_layers": 12, "hidden_size": 768,
               "num_attention_heads": 12, "intermediate_size": 3072,
               "max_position_embeddings": 2048, "vocab_size": 50304,
               "tie_word_embeddings": False}
LLAMA2_70B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
              "num_key_value_heads": 8, "intermediate_size": 28672,
              "max_position_embeddings": 4096, "vocab_size": 32000, "rms_norm_eps": 1e-05,
              "hidden_act": "silu", "tie_word_embeddings": False}
T5_11B = {"model_type": "t5", "architectures": ["T5WithLMHeadModel"], "d_model": 1024,
          "d_ff": 65536, "d_kv": 128, "num_heads": 128, "num_layers": 24, "vocab_size": 32128,
          "n_positions": 512, "relative_attention_num_buckets": 32}
BERT_LARGE = {"model_type": "bert", "num_hidden_layers": 24, "hidden_size": 1024,
              "num_attention_heads": 16, "intermediate_size": 4096,
              "max_position_embeddings": 512, "vocab_size": 30522, "type_vocab_size": 2}


def write_json(tmp_path: Path, data: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_gpt2_small(tmp_path: Path) -> None:
    """GPT-2 small's config.json gives 124,439,808 parameters (tied head, 1024 positions)."""
    spec = get_model(write_json(tmp_path, GPT2))
    assert spec.family == "gpt" and spec.ffn_hidden == 4 * 768
    assert spec.parameters() == 124_439_808


def test_gpt_neox_pythia_160m(tmp_path: Path) -> None:
    """Pythia-160M (GPT-NeoX, untied embed_out, rotary) has 162,322,944 parameters."""
    spec = get_model(write_json(tmp_path, PYTHIA_160M))
    assert spec.position_embedding == "rotary" and not spec.tied_embeddings
    assert spec.parameters() == 162_322_944


def test_llama2_70b_config_matches_zoo(tmp_path: Path) -> None:
    """LLaMA-2-70B's config.json builds the same parameter count as the zoo entry."""
    spec = get_model(write_json(tmp_path, LLAMA2_70B))
    assert spec.family == "llama" and spec.num_kv_heads == 8 and spec.norm == "rmsnorm"
    assert spec.activation == "swiglu"
    assert spec.parameters() == get_model("llama2-70b").parameters()


def test_t5_11b_config_gives_released_count(tmp_path: Path) -> None:
    """Raffel et al.'s T5-11B (RMS norm, no biases, ReLU, relative positions, tied embeddings,
    vocab 32128) has 11,307,321,344 parameters, as the released checkpoint."""
    spec = get_model(write_json(tmp_path, T5_11B))
    assert spec.family == "t5" and spec.decoder_layers == 24 and spec.head_dim == 128
    assert spec.parameters() == 11_307_321_344


def test_bert_config_matches_zoo(tmp_path: Path) -> None:
    """bert-large-uncased's config.json gives the zoo's BERT-large count."""
    assert get_model(write_json(tmp_path, BERT_LARGE)).parameters() == \
        get_model("bert-large").parameters()


def test_family_from_architectures(tmp_path: Path) -> None:
    """Without model_type the family comes from `architectures`."""
    data = {k: v for k, v in GPT2.items() if k != "model_type"}
    assert get_model(write_json(tmp_path, data)).family == "gpt"


def test_config_missing_field_names_file_and_field(tmp_path: Path) -> None:
    """A config.json without n_embd fails with the file and the field in the message."""
    path = write_json(tmp_path, {k: v for k, v in GPT2.items() if k != "n_embd"})
    with pytest.raises(DataFileError, match=r"config\.json.*'n_embd'"):
        get_model(path)


def test_unsupported_model_type(tmp_path: Path) -> None:
    """An unknown model_type is refused, listing the supported ones."""
    with pytest.raises(DataFileError, match="unsupported model_type 'mamba'"):
        get_model(write_json(tmp_path, {"model_type": "mamba"}))


def test_yaml_round_trip(tmp_path: Path) -> None:
    """A zoo entry written as YAML loads back to the same spec."""
    spec = get_model("llama2-13b")
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False))
    assert get_model(str(path)) == spec


def test_yaml_named_entry(tmp_path: Path) -> None:
    """A YAML file may hold `{name: {fields}}`; the name is kept (lower case)."""
    path = tmp_path / "tiny.yml"
    path.write_text("Tiny-GPT:\n  family: gpt\n  num_layers: 2\n  hidden: 64\n  num_heads: 4\n"
                    "  vocab_size: 100\n  seq_len: 32\n")
    spec = get_model(str(path))
    assert spec.name == "tiny-gpt" and spec.num_layers == 2 and spec.ffn_hidden == 256


def test_malformed_yaml_names_file(tmp_path: Path) -> None:
    """Broken YAML raises DataFileError naming the file."""
    path = tmp_path / "bad.yaml"
    path.write_text("family: gpt\n  num_layers: [1,\n")
    with pytest.raises(DataFileError, match="bad.yaml"):
        get_model(str(path))


@pytest.mark.parametrize(("extra", "field"), [
    ("numlayers: 3\n", "numlayers"), ("num_heads: '4'\n", "num_heads"),
    ("dropout: 1\n", "dropout"), ("norm: batchnorm\n", "norm"),
    ("num_layers: 100000000\n", r"num_layers=100000000 is over 100,000"),
])
def test_yaml_bad_field_is_named(tmp_path: Path, extra: str, field: str) -> None:
    """Unknown fields, wrong types and invalid values name the field."""
    path = tmp_path / "m.yaml"
    base = {"family": "gpt", "num_layers": 2, "hidden": 64, "num_heads": 4, "vocab_size": 100,
            "seq_len": 32}
    key = extra.split(":")[0]
    base.pop(key, None)
    path.write_text(yaml.safe_dump(base) + extra)
    with pytest.raises(DataFileError, match=field):
        get_model(str(path))


def test_yaml_missing_family(tmp_path: Path) -> None:
    """A YAML model without `family` is refused naming the field."""
    path = tmp_path / "m.yaml"
    path.write_text("num_layers: 2\nhidden: 64\n")
    with pytest.raises(DataFileError, match="'family'"):
        get_model(str(path))


def test_names_are_case_insensitive_with_aliases() -> None:
    """Zoo names ignore case; aliases (gpt3-2.6b → gpt3-2.7b) resolve."""
    assert get_model("GPT3-1.3B") == get_model("gpt3-1.3b")
    assert get_model("gpt3-2.6b") == get_model("gpt3-2.7b")


def test_unknown_name_lists_close_names() -> None:
    """An unknown name raises UnknownNameError suggesting the closest zoo names."""
    with pytest.raises(UnknownNameError, match="did you mean.*llama2-7b"):
        get_model("llama2-7")


def test_missing_file(tmp_path: Path) -> None:
    """A .yaml path that does not exist is a DataFileError, not a traceback."""
    with pytest.raises(DataFileError, match="no such model file"):
        get_model(str(tmp_path / "nope.yaml"))


def test_a_model_file_with_one_field_names_what_is_missing(tmp_path: Path) -> None:
    """`name: x` alone is a model's fields (not a model called 'name'): the missing family is
    named, and a wrongly typed field says "an integer", not "a int"."""
    path = tmp_path / "m.yaml"
    path.write_text("name: x\n")
    with pytest.raises(DataFileError, match=r"misses field 'family'"):
        get_model(str(path))
    path.write_text("family: gpt\nnum_layers: two\nhidden: 64\nnum_heads: 4\nvocab_size: 100\n"
                    "seq_len: 32\n")
    with pytest.raises(DataFileError, match=r"'num_layers'='two' must be an integer"):
        get_model(str(path))


def test_a_binary_model_file_names_itself(tmp_path: Path) -> None:
    """A file that is not UTF-8 text is named (a bare UnicodeDecodeError named nothing)."""
    path = tmp_path / "m.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(DataFileError, match=r"m\.yaml: not UTF-8 text"):
        get_model(str(path))
