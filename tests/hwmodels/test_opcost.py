"""Roofline op cost: compute/memory bounds, efficiency, DVFS and power."""

from __future__ import annotations

import pytest

from trainsim.errors import UnknownNameError
from trainsim.hwmodels.clock_scaling import ClockScaling, clock_scaling
from trainsim.hwmodels.gpus import get_gpu, list_gpus
from trainsim.hwmodels.opcost import OpCostModel, OpEstimate, RooflineCostModel

MODEL = RooflineCostModel()


def test_implements_protocol() -> None:
    """RooflineCostModel satisfies the OpCostModel protocol and returns OpEstimate."""
    model: OpCostModel = MODEL
    assert isinstance(model.estimate("matmul", 1e9, 1e6, get_gpu("A10")), OpEstimate)


@pytest.mark.parametrize("name", list_gpus())
def test_big_gemm_is_compute_bound_at_curve_plateau(name: str) -> None:
    """An 8192³ GEMM (2·8192³ FLOPs, 3 fp16 matrices) is compute-bound and takes
    FLOPs / (peak × eff) + launch overhead."""
    gpu = get_gpu(name)
    n = 8192
    flops, bytes_moved = 2.0 * n**3, 3 * 2.0 * n * n
    est = MODEL.estimate("matmul", flops, bytes_moved, gpu)
    eff = MODEL.compute_efficiency("matmul", flops, gpu)
    assert est.compute_bound and 0.6 <= eff <= 0.86  # plateaus: measured MAMF, <= 85.9 %
    assert est.compute_s == pytest.approx(flops / (gpu.peak_flops("fp16") * eff))
    assert est.time_s == pytest.approx(est.compute_s + MODEL.launch_overhead_s(gpu))


def test_v100_gemm_close_to_aceso_measurement() -> None:
    """GPT-1.3B QKV GEMM (b=1, s=2048, h=2048: 2·s·h·3h FLOPs) was measured at 708.9 µs on V100
    (Aceso profile); the model is within 15%."""
    flops = 2 * 2048 * 2048 * 3 * 2048
    est = MODEL.estimate("matmul", flops, 2 * (2048 * 2048 + 3 * 2048 * 2048 + 3 * 2048 * 2048),
                         get_gpu("V100-SXM2-32GB"))  # fmt: skip
    assert est.time_s == pytest.approx(708.9e-6, rel=0.15)


def test_elementwise_is_memory_bound() -> None:
    """GeLU over 16 M fp16 values: memory-bound; memory_s = bytes / (bandwidth × eff_mem)."""
    gpu = get_gpu("A100-SXM4-40GB")
    n = 16 * 2**20
    est = MODEL.estimate("gelu", 8.0 * n, 4.0 * n, gpu)
    assert not est.compute_bound
    eff = MODEL.memory_efficiency(4.0 * n, gpu)
    assert est.memory_s == pytest.approx(4.0 * n / (gpu.memory_bandwidth_bytes_per_s * eff))
    assert 0.8 <= eff <= 0.95


def test_halving_frequency_doubles_compute_not_memory() -> None:
    """DVFS on a GPU with the default coefficients (plain f_max/f rule, no knee): at half the
    max clock the compute part doubles, the memory part is unchanged."""
    gpu = get_gpu("V100-SXM2-32GB")
    full = MODEL.estimate("matmul", 1e12, 1e9, gpu)
    half = MODEL.estimate("matmul", 1e12, 1e9, gpu, freq_mhz=gpu.sm_clock_max_mhz / 2)
    assert half.compute_s == pytest.approx(2 * full.compute_s)
    assert half.memory_s == pytest.approx(full.memory_s)
    mem_full = MODEL.estimate("dropout", 1e6, 1e9, gpu)
    mem_half = MODEL.estimate("dropout", 1e6, 1e9, gpu, freq_mhz=765)
    assert mem_half.time_s == pytest.approx(mem_full.time_s)  # still memory-bound


