"""Small GPT and T5 in torch that run exactly the ops of the zoo graph (same kinds, same shapes).

A `StageModel` is one pipeline stage of a zoo `ModelSpec` (embedding, some blocks, head) at a
tensor-parallel degree: column-parallel QKV and FC1, row-parallel projection and FC2 (Shoeybi
et al. 2019, §3), vocab-parallel embedding, LM head and cross entropy, heads split over the
tensor-parallel ranks. Every zoo op is one call into validate/torch_ops.py, the same code
`sim profile` times. Activations travel as [tokens, hidden] matrices, so the only work outside
the zoo ops is the head split/merge copies around the attention core (framework overhead the
comparison reports as such).

With a pipeline, a stage holding the head keeps its own copy of the (tied) word embedding,
updated by its own optimizer; validate/torch_parallel.py all-reduces the two copies' gradients
after the data-parallel reduction, as Megatron-LM does and the lowering models
(gradient_sync.py `tied_sync`). T5 (encoder-decoder) runs as
one stage only (data parallelism).

Per-op events: while `profiling(True)` is on, each zoo op runs inside a
``torch.profiler.record_function("op:<kind>:<name>")`` range, so a Kineto trace can be folded
back to zoo op kinds; it is off for the timed iterations (record_function costs microseconds).
While an `OpClock` runs instead (validate/op_clock.py), each op's forward is timed by a clock
read at each end, no profiler: `sim trace` reads its per-kind breakdown so, and `sim profile`
times the ops inside a whole model so.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from trainsim.validate import op_clock
from trainsim.validate import torch_ops as ops
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.plan import uniform_split

_PROFILING = [False]
_SYNC: list[Any] = [None]
"""The CUDA device to synchronize at each op range's ends while profiling (None on CPU)."""
INIT_STD = 0.02
"""Std of the normal initialisation of weights (GPT-2's; only the values' scale matters)."""


def profiling(on: bool, device: Any = None) -> None:
    """Turn per-op record_function ranges on or off (see module docstring); on a CUDA
    `device` each range synchronizes at both ends, so its host-side span covers the op's
    kernels (the profiled iteration only; the timed iterations run unsynchronized)."""
    _PROFILING[0] = on
    _SYNC[0] = device if on and getattr(device, "type", "cpu") == "cuda" else None


@contextlib.contextmanager
def _synced_range(label: str, device: Any) -> Iterator[None]:
    torch.cuda.synchronize(device)
    with torch.profiler.record_function(label):
        yield
        torch.cuda.synchronize(device)


def op_range(kind: str, name: str) -> contextlib.AbstractContextManager[Any]:
    """A record_function range "op:<kind>:<name>" while profiling, a timed forward while an
    `OpClock` runs, else a no-op."""
    clock = op_clock.current()
    if clock is not None:  # a whole pipeline instruction ("action") holds ops: not timed
        return contextlib.nullcontext() if kind == "action" else op_clock.timed_op(kind, clock)
    if _PROFILING[0]:
        if _SYNC[0] is not None:
            return _synced_range(f"op:{kind}:{name}", _SYNC[0])
        return torch.profiler.record_function(f"op:{kind}:{name}")
    return contextlib.nullcontext()


def _param(gen: torch.Generator, *shape: int, fill: float | None = None) -> nn.Parameter:
    if fill is not None:
        return nn.Parameter(torch.full(shape, fill))
    return nn.Parameter(torch.randn(*shape, generator=gen) * INIT_STD)


