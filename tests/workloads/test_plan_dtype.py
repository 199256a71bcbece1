"""A plan's precision sizes the activations and the messages, not only the arithmetic.

The ops size saved activations, tensor-parallel collectives and pipeline sends by the model's
`dtype_bytes`, and `plan.dtype` never reached them: an fp32 plan of an fp16 model file ran at
fp32 speed with fp16 activations, and an fp16 plan of an fp32 model file (Wide-ResNet, the
validation models) kept 4-byte activations (found by the bug hunt, /tmp/s33/hunt2/repro_dtype.py:
plan fp32 on an fp16 llama gave 168.4 MB of activations, the fp16 plan the same)."""

from __future__ import annotations

import dataclasses

import pytest

from trainsim import api
from trainsim.workloads.model import trained_in

CLUSTER = "1x8xA100-SXM4-80GB"
PLAN = {"dp": 2, "tp": 2, "pp": 2, "global_batch": 4, "micro_batch_size": 1, "seq_len": 512,
        "unfold": True}


def _model(dtype: str):
    return dataclasses.replace(api.load_model("llama2-7b"), num_layers=2, dtype=dtype)


def _figures(model, dtype: str) -> dict[str, float]:
    r = api.simulate(model, CLUSTER, dtype=dtype, **PLAN)
    rank0 = r.tasks[r.tasks["rank"] == 0]
    by_stream = rank0.groupby("stream").comm_bytes.sum()
    return {"time": r.iteration_time_s, "peak": r.peak_memory_bytes,
            "tp": float(by_stream.get("tp", 0.0)),
            "send": float(by_stream.filter(like=">").sum())}  # streams "pp0>1", ...


def test_the_plans_dtype_wins_over_the_model_files() -> None:
    """fp16 and fp32 model files give the same figures under one plan dtype, and an fp32 plan
    moves twice the tensor-parallel and pipeline bytes of an fp16 one."""
    half16, half32 = _figures(_model("fp16"), "fp16"), _figures(_model("fp32"), "fp16")
    full16, full32 = _figures(_model("fp16"), "fp32"), _figures(_model("fp32"), "fp32")
    assert half16 == half32
    assert full16 == full32
    assert full16["tp"] == pytest.approx(2 * half16["tp"], rel=1e-12)
    assert full16["send"] > 0
    assert full16["send"] == pytest.approx(2 * half16["send"], rel=1e-12)
    assert full16["peak"] > half16["peak"]


def test_trained_in_keeps_the_object_where_bytes_agree() -> None:
    """Lowering caches key on the model's identity: same bytes, same object; otherwise one
    object per (model, dtype)."""
    model = api.load_model("gpt3-125m")
    assert trained_in(model, "bf16") is model
    assert trained_in(model, "fp8") is model
    as_fp32 = trained_in(model, "fp32")
    assert as_fp32.dtype == "fp32" and as_fp32.dtype_bytes == 4
    assert trained_in(model, "fp32") is as_fp32