def test_clock_scaling_knee_and_memory_share() -> None:
    """A100 (fitted knee near 1350 MHz): clocks above the sustained one buy little, clocks well
    below it scale like 1/f. A40 (fitted c < 1): a GEMM slows by only c·s(f) + 1 − c."""
    a100 = get_gpu("A100-SXM4-40GB")
    full = MODEL.estimate("matmul", 1e12, 1e8, a100)
    near_top = MODEL.estimate("matmul", 1e12, 1e8, a100, freq_mhz=1380)
    low = MODEL.estimate("matmul", 1e12, 1e8, a100, freq_mhz=705)
    assert near_top.compute_s / full.compute_s < 1.01  # 2.1 % lower clock, < 1 % slower
    knee = clock_scaling("A100-SXM4-40GB").sustained_clock_mhz
    assert knee is not None and 1300 < knee < 1400
    assert low.compute_s / full.compute_s == pytest.approx(knee / 705, rel=0.01)
    a40 = get_gpu("A40")
    c = clock_scaling("A40").gemm_clock_bound_fraction
    assert c < 0.6
    f0 = MODEL.estimate("matmul", 1e12, 1e8, a40)
    f1 = MODEL.estimate("matmul", 1e12, 1e8, a40, freq_mhz=870)
    s = clock_scaling("A40").slowdown(870, a40.sm_clock_max_mhz)
    assert f1.compute_s / f0.compute_s == pytest.approx(c * s + 1 - c)


def test_top_clock_does_not_depend_on_clock_coefficients() -> None:
    """Every factor is exactly 1 at f_max: predictions at the top clock are the same whatever
    the DVFS coefficients (so non-DVFS runs keep their calibration)."""
    gpu = get_gpu("A40")
    other = RooflineCostModel({"A40": ClockScaling(gemm_clock_bound_fraction=0.1,
                                                   sustained_clock_mhz=900.0)})
    assert other.estimate("matmul", 1e12, 1e8, gpu).time_s == \
        MODEL.estimate("matmul", 1e12, 1e8, gpu).time_s


@pytest.mark.parametrize("name", list_gpus())
def test_big_gemm_power_near_tdp(name: str) -> None:
    """A long compute-bound GEMM at the max clock draws ≈ TDP (overhead at idle is negligible):
    on GA102 (A10, A40), where most of its time waits on memory, the board limit still binds."""
    gpu = get_gpu(name)
    est = MODEL.estimate("matmul", 2.0 * 8192**3, 6.0 * 8192**2, gpu)
    assert est.power_w == pytest.approx(gpu.tdp_w, rel=0.01)
    assert est.energy_j == pytest.approx(est.power_w * est.time_s)


def test_lower_clock_saves_energy_on_compute_bound_op() -> None:
    """On A100 a compute-bound op at 1005 MHz takes longer but uses less energy (Perseus' premise)."""
    gpu = get_gpu("A100-SXM4-40GB")
    fast = MODEL.estimate("matmul", 1e12, 1e8, gpu)
    slow = MODEL.estimate("matmul", 1e12, 1e8, gpu, freq_mhz=1005)
    assert slow.time_s > fast.time_s and slow.energy_j < fast.energy_j


def test_small_gemm_less_efficient_than_large() -> None:
    """GEMM efficiency rises with size: a 1 GFLOP GEMM is less efficient than a 1 TFLOP one."""
    gpu = get_gpu("V100-SXM2-16GB")
    small = MODEL.compute_efficiency("matmul", 1e9, gpu)
    large = MODEL.compute_efficiency("matmul", 1e12, gpu)
    assert small < 0.45
    assert large > 0.6


def test_zero_work_costs_launch_overhead() -> None:
    """An op with no FLOPs or bytes costs only its launch overhead, at idle power."""
    gpu = get_gpu("A40")
    est = MODEL.estimate("elementwise", 0.0, 0.0, gpu)
    assert est.time_s == pytest.approx(MODEL.launch_overhead_s(gpu))
    assert est.power_w == pytest.approx(gpu.idle_power_w)


def test_unknown_kind_and_dtype() -> None:
    """Unknown op kinds list valid ones; bf16 on V100 is refused."""
    with pytest.raises(UnknownNameError, match="matmul"):
        MODEL.estimate("matmull", 1e9, 1e6, get_gpu("A10"))
    with pytest.raises(UnknownNameError, match="bf16"):
        MODEL.estimate("matmul", 1e9, 1e6, get_gpu("V100-SXM2-16GB"), dtype="bf16")


def test_every_contract_op_kind_is_classified() -> None:
    """Every op kind of the workloads contract has an efficiency class."""
    kinds = ["matmul", "attention_score", "attention_context", "softmax", "layernorm", "rmsnorm",
             "gelu", "swiglu", "dropout", "elementwise", "embedding", "cross_entropy", "conv2d",
             "batchnorm", "pool", "router"]  # fmt: skip
    for kind in kinds:
        assert MODEL.op_class(kind) in ("gemm", "batched_gemm", "elementwise")
