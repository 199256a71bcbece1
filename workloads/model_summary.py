"""A model's facts in one plain dict: shape, parameters, FLOPs and activation memory.

What `sim models show --json` prints and what notebooks read (`trainsim.api.describe_model`).
"""

from __future__ import annotations

from typing import Any

from trainsim.workloads.model import ModelSpec, build_graph

FAMILY_FIELDS: dict[str, tuple[str, ...]] = {
    "t5": ("decoder_layers", "decoder_seq_len", "head_dim"),
    "moe": ("num_experts", "top_k", "capacity_factor", "moe_layer_interval"),
    "wresnet": ("blocks", "width_factor", "image_size", "num_classes"),
    "llama": ("num_kv_heads", "ffn_hidden"),
    "bert": ("type_vocab_size",),
}


def model_summary(spec: ModelSpec, micro_batch_size: int = 1, seq_len: int | None = None,
                  ) -> dict[str, Any]:
    """The facts `sim models show --json` prints, as a plain dict (stable key order)."""
    graph = build_graph(spec, micro_batch_size, seq_len)
    out: dict[str, Any] = {
        "name": spec.name,
        "family": spec.family,
        "source": spec.source,
        "parameters": graph.parameters,
        "layers": spec.num_layers,
        "hidden": spec.hidden,
        "heads": spec.num_heads,
    }
    for key, value in spec.to_dict().items():
        out.setdefault(key, value)
    for key in FAMILY_FIELDS.get(spec.family, ()):
        value = getattr(spec, key)
        out[key] = list(value) if isinstance(value, tuple) else value
    out.update({
        "micro_batch_size": graph.micro_batch_size,
        "seq_len": graph.seq_len,
        "graph_layers": len(graph.layers),
        "flops_per_token": graph.flops_per_token,
        "activation_bytes_per_token": graph.activation_bytes_per_token,
        "training_flops": {r: graph.training_flops(r) for r in ("none", "selective", "full")},
        "matmul_training_flops": {r: graph.training_flops(r, matmul_only=True)
                                  for r in ("none", "selective", "full")},
        "activation_bytes": {r: graph.activation_bytes(recompute=r)
                             for r in ("none", "selective", "full")},
    })
    return out
