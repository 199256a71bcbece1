"""The zoo's op kinds as torch code: one function per kind, shared by the model and the profiler.

For measured and predicted times to be comparable, the small torch model must run exactly the
ops the zoo graph describes (workloads/transformer_block.py), at the same shapes, and the
profiler must time exactly that code. Both therefore call the functions here:

* ``matmul`` (m, n, k): ``F.linear`` of an [m, k] input with an [n, k] weight (+ bias);
* ``attention_score`` (B, s_q, s_kv, d): ``bmm(q, kᵀ)``; ``attention_context`` (B, s_q, d, s_kv):
  ``bmm(p, v)``;
* ``softmax``: the fused scale-mask-softmax, ``softmax(x·scale + mask)`` (mask additive,
  -inf above the diagonal for causal attention, zeros otherwise);
* ``layernorm``, ``gelu`` (tanh form, as counted in op_flops.yaml), ``elementwise`` (residual add);
* ``embedding``: word + position lookup; vocab-parallel under tensor parallelism (Shoeybi et al.
  2019 §3: each rank holds V/t rows, out-of-range ids give zeros, the partial rows are summed);
* ``cross_entropy``: vocab-parallel cross entropy. Megatron-LM all-reduces the max, the sum of
  exponentials and the target logit separately; here each rank's (local max, local sum of
  exp(x - local max), local target logit) is all-gathered in one collective of 3 floats per token
  and the log-sum-exp is combined locally (LSE = M + log Σ_r e^{m_r - M} s_r, M = max_r m_r),
  which moves the same bytes as the zoo's single 3·4·tokens-byte collective
  (transformer_block.py, ``CE_REDUCTIONS``).

The tensor-parallel "f" and "g" operators of Megatron-LM (Shoeybi et al. 2019, Fig. 3) are the
autograd functions `copy_to_tp` (identity forward, all-reduce backward) and `reduce_from_tp`
(all-reduce forward, identity backward).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainsim.validate import op_clock


class _CopyToTp(torch.autograd.Function):
    """Megatron's "f": identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        with op_clock.comm():
            dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTp(torch.autograd.Function):
    """Megatron's "g": all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous()
        with op_clock.comm():
            dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Identity forward, gradient all-reduced over `group` backward (no-op without a group)."""
    return x if group is None else _CopyToTp.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Sum over `group` forward, identity backward (no-op without a group)."""
    return x if group is None else _ReduceFromTp.apply(x, group)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """GEMM [m, k] × [n, k]ᵀ (+ bias): zoo kind ``matmul`` with shape (m, n, k)."""
    return F.linear(x, weight, bias)


def attention_score(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[B, s_q, d] × [B, s_kv, d]ᵀ → [B, s_q, s_kv]: kind ``attention_score``."""
    return torch.bmm(q, k.transpose(1, 2))


def attention_context(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[B, s_q, s_kv] × [B, s_kv, d] → [B, s_q, d]: kind ``attention_context``."""
    return torch.bmm(p, v)


def scale_mask_softmax(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(x·scale + mask) over the last dim: kind ``softmax``."""
    return torch.softmax(x * scale + mask, dim=-1)


def attention_mask(s_q: int, s_kv: int, causal: bool, device: Any = None) -> torch.Tensor:
    """Additive mask [s_q, s_kv]: -inf above the diagonal when causal, zeros otherwise."""
    if not causal:
        return torch.zeros(s_q, s_kv, device=device)
    return torch.triu(torch.full((s_q, s_kv), float("-inf"), device=device), diagonal=1)


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Layer norm over the last dim: kind ``layernorm``."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GeLU, tanh approximation: kind ``gelu``."""
    return F.gelu(x, approximate="tanh")


def residual_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y: kind ``elementwise`` (the residual add of a block without dropout)."""
    return x + y


def embedding(ids: torch.Tensor, word: torch.Tensor, position: torch.Tensor | None,
              vocab_start: int, tp_group: Any, vocab_parallel: bool | None = None
              ) -> torch.Tensor:
    """Word (+ position) embedding of token ids [b, s] → [b·s, h]: kind ``embedding``.

    `word` holds rows vocab_start .. vocab_start + len(word) (all rows without TP); ids outside
    give zero rows and the partial results are summed over `tp_group`. `vocab_parallel`
    (default: a group is given) runs the masking without the sum, for the profiler.
    """
    flat = ids.reshape(-1)
    if vocab_parallel is None:
        vocab_parallel = tp_group is not None
    if not vocab_parallel:
        out = F.embedding(flat, word)
    else:
        outside = (flat < vocab_start) | (flat >= vocab_start + word.shape[0])
        local = (flat - vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, word).masked_fill(outside.unsqueeze(-1), 0.0)
        if tp_group is not None:
            out = reduce_from_tp(out, tp_group)
    if position is not None:
        b, s = ids.shape
        out = (out.view(b, s, -1) + position[:s].unsqueeze(0)).view(b * s, -1)
    return out


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over logits split by vocabulary across `group` (see module docstring)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, vocab_start: int,
                group: Any) -> torch.Tensor:
        local_max = logits.max(dim=-1).values
        shifted = logits - local_max.unsqueeze(-1)
        exp = shifted.exp()
        local_sum = exp.sum(dim=-1)
        v_local = logits.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_start + v_local)
        idx = (target - vocab_start).masked_fill(outside, 0)
        picked = shifted.gather(-1, idx.unsqueeze(-1)).squeeze(-1) + local_max
        picked = picked.masked_fill(outside, 0.0)
        if group is None:
            global_max, total = local_max, local_sum
            target_logit = picked
        else:
            stats = torch.stack((local_max, local_sum, picked))
            world = dist.get_world_size(group)
            gathered = [torch.empty_like(stats) for _ in range(world)]
            with op_clock.comm():
                dist.all_gather(gathered, stats, group=group)
            every = torch.stack(gathered)  # [tp, 3, tokens]
            global_max = every[:, 0].max(dim=0).values
            total = (every[:, 1] * (every[:, 0] - global_max).exp()).sum(dim=0)
            target_logit = every[:, 2].sum(dim=0)
        lse = global_max + total.log()
        # softmax of the local slice, for the backward: exp(x - M) / S with global M and S
        exp.mul_((local_max - global_max).exp().unsqueeze(-1) / total.unsqueeze(-1))
        ctx.save_for_backward(exp, idx, outside)
        return (lse - target_logit).mean()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        softmax, idx, outside = ctx.saved_tensors
        g = softmax.clone()
        rows = torch.arange(g.shape[0], device=g.device)
        g[rows, idx] -= (~outside).to(g.dtype)
        g.mul_(grad / g.shape[0])
        return g, None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int = 0,
                  tp_group: Any = None) -> torch.Tensor:
    """Mean token cross entropy of [tokens, V_local] logits: kind ``cross_entropy``."""
    return _VocabParallelCrossEntropy.apply(logits, target.reshape(-1), vocab_start, tp_group)
