"""GShard-style mixture of experts in a GPT model (Lepikhin et al. 2021; DeepSpeed-MoE,
Rajbhandari et al. 2022).

Every `moe_layer_interval`-th block (the 2nd, 4th, ... for interval 2, as DeepSpeed-MoE does)
replaces its dense MLP by `num_experts` expert MLPs behind a learned top-k router. Each expert
processes at most its capacity, capacity_factor · top_k · tokens / num_experts tokens (GShard
§2.2), so the expert GEMMs run on capacity_factor · top_k · tokens rows in total. Under expert
parallelism tokens travel to their experts by an all-to-all (dispatch) and back (combine), and
the gradients travel the same way in the backward pass.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from trainsim.workloads.layer import Layer
from trainsim.workloads.ops import (
    REPLICATE,
    Op,
    Sharding,
    elementwise_op,
    expert_shardings,
    matmul_op,
    replicated,
)
from trainsim.workloads.transformer_block import (
    FP32_BYTES,
    embedding_layer,
    lm_head_layer,
    residual_op,
    transformer_block,
)

if TYPE_CHECKING:  # a type only: model.py imports this module to build graphs
    from trainsim.workloads.model import ModelSpec


def build_moe(spec: ModelSpec, b: int, s: int) -> tuple[Layer, ...]:
    """Layers: embedding, dense and MoE blocks alternating per `moe_layer_interval`, head."""
    positions = spec.max_position_embeddings if spec.position_embedding == "learned" else 0
    embedding = embedding_layer(spec, b, s, positions=int(positions or 0))
    dense = transformer_block(spec, b, s)
    moe = transformer_block(spec, b, s, name="moe_block", kind="moe_transformer",
                            mlp=moe_mlp_ops("moe", spec, b * s))
    blocks = [moe if (i + 1) % spec.moe_layer_interval == 0 else dense
              for i in range(spec.num_layers)]
    return (embedding, *blocks, lm_head_layer(spec, b, s))


def moe_mlp_ops(prefix: str, spec: ModelSpec, tokens: int) -> tuple[Op, ...]:
    """Router, expert up projection, activation, expert down projection, residual.

    The dispatch all-to-all is attached to the up projection and the combine to the down
    projection; both move the capacity-padded token buffer (rows × h).
    """
    B, h, f, E = spec.dtype_bytes, spec.hidden, int(spec.ffn_hidden or 0), spec.num_experts
    rows = round(spec.capacity_factor * spec.top_k * tokens)
    buffer_bytes = B * rows * h
    router = matmul_op(f"{prefix}.router", kind="router", m=tokens, n=E, k=h, dtype_bytes=B,
                       bias=False, shardings=replicated())
    # Router probabilities are kept in fp32 for the gate's backward.
    router = replace(router, activation_bytes=router.activation_bytes + FP32_BYTES * tokens * E)
    bias_up, bias_down = (f, h) if spec.bias else (0, 0)
    up = matmul_op(f"{prefix}.experts.fc1", m=rows, n=f, k=h, dtype_bytes=B, bias=False,
                   params=E * (h * f + bias_up), shardings=(*expert_shardings(buffer_bytes),
                                                             REPLICATE))
    act = elementwise_op(f"{prefix}.experts.gelu", kind="gelu", elements=rows * f, dtype_bytes=B,
                         activation_bytes=B * rows * f,
                         shardings=(Sharding(name="expert", splits_activations=True), REPLICATE))
    down = matmul_op(f"{prefix}.experts.fc2", m=rows, n=h, k=f, dtype_bytes=B, bias=False,
                     params=E * (f * h + bias_down),
                     shardings=(*expert_shardings(buffer_bytes), REPLICATE))
    return (router, up, act, down, residual_op(f"{prefix}.residual", spec, tokens))
