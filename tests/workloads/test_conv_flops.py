"""Convolution FLOPs and the units of vision models (issue 18: Wide-ResNet reported MFU 0.69
and tokens/s for images).

With base width 64 and width factor 1 the bottleneck stack is ResNet-50, whose forward cost
and size torchvision publishes (pytorch.org/vision/stable/models.html, ResNet50_Weights
.IMAGENET1K_V1: 4.09 GFLOPS -- multiply-adds -- and 25.6 M parameters at 224×224)."""

from __future__ import annotations

import pytest

from trainsim import api
from trainsim.workloads.model import build_graph
from trainsim.workloads.user_models import spec_from_mapping


def _resnet50():
    return spec_from_mapping({"family": "wresnet", "blocks": [3, 4, 6, 3], "hidden": 64,
                              "width_factor": 1, "image_size": 224, "num_classes": 1000,
                              "dtype": "fp32"}, origin="test", name="resnet50")


def test_resnet50_forward_macs_and_parameters_match_torchvision() -> None:
    graph = build_graph(_resnet50(), 1)
    macs = sum(op.fwd_flops for layer in graph.layers for op in layer.ops if op.is_matmul) / 2
    params = sum(op.params for layer in graph.layers for op in layer.ops)
    assert macs == pytest.approx(4.09e9, rel=0.01)
    assert params == pytest.approx(25.6e6, rel=0.01)


def test_vision_mfu_counts_convolutions_and_throughput_is_images() -> None:
    """MFU = 3 × forward conv/GEMM FLOPs per image × images / (time × peak), and the
    throughput the result reports is per image, not per token."""
    spec = _resnet50()
    result = api.simulate(spec, "1xV100-SXM2-32GB", {"global_batch": 32,
                                                      "micro_batch_size": 32})
    graph = build_graph(spec, 1)
    per_image = 3 * sum(op.fwd_flops for layer in graph.layers for op in layer.ops
                        if op.is_matmul)
    peak = result.program.info.peak_flops_per_rank[0]
    expected = per_image * 32 / (result.iteration_time_s * peak)
    assert result.mfu == pytest.approx(expected, rel=1e-6)
    assert 0.05 < result.mfu < 0.7
    assert result.program.info.tokens_per_iteration == 32  # images, not pixels or tokens
