"""Models users bring: a YAML file in the zoo's schema or a Hugging Face `config.json`.

Loading is strict, as in Calculon: a YAML entry may use only `ModelSpec` field names (plus
`aliases` and `source`), and a `config.json` must carry every key its architecture needs.
Anything wrong raises `DataFileError` naming the file and the field.

Supported `config.json` architectures (detected from `model_type`, else `architectures`):

| model_type | keys read |
|---|---|
| gpt2 | n_layer, n_embd, n_head, n_positions, vocab_size, [n_inner] |
| gpt_neox | num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, max_position_embeddings, vocab_size |
| llama, mistral | as gpt_neox + [num_key_value_heads, head_dim, tie_word_embeddings], RMSNorm, SiLU gate |
| t5 | d_model, d_ff, d_kv, num_heads, num_layers, vocab_size, [num_decoder_layers, n_positions, feed_forward_proj, relative_attention_num_buckets] |
| bert | num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, max_position_embeddings, vocab_size, type_vocab_size |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from trainsim.errors import DataFileError, read_user_text
from trainsim.workloads.model import ModelSpec

EXTRA_KEYS = frozenset({"aliases", "source"})
_SPEC_FIELDS = {f.name: f for f in fields(ModelSpec) if f.name != "context_parallel"}
"""Fields a model file may set (context parallelism is a plan degree, not a model property)."""
T5_DEFAULT_POSITIONS = 512
"""T5 was pre-trained on 512-token inputs (Raffel et al. 2020 §3.1.2); configs rarely say."""
T5_DEFAULT_BUCKETS = 32
"""T5's relative-position buckets when config.json omits them (Raffel et al. 2020 §2.1)."""
HF_FAMILIES = {
    "gpt2": "gpt", "gpt_neox": "gpt", "llama": "llama", "mistral": "llama", "t5": "t5",
    "bert": "bert",
}
_ARCHITECTURE_HINTS = (
    ("GPTNeoX", "gpt_neox"), ("GPT2", "gpt2"), ("Llama", "llama"), ("Mistral", "mistral"),
    ("T5", "t5"), ("Bert", "bert"),
)


def spec_from_mapping(data: object, *, origin: str, name: str) -> ModelSpec:
    """Build a `ModelSpec` from one models.yaml-style entry, strictly.

    Args:
        data: The entry (a mapping of ModelSpec field names to values).
        origin: The file it came from, for error messages.
        name: The model's name when the entry does not give one.
    """
    if not isinstance(data, Mapping):
        raise DataFileError(f"{origin}: model {name!r} must be a mapping of fields, "
                            f"got {type(data).__name__}")
    unknown = sorted(set(data) - set(_SPEC_FIELDS) - EXTRA_KEYS)
    if unknown:
        raise DataFileError(f"{origin}: model {name!r} has unknown field {unknown[0]!r} "
                            f"(valid: {', '.join(sorted(_SPEC_FIELDS))})")
    if "family" not in data:
        raise DataFileError(f"{origin}: model {name!r} misses field 'family'")
    kwargs: dict[str, Any] = {"name": str(data.get("name", name)).lower()}
    for key, value in data.items():
        if key in EXTRA_KEYS or key == "name":
            continue
        kwargs[key] = _coerce(origin, name, key, value)
    if "source" in data:
        kwargs["source"] = str(data["source"])
    try:
        return ModelSpec(**kwargs)
    except (TypeError, ValueError) as exc:
        raise DataFileError(f"{origin}: {exc}") from None


def _coerce(origin: str, name: str, key: str, value: object) -> object:
    """Check a YAML value against the field's type (bool is not an int here)."""
    annotation = str(_SPEC_FIELDS[key].type)  # e.g. "int", "int | None", "tuple[int, ...]"
    kind = "tuple" if annotation.startswith("tuple") else annotation.split(" ")[0]
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "tuple": isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                                 for v in value),
    }[kind]
    if not ok:
        want = {"tuple": "a list of integers", "int": "an integer", "float": "a number",
                "bool": "true or false", "str": "a string"}[kind]
        raise DataFileError(f"{origin}: model {name!r} field {key!r}={value!r} must be {want}")
    if kind == "tuple":
        return tuple(value)  # type: ignore[arg-type]
    if kind == "float":
        return float(value)  # type: ignore[arg-type]
    return value


def load_yaml_model(path: str | Path) -> ModelSpec:
    """Load a user model from YAML: one entry's fields, or `{name: {fields}}`."""
    path = Path(path)
    try:
        data = yaml.safe_load(read_user_text(path))
    except yaml.YAMLError as exc:
        raise DataFileError(f"{path}: not valid YAML ({exc.__class__.__name__}: "
                            f"{str(exc).splitlines()[0]})") from None
    if isinstance(data, Mapping) and "family" not in data and len(data) == 1:
        (name, entry), = data.items()
        if not isinstance(entry, Mapping) and str(name) in _SPEC_FIELDS:
            # `name: x` alone: a model's fields, not `{name: {fields}}`; say what is missing
            return spec_from_mapping(data, origin=str(path), name=path.stem)
        return spec_from_mapping(entry, origin=str(path), name=str(name))
    return spec_from_mapping(data, origin=str(path), name=path.stem)


