"""GPT: decoder-only transformer (Radford et al. 2019; Brown et al. 2020, Table 2.1).

Layers in order: embedding (word + learned position, dropout), `num_layers` identical blocks
(one `Layer` object repeated), head (final norm, LM head tied to the word embedding, cross
entropy). Rotary positions, RMSNorm, gated MLPs, grouped-query attention and untied heads follow
from the spec's fields, so the same builder serves GPT-NeoX-style and LLaMA-style models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainsim.workloads.layer import Layer
from trainsim.workloads.transformer_block import embedding_layer, lm_head_layer, transformer_block

if TYPE_CHECKING:  # a type only: model.py imports this module to build graphs
    from trainsim.workloads.model import ModelSpec


def build_gpt(spec: ModelSpec, b: int, s: int) -> tuple[Layer, ...]:
    """Layers of a decoder-only model for micro-batch `b` and sequence length `s`."""
    positions = spec.max_position_embeddings if spec.position_embedding == "learned" else 0
    embedding = embedding_layer(spec, b, s, positions=int(positions or 0))
    block = transformer_block(spec, b, s)
    head = lm_head_layer(spec, b, s)
    return (embedding, *([block] * spec.num_layers), head)
