"""Wide-ResNet as Aceso trains it (Zagoruyko & Komodakis 2016; Aceso, Liu et al. EuroSys'24).

Aceso's WRN is a ResNet-50-style bottleneck network whose 3×3 convolutions are widened
(`width_factor`) and whose base width (`hidden`, Aceso's "in_channels") is scaled up:

* stem: 7×7/2 convolution (3 → base), batchnorm + ReLU, 3×3/2 max-pool (224 → 56 pixels);
* stage i (base_i = base·2^i, stride 2 from stage 1 on), each bottleneck block:
  1×1 conv (in → base_i), BN, 3×3 conv with the stride (base_i → base_i·width_factor), BN,
  1×1 conv (→ 4·base_i), BN, and in the first block a 1×1 strided downsample of the residual
  (in → 4·base_i), then residual add + ReLU;
* head: global average pool, fully connected layer to `num_classes`, cross entropy.

Parameters: 0.495 B for base 224 / width 2 / blocks [3,4,6,3] (Aceso's "500M") up to 12.6 B
for base 320 / width 16 / [3,4,23,3] ("13B"). Aceso trains these in fp32 on 224×224 images.
Each block is one `Layer`; blocks after the first of a stage repeat one object. Under tensor
parallelism a convolution is split along its output channels ("column": all-reduce of the input
gradient) or input channels ("row": all-reduce of the output), as Aceso's two partitions do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainsim.workloads.layer import Layer
from trainsim.workloads.ops import (
    REPLICATE,
    Op,
    column_shardings,
    elementwise_op,
    follows_column,
    matmul_op,
    replicated,
    row_shardings,
)
from trainsim.workloads.transformer_block import FP32_BYTES

if TYPE_CHECKING:  # a type only: model.py imports this module to build graphs
    from trainsim.workloads.model import ModelSpec

BOTTLENECK_EXPANSION = 4
"""Output channels of a bottleneck block are 4 × its base width (He et al. 2016, Table 1)."""
STEM_KERNEL, STEM_STRIDE, POOL_STRIDE = 7, 2, 2
"""ResNet stem: 7×7 stride-2 convolution and stride-2 max-pool (He et al. 2016, Table 1)."""


def conv_op(name: str, *, n: int, c_in: int, size: int, c_out: int, kernel: int, stride: int,
            dtype_bytes: int) -> Op:
    """A bias-free 2-D convolution: 2·N·H_out·W_out·C_out·C_in·k² forward FLOPs."""
    out_size = size // stride
    in_bytes = dtype_bytes * n * c_in * size * size
    out_bytes = dtype_bytes * n * c_out * out_size * out_size
    weights = c_in * c_out * kernel * kernel
    fwd_flops = 2.0 * n * out_size * out_size * c_out * c_in * kernel * kernel
    fwd_bytes = in_bytes + out_bytes + dtype_bytes * weights
    return Op(
        name=name, kind="conv2d", fwd_flops=fwd_flops, bwd_flops=2.0 * fwd_flops,
        fwd_bytes=fwd_bytes, bwd_bytes=2.0 * fwd_bytes, params=weights,
        activation_bytes=in_bytes, output_bytes=out_bytes,
        shardings=(column_shardings(in_bytes, split_dim=4)[0],
                   row_shardings(out_bytes, split_dim=1)[0]),
        shape=(n, c_in, size, size, c_out, kernel, stride),
    )


def _bn(name: str, n: int, c: int, size: int, dtype_bytes: int) -> Op:
    elements = n * c * size * size
    return elementwise_op(name, kind="batchnorm", elements=elements, dtype_bytes=dtype_bytes,
                          params=2 * c, activation_bytes=dtype_bytes * elements,
                          shardings=(REPLICATE, *follows_column(split_dim=0)))


def build_wide_resnet(spec: ModelSpec, n: int) -> tuple[Layer, ...]:
    """Layers of Aceso's Wide-ResNet for a micro-batch of `n` images."""
    B, base, size = spec.dtype_bytes, spec.hidden, spec.image_size
    stem_out = size // STEM_STRIDE
    stem_ops = (
        conv_op("stem.conv", n=n, c_in=spec.in_channels, size=size, c_out=base,
                kernel=STEM_KERNEL, stride=STEM_STRIDE, dtype_bytes=B),
        _bn("stem.bn", n, base, stem_out, B),
        elementwise_op("stem.maxpool", kind="pool", elements=n * base * stem_out ** 2,
                       dtype_bytes=B, activation_bytes=B * n * base * stem_out ** 2,
                       output_bytes=B * n * base * (stem_out // POOL_STRIDE) ** 2,
                       shardings=(REPLICATE, *follows_column(split_dim=0))),
    )
    width = stem_out // POOL_STRIDE
    channels = base
    layers = [Layer(name="stem", kind="stem", ops=stem_ops,
                    input_bytes=B * n * spec.in_channels * size * size,
                    output_bytes=B * n * base * width * width)]
    for stage, count in enumerate(spec.blocks):
        stage_base = base * 2 ** stage
        stride = 1 if stage == 0 else 2
        first = _block(f"stage{stage}.block0", spec, n, channels, width, stage_base, stride, True)
        layers.append(first)
        width //= stride
        channels = BOTTLENECK_EXPANSION * stage_base
        if count > 1:
            rest = _block(f"stage{stage}.block", spec, n, channels, width, stage_base, 1, False)
            layers += [rest] * (count - 1)
    layers.append(_head(spec, n, channels, width))
    return tuple(layers)


def _block(name: str, spec: ModelSpec, n: int, c_in: int, size: int, base: int, stride: int,
           downsample: bool) -> Layer:
    B, wide, out_c = spec.dtype_bytes, base * spec.width_factor, BOTTLENECK_EXPANSION * base
    out_size = size // stride
    ops = [
        conv_op("conv1", n=n, c_in=c_in, size=size, c_out=base, kernel=1, stride=1,
                dtype_bytes=B),
        _bn("bn1", n, base, size, B),
        conv_op("conv2", n=n, c_in=base, size=size, c_out=wide, kernel=3, stride=stride,
                dtype_bytes=B),
        _bn("bn2", n, wide, out_size, B),
        conv_op("conv3", n=n, c_in=wide, size=out_size, c_out=out_c, kernel=1, stride=1,
                dtype_bytes=B),
        _bn("bn3", n, out_c, out_size, B),
    ]
    if downsample:
        ops.append(conv_op("downsample", n=n, c_in=c_in, size=size, c_out=out_c, kernel=1,
                           stride=stride, dtype_bytes=B))
    out_elements = n * out_c * out_size * out_size
    # Residual add + ReLU saves its output for the ReLU backward.
    ops.append(elementwise_op("residual_relu", kind="elementwise", flops_key="relu",
                              elements=out_elements, inputs=2, dtype_bytes=B,
                              activation_bytes=B * out_elements, shardings=replicated()))
    return Layer(name=name, kind="conv_block", ops=tuple(ops),
                 input_bytes=B * n * c_in * size * size, output_bytes=B * out_elements,
                 recomputable=True)


def _head(spec: ModelSpec, n: int, channels: int, size: int) -> Layer:
    B = spec.dtype_bytes
    pool = elementwise_op("avgpool", kind="pool", elements=n * channels * size * size,
                          dtype_bytes=B, output_bytes=B * n * channels,
                          shardings=(REPLICATE, *follows_column(split_dim=0)))
    fc = matmul_op("fc", m=n, n=spec.num_classes, k=channels, dtype_bytes=B, bias=True,
                   shardings=(row_shardings(B * n * spec.num_classes)[0], REPLICATE))
    ce = elementwise_op("cross_entropy", kind="cross_entropy", elements=n * spec.num_classes,
                        dtype_bytes=B, activation_bytes=FP32_BYTES * n * spec.num_classes,
                        output_bytes=FP32_BYTES * n)
    return Layer(name="head", kind="head", ops=(pool, fc, ce),
                 input_bytes=B * n * channels * size * size, output_bytes=FP32_BYTES * n)
