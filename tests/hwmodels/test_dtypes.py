"""Precisions as inputs: fp8 / tf32 / fp32 peaks and the GPUs that refuse them (issue 13)."""

from __future__ import annotations

from typing import Any

import pytest

from trainsim import api
from trainsim.errors import PlanError, UnknownNameError
from trainsim.hwmodels.gpus import get_gpu
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.workloads.plan import ParallelPlan

MODEL = RooflineCostModel()


def test_h100_fp8_peak_is_the_whitepaper_figure() -> None:
    """H100 SXM5: 132 SMs × 8192 FLOP/clk × 1.83 GHz = 1978.9 dense FP8 TFLOPS, 2× BF16."""
    h100 = get_gpu("H100-SXM5-80GB")
    assert "fp8" in h100.dtypes
    assert h100.peak_flops("fp8") == pytest.approx(1978.9e12, rel=1e-4)
    assert h100.peak_flops("fp8") == pytest.approx(2 * h100.peak_flops("bf16"))
    assert h100.peak_flops("fp8") == pytest.approx(h100.datasheet_flops("fp8"), rel=0.01)


def test_fp8_gemm_is_faster_than_bf16_on_h100() -> None:
    """A large GEMM runs faster at the FP8 tensor peak (almost 2x when compute-bound)."""
    h100 = get_gpu("H100-SXM5-80GB")
    m = n = k = 8192
    flops, nbytes = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
    bf16 = MODEL.estimate("matmul", flops, nbytes, h100, dtype="bf16").time_s
    fp8 = MODEL.estimate("matmul", flops, nbytes, h100, dtype="fp8").time_s
    assert fp8 < 0.6 * bf16


@pytest.mark.parametrize("name", ["A100-SXM4-80GB", "V100-SXM2-32GB", "A40"])
def test_gpus_without_fp8_refuse_it_in_one_line(name: str) -> None:
    gpu = get_gpu(name)
    assert "fp8" not in gpu.dtypes
    with pytest.raises(UnknownNameError, match=f"dtype='fp8' is not supported by {name}") as e:
        gpu.peak_flops("fp8")
    assert "\n" not in str(e.value)


def test_simulating_fp8_on_a100_is_refused_naming_the_dtype() -> None:
    with pytest.raises(UnknownNameError, match="dtype='fp8' is not supported by A100"):
        api.simulate("gpt3-125m", "1xA100-SXM4-80GB", dp=1, micro_batch_size=1,
                     global_batch=1, dtype="fp8")


def test_tf32_and_fp32_peaks() -> None:
    """tf32 is the tensor-core TF32 peak; fp32 the CUDA cores' (no tensor cores)."""
    a100 = get_gpu("A100-SXM4-80GB")
    assert a100.peak_flops("tf32") == pytest.approx(156e12, rel=0.01)
    assert a100.peak_flops("fp32") == pytest.approx(19.5e12, rel=0.01)
    h100 = get_gpu("H100-SXM5-80GB")
    assert h100.peak_flops("tf32") == pytest.approx(494.7e12, rel=1e-3)
    m = n = k = 8192
    flops, nbytes = 2.0 * m * n * k, 4.0 * (m * k + k * n + m * n)
    t = {d: MODEL.estimate("matmul", flops, nbytes, a100, dtype=d).time_s
         for d in ("bf16", "tf32", "fp32")}
    assert t["bf16"] < t["tf32"] < t["fp32"]
    assert t["fp32"] / t["tf32"] == pytest.approx(156 / 19.5, rel=0.05)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32", "tf32", "fp8"])
def test_plan_accepts_the_precisions(dtype: str) -> None:
    assert ParallelPlan(dtype=dtype).dtype == dtype


def test_plan_refuses_an_unknown_dtype() -> None:
    with pytest.raises(PlanError, match="plan.dtype='int4' must be fp16, bf16, fp32, tf32 or fp8"):
        ParallelPlan(dtype="int4")


def test_fp8_training_is_faster_than_bf16_with_the_same_memory() -> None:
    """FP8 linear layers (with their casts) speed an H100 step up; activations stay BF16."""
    kw: dict[str, Any] = {"dp": 8, "zero": 3, "micro_batch_size": 1, "global_batch": 8,
                          "seq_len": 2048}
    bf16 = api.simulate("llama2-7b", "1x8xH100-SXM5-80GB", dtype="bf16", **kw)
    fp8 = api.simulate("llama2-7b", "1x8xH100-SXM5-80GB", dtype="fp8", **kw)
    assert fp8.iteration_time_s < bf16.iteration_time_s
    assert fp8.iteration_time_s > 0.5 * bf16.iteration_time_s  # attention, casts stay BF16
    assert fp8.peak_memory_bytes == pytest.approx(bf16.peak_memory_bytes)


def test_h100_96gb_hbm2e_variant() -> None:
    """torchtitan's H100: 96 GB HBM2e at 2.4 TB/s, 500 W, Hopper curves, fp8 capable."""
    gpu = get_gpu("H100-HBM2e-96GB-500W")
    assert gpu.memory_bytes == 96 * 2**30
    assert gpu.memory_bandwidth_bytes_per_s == pytest.approx(2.4e12)
    assert gpu.tdp_w == 500
    assert "fp8" in gpu.dtypes
    assert "torchtitan" in gpu.sources["memory_gib"]
    assert MODEL.op_class("matmul") == "gemm"
    assert MODEL.launch_overhead_s(gpu) == MODEL.launch_overhead_s(get_gpu("H100-SXM5-80GB"))
