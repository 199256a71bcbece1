"""The model zoo: named models from `data/models.yaml`, and user model files.

`get_model("gpt3-1.3b")` (case-insensitive; aliases such as "gpt3-2.6b" work) returns the
`ModelSpec`; a path ending in .yaml/.yml/.json loads a user model instead. Named setups are also
plain functions (`gpt3_1_3b()`, `llama2_7b()`, ...) for code that wants one by import.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import yaml

from trainsim.errors import DataFileError, unknown_name
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.user_models import load_user_model, spec_from_mapping

ZOO_FILE = "data/models.yaml"
USER_MODEL_SUFFIXES = (".yaml", ".yml", ".json")


@functools.cache
def _zoo() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    """All zoo entries by name, and aliases → names."""
    text = resources.files("trainsim.workloads").joinpath(ZOO_FILE).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise DataFileError(f"{ZOO_FILE}: must map model names to their fields")
    models: dict[str, ModelSpec] = {}
    aliases: dict[str, str] = {}
    for raw_name, entry in data.items():
        name = str(raw_name).lower()
        models[name] = spec_from_mapping(entry, origin=ZOO_FILE, name=name)
        for alias in entry.get("aliases", ()):
            aliases[str(alias).lower()] = name
    return models, aliases


def list_models() -> list[str]:
    """Names of the zoo's models, in the order of models.yaml (families grouped)."""
    return list(_zoo()[0])


def get_model(name_or_path: str) -> ModelSpec:
    """A zoo model by name (case-insensitive) or a user model from a .yaml/.yml/.json path.

    Raises:
        UnknownNameError: The name is neither a zoo model nor an alias (lists close names).
        DataFileError: The file is malformed or misses a field.
    """
    key = name_or_path.strip()
    if key.lower().endswith(USER_MODEL_SUFFIXES) or Path(key).is_file():
        return load_user_model(key)
    models, aliases = _zoo()
    lowered = key.lower()
    lowered = aliases.get(lowered, lowered)
    if lowered in models:
        return models[lowered]
    raise unknown_name("model", name_or_path, list_models())


def gpt3_1_3b() -> ModelSpec:
    """GPT-3 XL, 1.3 B parameters (Brown et al. 2020)."""
    return get_model("gpt3-1.3b")


def gpt3_175b() -> ModelSpec:
    """GPT-3, 175 B parameters (Brown et al. 2020)."""
    return get_model("gpt3-175b")


def llama2_7b() -> ModelSpec:
    """LLaMA-2 7B (Touvron et al. 2023)."""
    return get_model("llama2-7b")


def llama2_70b() -> ModelSpec:
    """LLaMA-2 70B with grouped-query attention (Touvron et al. 2023)."""
    return get_model("llama2-70b")


def t5_11b() -> ModelSpec:
    """T5-11B as Aceso trains it (Raffel et al. 2020 shapes, Megatron-LM T5)."""
    return get_model("t5-11b")


def bert_large() -> ModelSpec:
    """BERT-Large with its pre-training heads (Devlin et al. 2019)."""
    return get_model("bert-large")


def wresnet_1b() -> ModelSpec:
    """Aceso's 1 B-parameter Wide-ResNet."""
    return get_model("wresnet-1b")
