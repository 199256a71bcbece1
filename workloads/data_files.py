"""The workloads package's data files (workloads/data/*.yaml), read the one way."""

from __future__ import annotations

from importlib import resources

import yaml

from trainsim.errors import DataFileError


def read_data_yaml(file: str) -> object:
    """The parsed YAML of packaged file `file` ("data/x.yaml"); one line naming the file when
    it is not valid YAML."""
    text = resources.files("trainsim.workloads").joinpath(file).read_text()
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DataFileError(f"workloads/{file}: not valid YAML "
                            f"({str(exc).splitlines()[0]})") from None


__all__ = ["read_data_yaml"]
