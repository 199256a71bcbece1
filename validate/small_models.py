"""Small models for CPU validation runs, from `data/small_models.yaml`.

Each entry is a zoo model scaled down (its `base` names the zoo entry whose family and layer
layout it keeps). `get_validation_model(name)` looks here first and then in the zoo, so a trace
may name either; a name in neither raises the usual unknown-name error listing close names.
"""

from __future__ import annotations

import functools
from importlib import resources

import yaml

from trainsim.errors import DataFileError, UnknownNameError, unknown_name
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.user_models import spec_from_mapping
from trainsim.workloads.zoo import get_model, list_models

_FILE = "data/small_models.yaml"


@functools.cache
def _small_models() -> dict[str, ModelSpec]:
    text = resources.files("trainsim.validate").joinpath(_FILE).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise DataFileError(f"validate/{_FILE}: must map model names to their fields")

    out: dict[str, ModelSpec] = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or "base" not in entry:
            raise DataFileError(f"validate/{_FILE}: model {name!r} needs a 'base' zoo model")
        if str(entry["base"]).lower() not in list_models():
            raise DataFileError(f"validate/{_FILE}: model {name!r}: base={entry['base']!r} "
                                f"is not a zoo model")
        fields = {k: v for k, v in entry.items() if k != "base"}
        out[str(name).lower()] = spec_from_mapping(fields, origin=f"validate/{_FILE}",
                                                   name=str(name).lower())
    return out


def list_validation_models() -> list[str]:
    """Names of the small validation models, in file order."""
    return list(_small_models())


def get_validation_model(name: str) -> ModelSpec:
    """A small validation model by name, else a zoo model (or model file).

    Raises:
        UnknownNameError: neither a validation model nor a zoo model; lists close names.
    """
    key = name.strip().lower()
    small = _small_models()
    if key in small:
        return small[key]

    try:
        return get_model(name)
    except UnknownNameError:
        raise unknown_name("model", name, [*small, *list_models()]) from None