def load_hf_config(path: str | Path) -> ModelSpec:
    """Load a Hugging Face `config.json` (see the module docstring for the keys read)."""
    path = Path(path)
    try:
        cfg = json.loads(read_user_text(path))
    except json.JSONDecodeError as exc:
        raise DataFileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(cfg, dict):
        raise DataFileError(f"{path}: a config.json must be a JSON object")
    model_type = _model_type(path, cfg)
    name = str(cfg.get("_name_or_path") or path.parent.name or path.stem).lower()
    name = name.rstrip("/").split("/")[-1] or path.stem

    def need(key: str) -> Any:
        if key not in cfg or cfg[key] is None:
            raise DataFileError(f"{path}: missing field {key!r} (model_type {model_type!r})")
        value = cfg[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise DataFileError(f"{path}: field {key!r}={value!r} must be an integer")
        return value

    source = f"Hugging Face config.json ({path.name}, model_type {model_type})"
    kwargs: dict[str, Any]
    if model_type == "gpt2":
        hidden = need("n_embd")
        kwargs = {
            "family": "gpt", "num_layers": need("n_layer"), "hidden": hidden,
            "num_heads": need("n_head"), "vocab_size": need("vocab_size"),
            "seq_len": need("n_positions"), "ffn_hidden": cfg.get("n_inner") or 4 * hidden,
        }
    elif model_type in ("gpt_neox", "llama", "mistral"):
        kwargs = {
            "family": HF_FAMILIES[model_type], "num_layers": need("num_hidden_layers"),
            "hidden": need("hidden_size"), "num_heads": need("num_attention_heads"),
            "ffn_hidden": need("intermediate_size"), "vocab_size": need("vocab_size"),
            "seq_len": need("max_position_embeddings"), "position_embedding": "rotary",
            "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        }
        if model_type != "gpt_neox":
            gated = "swiglu" if cfg.get("hidden_act", "silu") == "silu" else "geglu"
            kwargs.update({
                "num_kv_heads": cfg.get("num_key_value_heads") or kwargs["num_heads"],
                "norm": "rmsnorm", "bias": bool(cfg.get("attention_bias", False)),
                "dropout": False, "activation": gated,
            })
            if cfg.get("head_dim"):
                kwargs["head_dim"] = cfg["head_dim"]
    elif model_type == "t5":
        proj = str(cfg.get("feed_forward_proj", "relu"))
        seq = cfg.get("n_positions") or T5_DEFAULT_POSITIONS
        kwargs = {
            "family": "t5", "num_layers": need("num_layers"), "hidden": need("d_model"),
            "num_heads": need("num_heads"), "head_dim": need("d_kv"), "ffn_hidden": need("d_ff"),
            "vocab_size": need("vocab_size"),
            "decoder_layers": cfg.get("num_decoder_layers") or cfg["num_layers"],
            "seq_len": seq, "decoder_seq_len": seq, "norm": "rmsnorm", "bias": False,
            "position_embedding": "relative",
            "relative_attention_num_buckets": (cfg.get("relative_attention_num_buckets")
                                               or T5_DEFAULT_BUCKETS),
            "activation": "geglu" if proj.startswith("gated") else "relu",
            "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        }
    else:  # bert
        kwargs = {
            "family": "bert", "num_layers": need("num_hidden_layers"),
            "hidden": need("hidden_size"), "num_heads": need("num_attention_heads"),
            "ffn_hidden": need("intermediate_size"), "vocab_size": need("vocab_size"),
            "seq_len": need("max_position_embeddings"),
            "type_vocab_size": need("type_vocab_size"), "pooler": True,
        }
    try:
        return ModelSpec(name=name, source=source, **kwargs)
    except (TypeError, ValueError) as exc:
        raise DataFileError(f"{path}: {exc}") from None


def _model_type(path: Path, cfg: dict[str, Any]) -> str:
    model_type = cfg.get("model_type")
    if model_type in HF_FAMILIES:
        return str(model_type)
    for arch in cfg.get("architectures") or ():
        for hint, mapped in _ARCHITECTURE_HINTS:
            if hint in str(arch):
                return mapped
    if model_type is None and not cfg.get("architectures"):
        raise DataFileError(f"{path}: missing field 'model_type' (or 'architectures')")
    raise DataFileError(f"{path}: unsupported model_type {model_type!r} "
                        f"(supported: {', '.join(sorted(HF_FAMILIES))})")


def load_user_model(path: str | Path) -> ModelSpec:
    """Load a user model file by extension: .yaml/.yml or .json (a Hugging Face config)."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such model file")
    if path.suffix.lower() == ".json":
        return load_hf_config(path)
    return load_yaml_model(path)