class Attention(nn.Module):
    """Self attention (or cross attention over an encoder output) of one block."""

    def __init__(self, spec: ModelSpec, tp: int, tp_rank: int, gen: torch.Generator,
                 *, prefix: str, causal: bool, cross: bool) -> None:
        """Build the tp-local weights (heads split over `tp`)."""
        super().__init__()
        h, d = spec.hidden, int(spec.head_dim or 0)
        self.heads = spec.num_heads // tp
        self.d, self.prefix, self.causal, self.cross = d, prefix, causal, cross
        width = self.heads * d
        if cross:
            self.wq = _param(gen, width, h)
            self.bq = _param(gen, width, fill=0.0)
            self.wkv = _param(gen, 2 * width, h)
            self.bkv = _param(gen, 2 * width, fill=0.0)
        else:
            self.wqkv = _param(gen, 3 * width, h)
            self.bqkv = _param(gen, 3 * width, fill=0.0)
        self.wproj = _param(gen, h, width)
        # Row-parallel bias: added once, by tp rank 0, before the sum over the group.
        self.bproj = _param(gen, h, fill=0.0) if tp_rank == 0 else None
        self._masks: dict[tuple[int, int], torch.Tensor] = {}

    def _split(self, x: torch.Tensor, b: int, s: int, parts: int) -> torch.Tensor:
        return x.view(b, s, parts, self.heads, self.d).permute(2, 0, 3, 1, 4).reshape(
            parts, b * self.heads, s, self.d)

    def forward(self, x: torch.Tensor, b: int, s: int, group: Any,
                memory: torch.Tensor | None = None, s_kv: int | None = None) -> torch.Tensor:
        """x: [b·s, h] (normed); memory: encoder output [b·s_kv, h] for cross attention."""
        p = self.prefix
        x = ops.copy_to_tp(x, group)
        if self.cross:
            assert memory is not None and s_kv is not None
            memory = ops.copy_to_tp(memory, group)
            with op_range("matmul", f"{p}.q"):
                q = ops.matmul(x, self.wq, self.bq)
            with op_range("matmul", f"{p}.kv"):
                kv = ops.matmul(memory, self.wkv, self.bkv)
            q = self._split(q, b, s, 1)[0]
            k, v = self._split(kv, b, s_kv, 2)
        else:
            s_kv = s
            with op_range("matmul", f"{p}.qkv"):
                qkv = ops.matmul(x, self.wqkv, self.bqkv)
            q, k, v = self._split(qkv, b, s, 3)
        with op_range("attention_score", f"{p}.score"):
            scores = ops.attention_score(q, k)
        mask = self._masks.get((s, s_kv))
        if mask is None:
            mask = self._masks[(s, s_kv)] = ops.attention_mask(s, s_kv, self.causal,
                                                               scores.device)
        with op_range("softmax", f"{p}.softmax"):
            probs = ops.scale_mask_softmax(scores, mask, 1.0 / math.sqrt(self.d))
        with op_range("attention_context", f"{p}.context"):
            ctx = ops.attention_context(probs, v)
        ctx = ctx.view(b, self.heads, s, self.d).permute(0, 2, 1, 3).reshape(b * s, -1)
        with op_range("matmul", f"{p}.proj"):
            out = ops.matmul(ctx, self.wproj, self.bproj)
        return ops.reduce_from_tp(out, group)


class Block(nn.Module):
    """A pre-norm transformer block (transformer_block.transformer_block)."""

    def __init__(self, spec: ModelSpec, tp: int, tp_rank: int, gen: torch.Generator,
                 *, causal: bool, cross: bool) -> None:
        """Norms, self attention, optional cross attention, MLP (tp-local weights)."""
        super().__init__()
        h, f = spec.hidden, int(spec.ffn_hidden or 0) // tp
        self.ln1_w, self.ln1_b = _param(gen, h, fill=1.0), _param(gen, h, fill=0.0)
        self.attn = Attention(spec, tp, tp_rank, gen, prefix="attn", causal=causal, cross=False)
        self.cross = None
        if cross:
            self.lnc_w, self.lnc_b = _param(gen, h, fill=1.0), _param(gen, h, fill=0.0)
            self.cross = Attention(spec, tp, tp_rank, gen, prefix="cross", causal=False,
                                   cross=True)
        self.ln2_w, self.ln2_b = _param(gen, h, fill=1.0), _param(gen, h, fill=0.0)
        self.w1, self.b1 = _param(gen, f, h), _param(gen, f, fill=0.0)
        self.w2 = _param(gen, h, f)
        self.b2 = _param(gen, h, fill=0.0) if tp_rank == 0 else None

    def forward(self, x: torch.Tensor, b: int, s: int, group: Any,
                memory: torch.Tensor | None = None, s_kv: int | None = None) -> torch.Tensor:
        """x: [b·s, h] → [b·s, h]."""
        with op_range("layernorm", "attn.norm"):
            y = ops.layernorm(x, self.ln1_w, self.ln1_b)
        y = self.attn(y, b, s, group)
        with op_range("elementwise", "attn.residual"):
            x = ops.residual_add(x, y)
        if self.cross is not None:
            with op_range("layernorm", "cross.norm"):
                y = ops.layernorm(x, self.lnc_w, self.lnc_b)
            y = self.cross(y, b, s, group, memory, s_kv)
            with op_range("elementwise", "cross.residual"):
                x = ops.residual_add(x, y)
        with op_range("layernorm", "mlp.norm"):
            y = ops.layernorm(x, self.ln2_w, self.ln2_b)
        y = ops.copy_to_tp(y, group)
        with op_range("matmul", "mlp.fc1"):
            y = ops.matmul(y, self.w1, self.b1)
        with op_range("gelu", "mlp.gelu"):
            y = ops.gelu(y)
        with op_range("matmul", "mlp.fc2"):
            y = ops.matmul(y, self.w2, self.b2)
        y = ops.reduce_from_tp(y, group)
        with op_range("elementwise", "mlp.residual"):
            return ops.residual_add(x, y)


