"""SM sharing data (hwmodels/comm_sm.py): every catalog GPU has a sourced CTA count; φ follows."""

from __future__ import annotations

import dataclasses

import pytest

from trainsim.hwmodels.comm_sm import collective_ctas, comm_sm_fraction
from trainsim.hwmodels.datafiles import load_json
from trainsim.hwmodels.gpus import get_gpu, list_gpus


def test_every_catalog_gpu_has_a_sourced_cta_count() -> None:
    """comm_sm.json covers gpus.json exactly, each entry with a non-empty source."""
    records = load_json("comm_sm.json")["gpus"]
    assert set(records) == set(list_gpus())
    assert all(r["source"].strip() for r in records.values())


@pytest.mark.parametrize("name", list_gpus())
def test_phi_is_ctas_over_sms_and_within_nccls_channel_ceiling(name: str) -> None:
    """φ = CTAs / SMs, with CTAs between NCCL's 2-channel minimum and its 32-channel ceiling."""
    gpu = get_gpu(name)
    ctas = collective_ctas()[name]
    assert 2 <= ctas <= 32
    assert comm_sm_fraction(gpu) == ctas / gpu.sm_count
    assert 0 < comm_sm_fraction(gpu) < 1


def test_nvswitch_nodes_use_more_sms_than_pcie_ones() -> None:
    """A100 SXM (24 CTAs of 108 SMs) loses a larger share than A100 PCIe (2 of 108)."""
    assert comm_sm_fraction(get_gpu("A100-SXM4-40GB")) == pytest.approx(24 / 108)
    assert comm_sm_fraction(get_gpu("H100-SXM5-80GB")) == pytest.approx(24 / 132)
    assert comm_sm_fraction(get_gpu("A100-PCIe-40GB")) < comm_sm_fraction(
        get_gpu("A100-SXM4-40GB"))


def test_cpu_ranks_and_unknown_gpus_do_not_share() -> None:
    """gloo CPU ranks (validate/contention.py models their sharing) and unlisted types: φ = 0."""
    a100 = get_gpu("A100-SXM4-40GB")
    assert comm_sm_fraction(dataclasses.replace(a100, form_factor="cpu")) == 0.0
    assert comm_sm_fraction(dataclasses.replace(a100, name="my-custom-gpu")) == 0.0
