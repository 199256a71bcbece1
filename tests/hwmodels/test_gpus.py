"""GPU catalog: peaks reproduce datasheets, clock ladders, lookups."""

from __future__ import annotations

import pytest

from trainsim.errors import UnknownNameError
from trainsim.hwmodels.gpus import get_gpu, list_gpus

EXPECTED = [
    "V100-SXM2-16GB", "V100-SXM2-32GB", "V100-PCIe-32GB", "A100-SXM4-40GB", "A100-SXM4-80GB",
    "A100-PCIe-40GB", "A100-PCIe-80GB", "A10", "A40", "H100-SXM5-80GB",
]  # fmt: skip


def test_catalog_holds_the_ten_gpu_types() -> None:
    """Every GPU type of the brief is in the catalog."""
    assert set(EXPECTED) <= set(list_gpus())


@pytest.mark.parametrize("name", EXPECTED)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "tf32", "fp32"])
def test_peak_at_datasheet_clock_equals_datasheet(name: str, dtype: str) -> None:
    """SMs × FLOP/clk/SM × clock reproduces the vendor's dense peak within 1% (datasheets round:
    V100 PCIe's 80 × 1024 × 1.38 GHz = 113.0 is printed as 112)."""
    gpu = get_gpu(name)
    if dtype not in gpu.dtypes:
        assert name.startswith("V100") and dtype in ("bf16", "tf32")  # Volta has neither
        with pytest.raises(UnknownNameError, match=dtype):
            gpu.peak_flops(dtype)
        return
    peak = gpu.peak_flops(dtype, gpu.datasheet_clock_mhz[dtype])
    assert peak == pytest.approx(gpu.datasheet_flops(dtype), rel=0.01)


def test_peak_defaults_to_boost_clock_and_hand_checked_figures() -> None:
    """Hand arithmetic: A100 108×2048×1.41 GHz, V100 80×1024×1.53 GHz, H100 132×4096×1.83 GHz."""
    assert get_gpu("A100-SXM4-40GB").peak_flops() == pytest.approx(108 * 2048 * 1.41e9)
    assert get_gpu("V100-SXM2-16GB").peak_flops("fp16") == pytest.approx(80 * 1024 * 1.53e9)
    assert get_gpu("H100-SXM5-80GB").peak_flops("bf16") == pytest.approx(989.4e12, rel=1e-4)
    assert get_gpu("A100-SXM4-40GB").peak_flops("fp16", 705) == pytest.approx(156e12, rel=1e-3)


@pytest.mark.parametrize(
    ("name", "lo", "hi", "count"),
    [
        ("A100-SXM4-40GB", 210, 1410, 81),
        ("A40", 210, 1740, 103),
        ("V100-SXM2-32GB", 135, 1530, 187),
    ],
)
def test_clock_ladders(name: str, lo: int, hi: int, count: int) -> None:
    """A100 210-1410 step 15 (81 clocks), A40 210-1740 step 15, V100 135-1530 step 7.5."""
    freqs = get_gpu(name).frequencies_mhz()
    assert freqs[0] == lo and freqs[-1] == hi and len(freqs) == count
    assert freqs == sorted(set(freqs))


def test_perseus_sweep_clocks_are_supported() -> None:
    """Every clock of the Perseus A100 sweep (855-1410 step 15) is a supported A100 clock."""
    freqs = set(get_gpu("A100-SXM4-40GB").frequencies_mhz())
    assert set(range(855, 1411, 15)) <= freqs


def test_units_converted_to_si() -> None:
    """memory_gib and *_gbps become bytes and bytes/s; Perseus idle power kept as measured."""
    a100 = get_gpu("A100-SXM4-80GB")
    assert a100.memory_bytes == 80 * 2**30
    assert a100.memory_bandwidth_bytes_per_s == pytest.approx(2039e9)
    assert a100.nvlink_bandwidth_bytes_per_s == pytest.approx(600e9)
    assert a100.idle_power_w == pytest.approx(83.64)
    assert get_gpu("A40").idle_power_w == pytest.approx(70.38)
    assert get_gpu("A10").nvlink_bandwidth_bytes_per_s is None


def test_lookup_is_case_insensitive_and_unknown_lists_close_names() -> None:
    """'a100-sxm4-40gb' resolves; 'A100' raises naming A100 variants."""
    assert get_gpu("a100-sxm4-40gb").name == "A100-SXM4-40GB"
    with pytest.raises(UnknownNameError) as info:
        get_gpu("A100")
    hint = str(info.value).split("(valid:")[0]
    assert "'A100'" in hint and "A100-SXM4-40GB" in hint and "A100-PCIe-80GB" in hint


def test_every_figure_has_a_source() -> None:
    """Each GPU names a source for each numeric data field."""
    for name in list_gpus():
        gpu = get_gpu(name)
        for key in ("sm_count", "flops_per_clock_per_sm", "memory_bandwidth_gbps", "tdp_w",
                    "idle_power_w", "sm_clock_max_mhz", "sm_clock_min_mhz"):  # fmt: skip
            assert gpu.sources.get(key), f"{name}: no source for {key}"
        for dtype in gpu.dtypes:
            assert gpu.sources.get(f"datasheet_{dtype}_tflops"), f"{name}: no source for {dtype}"
