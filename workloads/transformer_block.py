"""Ops of transformer blocks shared by the GPT, LLaMA, BERT, T5 and MoE builders.

Notation (Korthikanti et al. 2022, Table 1): s sequence length, b micro-batch size, h hidden size,
a attention heads, d head width, k key/value heads, f MLP width, V vocabulary. Every op saves what
its backward needs, so that a GPT block sums to Korthikanti's eq. (1):
s·b·h·(34 + 5·a·s/h) bytes in fp16 —

* attention 11·sbh + 5·as²b: QKV input 2sbh, Q and K 4sbh, softmax output 2as²b, dropout mask
  as²b, dropout output 2as²b, V 2sbh, projection input 2sbh, dropout mask sbh;
* MLP 19·sbh: input 2sbh, GeLU input 8sbh, second GEMM input 8sbh, dropout mask sbh;
* two layernorms 4·sbh.

That is the "eager" attention kernel (`ModelSpec.attention`). The default, "flash", is one fused
kernel (FlashAttention-2, Dao 2023, arXiv:2307.08691; PyTorch SDPA's flash / memory-efficient
backends) that saves only Q, K, V, its output and the per-row logsumexp, so no s² term remains:
attention saves 11·sbh + 4·a·s·b (the fp32 logsumexp) and a GPT block s·b·h·34 + 4·a·s·b
(`flash_attention_op`).

Ops are listed in execution order of a pre-norm block; a post-norm block (BERT) has the same ops
and costs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainsim.workloads.layer import TOKEN_ID_BYTES, Layer
from trainsim.workloads.ops import (
    CommNeed,
    Op,
    Sharding,
    column_shardings,
    elementwise_op,
    follows_column,
    heads_shardings,
    matmul_op,
    replicated,
    row_shardings,
)

if TYPE_CHECKING:  # a type only: model.py imports this module to build graphs
    from trainsim.workloads.model import ModelSpec

MASK_BYTES = 1
"""Dropout masks are stored as one byte per element (torch.bool / uint8)."""
FP32_BYTES = 4
"""Megatron computes the (vocab-parallel) cross entropy on fp32 logits."""
CE_REDUCTIONS = 3
"""Vocab-parallel cross entropy all-reduces three per-token scalars: max, sum of exp, target."""
FLASH_BACKWARD_FACTOR = 2.5
"""FlashAttention-2's backward runs five GEMMs (recomputed S = QKᵀ, dV, dP, dQ, dK) against the
forward's two, so 2.5x the forward FLOPs (Dao 2023, arXiv:2307.08691, §4.1, which counts
backward FLOPs this way)."""
LSE_BYTES = 4
"""The per-row logsumexp FlashAttention keeps for the backward is fp32 (Dao 2023, Alg. 1-2:
L = m + log(l), one value per query row and head)."""


def flash_attention_op(name: str, spec: ModelSpec, b: int, s_q: int, s_kv: int,
                       kv_local: int | None = None) -> Op:
    """The fused attention core of FlashAttention-2 / SDPA (Dao 2023, arXiv:2307.08691).

    One kernel computes softmax(QKᵀ/√d)·V tile by tile in on-chip memory, so the s_q×s_kv
    scores, probabilities and dropout mask never reach device memory (dropout is regenerated
    from the RNG state in the backward). For the backward it keeps Q, K, V, its output O and
    the per-row logsumexp L (b·a·s_q fp32 values); the backward recomputes the scores.

    * FLOPs: forward the two attention GEMMs, 4·b·a·s_q·s_kv·d (as the eager score + context);
      backward `FLASH_BACKWARD_FACTOR` (2.5) times that.
    * Saved bytes: Q, K, V and L. O is the input of the output projection, which saves it
      already (the same storage: Transformer Engine and torchtitan hand the kernel's output to
      the projection without a copy), so it is not counted twice.
    * Bytes moved: Q, K, V read and O, L written once (the kernel's minimum; re-reads of K and V
      per query tile are on-chip traffic for the head widths used here); the backward reads Q,
      K, V, O, dO and L and writes dQ, dK, dV.
    * Cost: a batched GEMM (efficiency class of attention_score) over shape
      (b·a, s_q, s_kv, d), split by heads under tensor parallelism.
    * Selective recompute (Korthikanti et al. 2022 §5) re-runs the kernel and keeps Q, K, V.
    * Context parallelism (`kv_local` < s_kv): ring attention streams the other ranks' K, V
      chunks through the kernel; the rank keeps only its own `kv_local` positions for the
      backward (the ring runs again there), so saved bytes count those.
    """
    B = spec.dtype_bytes
    a, d, k = spec.num_heads, int(spec.head_dim or 0), int(spec.num_kv_heads or 0)
    q_bytes = B * b * s_q * a * d
    kv_bytes = 2.0 * B * b * s_kv * k * d
    kept_kv = kv_bytes if kv_local is None else 2.0 * B * b * kv_local * k * d
    o_bytes = B * b * s_q * a * d
    lse_bytes = LSE_BYTES * b * a * s_q
    fwd_flops = 4.0 * b * a * s_q * s_kv * d
    return Op(
        name=name, kind="flash_attention", fwd_flops=fwd_flops,
        bwd_flops=FLASH_BACKWARD_FACTOR * fwd_flops,
        fwd_bytes=q_bytes + kv_bytes + o_bytes + lse_bytes,
        bwd_bytes=2.0 * (q_bytes + kv_bytes) + 2.0 * o_bytes + lse_bytes,
        params=0, activation_bytes=q_bytes + kept_kv + lse_bytes, output_bytes=o_bytes,
        selective_recompute=True, selective_kept_bytes=q_bytes + kept_kv,
        shardings=heads_shardings(), shape=(b * a, s_q, s_kv, d),
    )


def norm_op(name: str, spec: ModelSpec, tokens: int, width: int | None = None) -> Op:
    """A layernorm or RMSNorm over `tokens` rows; saves its input (2·sbh in fp16)."""
    h = spec.hidden if width is None else width
    kind = spec.norm
    dtype_bytes = spec.dtype_bytes
    return elementwise_op(
        name, kind=kind, elements=tokens * h, dtype_bytes=dtype_bytes,
        params=(2 * h) if kind == "layernorm" else h,
        activation_bytes=dtype_bytes * tokens * h, shardings=replicated(),
    )


def residual_op(name: str, spec: ModelSpec, tokens: int) -> Op:
    """Fused bias-dropout-add (saves a 1-byte mask) or, without dropout, a residual add."""
    elements = tokens * spec.hidden
    if spec.dropout:
        return elementwise_op(name, kind="dropout", elements=elements, inputs=2,
                              dtype_bytes=spec.dtype_bytes,
                              activation_bytes=MASK_BYTES * elements, shardings=replicated())
    return elementwise_op(name, kind="elementwise", elements=elements, inputs=2,
                          dtype_bytes=spec.dtype_bytes, shardings=replicated())


def attention_ops(prefix: str, spec: ModelSpec, b: int, s_q: int, s_kv: int | None = None,
                  ) -> tuple[Op, ...]:
    """Self attention (`s_kv` None) or cross attention over `s_kv` encoder positions.

    Under context parallelism (`spec.context_parallel` = c > 1) a rank's self attention runs
    its s_q = seq/c queries against all c·s_q keys (fused kernel only; PlanError otherwise).

    The attention core (QKᵀ, softmax, softmax dropout, attention over V; or one fused
    `flash_attention_op` when `spec.attention` is "flash") is split by heads and flagged for
    selective recompute, which keeps its inputs Q, K, V (Korthikanti et al. 2022 §5).
    """
    cross = s_kv is not None
    s_kv = s_q if s_kv is None else s_kv
    B = spec.dtype_bytes
    h, a, d, k = spec.hidden, spec.num_heads, int(spec.head_dim or 0), int(spec.num_kv_heads or 0)
    t_q, t_kv = b * s_q, b * s_kv
    h_q, h_kv = a * d, k * d
    ops: list[Op] = []
    if cross:
        ops.append(matmul_op(f"{prefix}.q", m=t_q, n=h_q, k=h, dtype_bytes=B, bias=spec.bias,
                             shardings=column_shardings(B * t_q * h)))
        # K and V of the encoder output: the encoder output is saved once, by the encoder's
        # final norm, not by every decoder layer.
        ops.append(matmul_op(f"{prefix}.kv", m=t_kv, n=2 * h_kv, k=h, dtype_bytes=B,
                             bias=spec.bias, activation_bytes=0.0,
                             shardings=column_shardings(B * t_kv * h)))
    else:
        ops.append(matmul_op(f"{prefix}.qkv", m=t_q, n=h_q + 2 * h_kv, k=h, dtype_bytes=B,
                             bias=spec.bias, shardings=column_shardings(B * t_q * h)))
    if spec.position_embedding == "rotary" and not cross:
        ops.append(elementwise_op(f"{prefix}.rotary", kind="elementwise", flops_key="rotary",
                                  elements=t_q * (h_q + h_kv), dtype_bytes=B,
                                  shardings=heads_shardings()))
    ring = spec.context_parallel if not cross else 1
    if spec.attention == "flash":
        ops.append(flash_attention_op(f"{prefix}.flash", spec, b, s_q, s_kv * ring,
                                      kv_local=s_kv if ring > 1 else None))
        ops.append(matmul_op(f"{prefix}.proj", m=t_q, n=h, k=h_q, dtype_bytes=B, bias=spec.bias,
                             shardings=row_shardings(B * t_q * h)))
        ops.append(residual_op(f"{prefix}.residual", spec, t_q))
        return tuple(ops)
    if ring > 1:
        raise ValueError("context parallelism needs the fused attention kernel (ring "
                         "attention); this model runs eager attention")
    probs = b * a * s_q * s_kv
    qk_bytes = B * (t_q * h_q + t_kv * h_kv)
    score_flops = 2.0 * probs * d
    ops.append(Op(
        name=f"{prefix}.score", kind="attention_score", fwd_flops=score_flops,
        bwd_flops=2.0 * score_flops, fwd_bytes=qk_bytes + B * probs,
        bwd_bytes=2.0 * (qk_bytes + B * probs), params=0, activation_bytes=qk_bytes,
        output_bytes=B * probs, selective_recompute=True, selective_kept_bytes=qk_bytes,
        shardings=heads_shardings(), shape=(b * a, s_q, s_kv, d),
    ))
    ops.append(elementwise_op(f"{prefix}.softmax", kind="softmax", elements=probs, dtype_bytes=B,
                              activation_bytes=B * probs, shardings=heads_shardings(),
                              selective_recompute=True))
    if spec.dropout:
        ops.append(elementwise_op(f"{prefix}.attn_dropout", kind="dropout", elements=probs,
                                  dtype_bytes=B, activation_bytes=MASK_BYTES * probs,
                                  shardings=heads_shardings(), selective_recompute=True))
    v_bytes = B * t_kv * h_kv
    # Without dropout the probabilities are the softmax output, already saved above.
    probs_saved = B * probs if spec.dropout else 0.0
    ops.append(Op(
        name=f"{prefix}.context", kind="attention_context", fwd_flops=score_flops,
        bwd_flops=2.0 * score_flops, fwd_bytes=B * (probs + t_kv * h_kv + t_q * h_q),
        bwd_bytes=2.0 * B * (probs + t_kv * h_kv + t_q * h_q), params=0,
        activation_bytes=probs_saved + v_bytes, output_bytes=B * t_q * h_q,
        selective_recompute=True, selective_kept_bytes=v_bytes,
        shardings=heads_shardings(), shape=(b * a, s_q, d, s_kv),
    ))
    ops.append(matmul_op(f"{prefix}.proj", m=t_q, n=h, k=h_q, dtype_bytes=B, bias=spec.bias,
                         shardings=row_shardings(B * t_q * h)))
    ops.append(residual_op(f"{prefix}.residual", spec, t_q))
    return tuple(ops)


def mlp_ops(prefix: str, spec: ModelSpec, tokens: int) -> tuple[Op, ...]:
    """Column-parallel up projection, activation, row-parallel down projection, dropout-add.

    Gated activations (SwiGLU, GeGLU; Shazeer 2020) fuse the gate and up projections into one
    h→2f GEMM and save both halves for the backward.
    """
    B, h, f = spec.dtype_bytes, spec.hidden, int(spec.ffn_hidden or 0)
    gated = spec.activation in ("swiglu", "geglu")
    up = matmul_op(f"{prefix}.fc1", m=tokens, n=(2 * f if gated else f), k=h, dtype_bytes=B,
                   bias=spec.bias, shardings=column_shardings(B * tokens * h))
    elements = tokens * f
    if gated:
        act = elementwise_op(f"{prefix}.{spec.activation}", kind="swiglu", elements=elements,
                             inputs=2, dtype_bytes=B, activation_bytes=2 * B * elements,
                             shardings=follows_column())
    elif spec.activation == "gelu":
        act = elementwise_op(f"{prefix}.gelu", kind="gelu", elements=elements, dtype_bytes=B,
                             activation_bytes=B * elements, shardings=follows_column())
    else:
        act = elementwise_op(f"{prefix}.relu", kind="elementwise", flops_key="relu",
                             elements=elements, dtype_bytes=B, activation_bytes=B * elements,
                             shardings=follows_column())
    down = matmul_op(f"{prefix}.fc2", m=tokens, n=h, k=f, dtype_bytes=B, bias=spec.bias,
                     shardings=row_shardings(B * tokens * h))
    return (up, act, down, residual_op(f"{prefix}.residual", spec, tokens))


def transformer_block(spec: ModelSpec, b: int, s: int, *, name: str = "block",
                      kind: str = "transformer", cross_s: int | None = None,
                      mlp: tuple[Op, ...] | None = None) -> Layer:
    """A pre-norm block: norm, self attention, [norm, cross attention,] norm, MLP.

    Args:
        cross_s: Encoder length for a decoder block with cross attention (T5).
        mlp: Ops replacing the dense MLP (an MoE layer); they follow the second norm.
    """
    tokens = b * s
    ops: list[Op] = [norm_op("attn.norm", spec, tokens)]
    ops += attention_ops("attn", spec, b, s)
    side = 0.0
    if cross_s is not None:
        ops.append(norm_op("cross.norm", spec, tokens))
        ops += attention_ops("cross", spec, b, s, cross_s)
        side = spec.dtype_bytes * b * cross_s * spec.hidden
    ops.append(norm_op("mlp.norm", spec, tokens))
    ops += mlp_ops("mlp", spec, tokens) if mlp is None else mlp
    boundary = spec.dtype_bytes * tokens * spec.hidden
    # torchtitan's op-level selective policy is described for dense self-attention blocks;
    # MoE and cross-attention blocks keep Megatron's (their GEMM call order is not modelled)
    dense = mlp is None and cross_s is None
    return Layer(name=name, kind=kind, ops=tuple(ops), input_bytes=boundary,
                 output_bytes=boundary, side_input_bytes=side, recomputable=True,
                 selective_policy=spec.selective_policy if dense else "megatron",
                 sac_keeps_unread=spec.sac_keeps_unread,
                 gemm_splits=_torch_gemm_splits(spec) if dense else ())


def _torch_gemm_splits(spec: ModelSpec) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """How a PyTorch block (torchtitan's Llama) runs the GEMMs fused here: q, k, v as three
    nn.Linear calls (wq, wk, wv), and a gated MLP's gate and up projections as two (w1, w3)."""
    h_q = spec.num_heads * int(spec.head_dim or 0)
    h_kv = int(spec.num_kv_heads or 0) * int(spec.head_dim or 0)
    n = h_q + 2 * h_kv
    splits: list[tuple[str, tuple[float, ...]]] = [("attn.qkv", (h_q / n, h_kv / n, h_kv / n))]
    if spec.activation in ("swiglu", "geglu"):
        splits.append(("mlp.fc1", (0.5, 0.5)))
    return tuple(splits)


def embedding_layer(spec: ModelSpec, b: int, s: int, *, name: str = "embedding",
                    positions: int = 0, types: int = 0, extra_params: int = 0,
                    with_norm: bool = False, owns_word_embedding: bool = True) -> Layer:
    """Word (+ position, + token-type) embedding, optional layernorm, dropout.

    `owns_word_embedding` is False for a second stack reusing the first's word embedding (T5's
    decoder); its parameters are then counted once, and the layer reads them as
    `shared_params`: a pipeline stage that runs it without the owner keeps a copy, which is
    all-reduced with the owner's (Megatron-LM's T5 split rank is in the embedding group).

    The word embedding is vocab-parallel (Shoeybi et al. 2019 §3): each rank holds V/t rows and
    the partial lookups are all-reduced (reduce-scattered under SP) like a row-parallel GEMM.
    The position and token-type tables are kept whole on every rank (`Op.replicated_params`).
    """
    B, h, tokens = spec.dtype_bytes, spec.hidden, b * s
    out_bytes = B * tokens * h
    ops: list[Op] = [elementwise_op(
        "embedding", kind="embedding", elements=tokens * h, inputs=2, dtype_bytes=B,
        params=((spec.vocab_size if owns_word_embedding else 0) + positions + types) * h
        + extra_params,
        replicated_params=(positions + types) * h,
        shardings=row_shardings(out_bytes, split_dim=None),
    )]
    if with_norm:
        ops.append(norm_op("embedding.norm", spec, tokens))
    if spec.dropout:
        ops.append(elementwise_op("embedding.dropout", kind="dropout", elements=tokens * h,
                                  dtype_bytes=B, activation_bytes=MASK_BYTES * tokens * h,
                                  shardings=replicated()))
    return Layer(name=name, kind="embedding", ops=tuple(ops),
                 input_bytes=TOKEN_ID_BYTES * tokens, output_bytes=out_bytes,
                 shared_params=0 if owns_word_embedding else spec.vocab_size * h)


def lm_head_ops(spec: ModelSpec, tokens: int, *, prefix: str = "lm_head",
                bias: bool = False) -> tuple[Op, ...]:
    """Vocabulary projection (column-parallel over V) and vocab-parallel cross entropy.

    The cross entropy saves fp32 logits, 4·s·b·V bytes (Korthikanti et al. 2022 §4.1).
    """
    B, h, V = spec.dtype_bytes, spec.hidden, spec.vocab_size
    params = (V if bias else 0) + (0 if spec.tied_embeddings else V * h)
    # FP8 recipes keep the output layer in BF16 (torchtitan's Float8 converter skips "output")
    proj = matmul_op(prefix, m=tokens, n=V, k=h, dtype_bytes=B, bias=False, params=params,
                     shardings=column_shardings(B * tokens * h), fp8=False)
    ce_shardings = (Sharding(
        name="column", splits_activations=True, split_dim=0,
        comm=(CommNeed(phase="fwd", collective="all_reduce",
                       size_bytes=CE_REDUCTIONS * FP32_BYTES * tokens),)),)
    ce = elementwise_op("cross_entropy", kind="cross_entropy", elements=tokens * V,
                        dtype_bytes=B, activation_bytes=FP32_BYTES * tokens * V,
                        output_bytes=FP32_BYTES * tokens, shardings=ce_shardings)
    return (proj, ce)


def lm_head_layer(spec: ModelSpec, b: int, s: int, *, name: str = "head",
                  final_norm: bool = True) -> Layer:
    """Final norm, LM head and cross entropy as one layer (the last pipeline stage's tail)."""
    tokens = b * s
    ops: tuple[Op, ...] = (norm_op("final_norm", spec, tokens),) if final_norm else ()
    ops += lm_head_ops(spec, tokens)
    return Layer(name=name, kind="head", ops=ops,
                 input_bytes=spec.dtype_bytes * tokens * spec.hidden,
                 output_bytes=FP32_BYTES * tokens,
                 shared_params=spec.vocab_size * spec.hidden if spec.tied_embeddings else 0,
                 backward_workspace_bytes=spec.loss_workspace_bytes * tokens * spec.vocab_size,
                 backward_workspace_tp_bytes=spec.loss_workspace_tp_bytes * tokens
                 * spec.vocab_size)
