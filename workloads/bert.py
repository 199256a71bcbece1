"""BERT (Devlin et al. 2019): bidirectional encoder with word, position and token-type
embeddings (+ layernorm), post-norm blocks and the pre-training heads.

The head layer holds the masked-LM head (dense h→h, GeLU, layernorm, vocabulary projection tied
to the word embedding with its own bias, cross entropy) and, with `pooler`, the pooler (dense on
the [CLS] token + tanh) and the next-sentence classifier. BERT-large with these heads has
336.2 M parameters (DeepSpeed's flops-profiler tutorial reports 336.23 M for NVIDIA's
BERT-large pre-training model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainsim.workloads.layer import Layer
from trainsim.workloads.ops import Op, elementwise_op, matmul_op, replicated
from trainsim.workloads.transformer_block import (
    FP32_BYTES,
    embedding_layer,
    lm_head_ops,
    norm_op,
    transformer_block,
)

if TYPE_CHECKING:  # a type only: model.py imports this module to build graphs
    from trainsim.workloads.model import ModelSpec

NSP_CLASSES = 2
"""The next-sentence-prediction head is a 2-way classifier (Devlin et al. 2019 §3.1)."""


def build_bert(spec: ModelSpec, b: int, s: int) -> tuple[Layer, ...]:
    """Layers of BERT: embedding (+ norm), `num_layers` blocks, pre-training heads."""
    embedding = embedding_layer(spec, b, s, positions=int(spec.max_position_embeddings or 0),
                                types=spec.type_vocab_size, with_norm=True)
    block = transformer_block(spec, b, s)
    return (embedding, *([block] * spec.num_layers), _heads(spec, b, s))


def _heads(spec: ModelSpec, b: int, s: int) -> Layer:
    B, h, tokens = spec.dtype_bytes, spec.hidden, b * s
    ops: list[Op] = []
    if spec.pooler:
        ops.append(matmul_op("pooler", m=b, n=h, k=h, dtype_bytes=B, bias=True,
                             shardings=replicated()))
        ops.append(elementwise_op("pooler.tanh", kind="elementwise", elements=b * h,
                                  dtype_bytes=B, activation_bytes=B * b * h,
                                  shardings=replicated()))
        ops.append(matmul_op("nsp", m=b, n=NSP_CLASSES, k=h, dtype_bytes=B, bias=True,
                             shardings=replicated()))
    # Megatron keeps the MLM transform (dense, GeLU, norm) replicated; only the vocabulary
    # projection is split.
    ops.append(matmul_op("mlm.dense", m=tokens, n=h, k=h, dtype_bytes=B, bias=True,
                         shardings=replicated()))
    ops.append(elementwise_op("mlm.gelu", kind="gelu", elements=tokens * h, dtype_bytes=B,
                              activation_bytes=B * tokens * h, shardings=replicated()))
    ops.append(norm_op("mlm.norm", spec, tokens))
    ops += lm_head_ops(spec, tokens, prefix="mlm.decoder", bias=True)
    return Layer(name="head", kind="head", ops=tuple(ops), input_bytes=B * tokens * h,
                 output_bytes=FP32_BYTES * tokens,
                 shared_params=spec.vocab_size * h if spec.tied_embeddings else 0)