class StageModel(nn.Module):
    """One pipeline stage of a GPT (or the whole of a T5) at tensor-parallel degree `tp`."""

    def __init__(self, spec: ModelSpec, *, blocks: int, has_embedding: bool, has_head: bool,
                 tp: int = 1, tp_rank: int = 0, seed: int = 0) -> None:
        """Build the stage's tp-local parameters deterministically from `seed` and `tp_rank`.

        Raises:
            ValueError: a family other than gpt/t5, or T5 split into stages.
        """
        super().__init__()
        if spec.family not in ("gpt", "t5"):
            raise ValueError(f"model {spec.name!r}: family {spec.family!r} has no torch "
                             f"validation model (gpt and t5 do)")
        self.spec, self.tp, self.tp_rank = spec, tp, tp_rank
        self.t5 = spec.family == "t5"
        if self.t5 and not (has_embedding and has_head):
            raise ValueError(f"model {spec.name!r}: T5 runs as one pipeline stage here")
        gen = torch.Generator().manual_seed(seed * 1000 + tp_rank)
        h, v_local = spec.hidden, spec.vocab_size // tp
        self.vocab_start = tp_rank * v_local
        self.has_embedding, self.has_head = has_embedding, has_head
        if has_embedding or has_head:
            self.wte = _param(gen, v_local, h)
        if has_embedding:
            self.wpe = _param(torch.Generator().manual_seed(seed), int(
                spec.max_position_embeddings or spec.seq_len), h)
        causal = not self.t5
        self.blocks = nn.ModuleList(
            Block(spec, tp, tp_rank, gen, causal=causal, cross=False) for _ in range(blocks))
        if self.t5:
            self.enc_w, self.enc_b = _param(gen, h, fill=1.0), _param(gen, h, fill=0.0)
            self.decoder = nn.ModuleList(
                Block(spec, tp, tp_rank, gen, causal=True, cross=True)
                for _ in range(spec.decoder_layers))
        if has_head:
            self.lnf_w, self.lnf_b = _param(gen, h, fill=1.0), _param(gen, h, fill=0.0)

    def _embed(self, ids: torch.Tensor, group: Any) -> torch.Tensor:
        with op_range("embedding", "embedding"):
            return ops.embedding(ids, self.wte, self.wpe, self.vocab_start, group)

    def forward(self, x: torch.Tensor, b: int, s: int, group: Any = None,
                targets: torch.Tensor | None = None,
                dec_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids [b, s] (first stage) or activations [b·s, h] → activations or the loss.

        For T5, `x` are encoder ids, `dec_ids` decoder ids and `targets` decoder targets.
        """
        if self.has_embedding:
            x = self._embed(x, group)
        for block in self.blocks:
            x = block(x, b, s, group)
        if self.t5:
            assert dec_ids is not None
            with op_range("layernorm", "encoder.final_norm"):
                memory = ops.layernorm(x, self.enc_w, self.enc_b)
            s_dec = dec_ids.shape[1]
            x = self._embed(dec_ids, group)
            for block in self.decoder:
                x = block(x, b, s_dec, group, memory, s)
        if not self.has_head:
            return x
        assert targets is not None
        with op_range("layernorm", "final_norm"):
            x = ops.layernorm(x, self.lnf_w, self.lnf_b)
        x = ops.copy_to_tp(x, group)
        with op_range("matmul", "lm_head"):
            logits = ops.matmul(x, self.wte, None)
        with op_range("cross_entropy", "cross_entropy"):
            return ops.cross_entropy(logits, targets, self.vocab_start, group)


def stage_blocks(num_layers: int, pp: int) -> list[int]:
    """Blocks per stage, first stages taking the remainder (ParallelPlan's uniform split)."""

    return list(uniform_split(num_layers, pp))


def build_stage(spec: ModelSpec, *, stage: int, pp: int, tp: int = 1, tp_rank: int = 0,
                seed: int = 0) -> StageModel:
    """The torch module of pipeline `stage` of `pp` (embedding on the first, head on the last)."""
    counts = stage_blocks(spec.num_layers, pp)
    return StageModel(spec, blocks=counts[stage], has_embedding=stage == 0,
                      has_head=stage == pp - 1, tp=tp, tp_rank=tp_rank, seed=seed)


def batch(spec: ModelSpec, b: int, seed: int, device: Any = None) -> dict[str, torch.Tensor]:
    """A random batch of token ids (and targets; decoder ids for T5), reproducible by seed
    (drawn on the CPU generator, then moved to `device`)."""
    gen = torch.Generator().manual_seed(seed)
    s = spec.seq_len
    out = {"ids": torch.randint(0, spec.vocab_size, (b, s), generator=gen)}
    s_out = spec.decoder_seq_len if spec.family == "t5" else s
    if spec.family == "t5":
        out["dec_ids"] = torch.randint(0, spec.vocab_size, (b, s_out), generator=gen)
    out["targets"] = torch.randint(0, spec.vocab_size, (b, s_out), generator=gen)
    return {k: v.to(device) for k, v in out.items()} if device is not None else out


def tensor_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Total bytes of `tensors` (numel × element size)."""
    return sum(t.numel() * t.element_size() for t in tensors)
