"""SM sharing: the share of a GPU's SMs a running NCCL collective kernel holds.

An NCCL collective runs one CTA per channel, each holding an SM for the kernel's whole run, so a
GEMM running beside it has only the other SMs (issue 13, item 4). Per GPU type,
data/comm_sm.json gives the CTAs a collective occupies (with sources); φ = CTAs / SMs is the
fraction the lowering passes to the engines (`Program.comm_sm_fraction`). CPU "GPUs" (gloo
ranks; validate/contention.py models their sharing) and GPU types the file does not list get
φ = 0. Layering: hwmodels imports only errors and datafiles.
"""

from __future__ import annotations

from functools import cache

from trainsim.errors import DataFileError
from trainsim.hwmodels.datafiles import check_keys, load_json, number
from trainsim.hwmodels.gpus import GpuSpec

FILE = "comm_sm.json"


@cache
def collective_ctas() -> dict[str, int]:
    """CTAs a running NCCL collective occupies, per GPU name (checked once)."""
    data = load_json(FILE)
    check_keys(FILE, data, ("_about", "gpus"))
    out: dict[str, int] = {}
    for name, record in data["gpus"].items():
        where = f"{FILE}: gpus.{name}"
        check_keys(where, record, ("collective_ctas", "source"))
        ctas = number(where, "collective_ctas", record["collective_ctas"])
        if ctas != int(ctas):
            raise DataFileError(f"{where}: collective_ctas={ctas} must be a whole number")
        out[name] = int(ctas)
    return out


def comm_sm_fraction(gpu: GpuSpec) -> float:
    """φ of `gpu`: its collective CTAs over its SMs (0 for CPUs and unlisted GPU types)."""
    if gpu.form_factor == "cpu":
        return 0.0
    ctas = collective_ctas().get(gpu.name)
    if ctas is None:
        return 0.0
    return ctas / gpu.sm_count


__all__ = ["collective_ctas", "comm_sm_fraction"]
