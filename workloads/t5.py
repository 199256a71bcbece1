"""T5: encoder-decoder transformer with cross attention (Raffel et al. 2020).

Layers in order: encoder embedding, `num_layers` encoder blocks, encoder final norm, decoder
embedding (sharing the word embedding), `decoder_layers` decoder blocks (self attention, cross
attention over the encoder output, MLP), head (final norm, LM head, cross entropy). The encoder
runs on `seq_len` tokens and the decoder on `decoder_seq_len` (Aceso: 2048 and 512).

T5's heads are not hidden/num_heads wide: `head_dim` (d_kv, Megatron's kv_channels) is set
separately, so attention projects h → num_heads·head_dim (11B: 1024 → 16384).
Relative position biases (one table of buckets × heads per stack, Raffel et al. §2.1) are
counted in each stack's embedding layer; learned absolute positions (Megatron-LM's T5, as Aceso
trains it) likewise.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from trainsim.workloads.layer import Layer
from trainsim.workloads.transformer_block import (
    embedding_layer,
    lm_head_layer,
    norm_op,
    transformer_block,
)

if TYPE_CHECKING:  # a type only: model.py imports this module to build graphs
    from trainsim.workloads.model import ModelSpec


def build_t5(spec: ModelSpec, b: int, s: int) -> tuple[Layer, ...]:
    """Layers of T5 with encoder length `s` and the spec's decoder length."""
    s_dec = spec.decoder_seq_len
    relative = spec.relative_attention_num_buckets * spec.num_heads \
        if spec.position_embedding == "relative" else 0
    learned = spec.position_embedding == "learned"
    enc_embedding = embedding_layer(
        spec, b, s, name="encoder_embedding",
        positions=int(spec.max_position_embeddings or 0) if learned else 0, extra_params=relative)
    encoder = transformer_block(spec, b, s, name="encoder_block")
    enc_norm_op = norm_op("encoder.final_norm", spec, b * s)
    out_bytes = spec.dtype_bytes * b * s * spec.hidden
    # The encoder output is saved here once and read by every decoder block's cross attention.
    enc_norm = Layer(name="encoder_norm", kind="norm",
                     ops=(replace(enc_norm_op,
                                  activation_bytes=enc_norm_op.activation_bytes + out_bytes),),
                     input_bytes=out_bytes, output_bytes=out_bytes)
    # The decoder reuses the encoder's word (and, in Megatron's T5, position) embedding; only a
    # relative-bias table is its own.
    dec_embedding = embedding_layer(spec, b, s_dec, name="decoder_embedding",
                                    extra_params=relative, owns_word_embedding=False)
    decoder = transformer_block(spec, b, s_dec, name="decoder_block", kind="decoder", cross_s=s)
    head = lm_head_layer(spec, b, s_dec)
    return (enc_embedding, *([encoder] * spec.num_layers), enc_norm, dec_embedding,
            *([decoder] * spec.decoder_layers), head)
