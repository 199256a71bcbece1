"""LLaMA-2 (Touvron et al. 2023): a decoder-only transformer with RMSNorm, SwiGLU MLPs,
rotary position embeddings, grouped-query attention (70B: 8 key/value heads), no biases, no
dropout and an LM head untied from the word embedding.

Every one of these is a field of `ModelSpec` that the GPT builder honours, so this module only
names the family's builder; the LLaMA defaults live in `data/models.yaml` and in the
`config.json` loader (`user_models.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainsim.workloads.gpt import build_gpt
from trainsim.workloads.layer import Layer

if TYPE_CHECKING:  # a type only: model.py imports this module to build graphs
    from trainsim.workloads.model import ModelSpec


def build_llama(spec: ModelSpec, b: int, s: int) -> tuple[Layer, ...]:
    """Layers of a LLaMA model: embedding, `num_layers` blocks, head (RMSNorm, untied LM head)."""
    return build_gpt(spec, b, s)
