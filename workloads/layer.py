"""Layers: the ordered groups of ops a pipeline partitioner keeps together, and their totals.

A `Layer` (embedding, transformer block, head, ...) is what the family builders (gpt.py, t5.py,
...) emit and `model.ModelGraph` orders; `LayerCosts` sums its ops at a given parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainsim.workloads.ops import RECOMPUTE_POLICIES, CommNeed, Op

TOKEN_ID_BYTES = 8
"""Token ids are torch.long (int64) tensors."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerCosts:
    """Per-GPU totals of one layer at a given tensor/sequence/expert parallelism."""

    name: str
    kind: str
    fwd_flops: float
    bwd_flops: float
    matmul_fwd_flops: float
    """Forward FLOPs of the GEMM/convolution ops only."""
    selective_fwd_flops: float
    """Forward FLOPs that selective recompute runs again before the backward."""
    fwd_bytes: float
    bwd_bytes: float
    params: int
    activation_bytes: float
    """Saved activation bytes without recompute."""
    output_bytes: float
    """Bytes the layer hands to the next (pipeline send size)."""
    comm: tuple[CommNeed, ...]
    """Collectives of the layer's ops, in op order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Layer:
    """An ordered group of ops that a pipeline partitioner keeps together."""

    name: str
    """E.g. "embedding", "block", "encoder_block", "head"."""
    kind: str
    """"embedding", "transformer", "decoder", "moe_transformer", "norm", "head", "stem",
    "conv_block"."""
    ops: tuple[Op, ...]
    input_bytes: float = 0.0
    """Bytes of the layer's input (what full recompute keeps; Korthikanti et al. 2022 §5)."""
    output_bytes: float = 0.0
    """Bytes of the layer's output (sent to the next pipeline stage)."""
    side_input_bytes: float = 0.0
    """Extra input every instance needs, e.g. the encoder output for T5 cross attention."""
    recomputable: bool = False
    """Whether full recompute applies (transformer and conv blocks; not embedding or head)."""
    shared_params: int = 0
    """Parameters used here but counted in another layer (a tied LM head's embedding), which a
    pipeline stage holding this layer alone keeps a copy of."""
    selective_policy: str = "megatron"
    """What selective recompute drops here: "megatron" (each op's `selective_recompute` flag)
    or "op" (torchtitan's op-level policy, `op_sac`)."""
    gemm_splits: tuple[tuple[str, tuple[float, ...]], ...] = ()
    """For fused GEMM ops, the output shares of the separate matmuls a PyTorch model runs in
    their place, in call order (e.g. attn.qkv: q, k, v; a gated mlp.fc1: gate, up); `op_sac`
    counts them one by one."""
    sac_keeps_unread: bool = True
    """`ModelSpec.sac_keeps_unread`: under the "op" policy, keep the down projection's output
    too (eager), or not (compiled: the backward never reads it)."""
    backward_workspace_bytes: float = 0.0
    """Bytes the layer's backward holds beyond its saved activations (the loss's gradient
    buffers; `ModelSpec.loss_workspace_bytes`), before tensor-parallel sharding."""
    backward_workspace_tp_bytes: float = 0.0
    """The same where the loss is vocab-parallel (tp > 1) and the stack's parallel loss holds
    more (`ModelSpec.loss_workspace_tp_bytes`); 0: `backward_workspace_bytes`."""

    def backward_workspace(self, tp: int) -> float:
        """Per-GPU bytes the backward holds beyond the saved activations at tensor-parallel
        degree `tp` (the loss's buffers: vocab-parallel, so 1/tp of them)."""
        tp_bytes = self.backward_workspace_tp_bytes
        workspace = tp_bytes if tp > 1 and tp_bytes else self.backward_workspace_bytes
        return workspace / tp

    @property
    def params(self) -> int:
        """Parameters owned by the layer."""
        return sum(op.params for op in self.ops)

    def sharded_ops(self, tp: int = 1, sp: bool = False, ep: int = 1) -> tuple[Op, ...]:
        """Per-GPU ops under Megatron's default sharding at degree `tp` (see `Op.sharded`)."""
        return tuple(op.sharded(tp, sp, ep) for op in self.ops)

    def costs(self, tp: int = 1, sp: bool = False, ep: int = 1) -> LayerCosts:
        """Per-GPU totals of the layer at degrees `tp`/`ep` with or without SP."""
        ops = self.sharded_ops(tp, sp, ep)
        out_div = tp if (sp and tp > 1 and self.kind not in ("head",)) else 1
        shares = self.selective_shares(tp, sp)
        return LayerCosts(
            name=self.name, kind=self.kind,
            fwd_flops=sum(op.fwd_flops for op in ops),
            bwd_flops=sum(op.bwd_flops for op in ops),
            matmul_fwd_flops=sum(op.fwd_flops for op in ops if op.is_matmul),
            selective_fwd_flops=sum(shares.get(op.name, 0.0) * op.fwd_flops for op in ops),
            fwd_bytes=sum(op.fwd_bytes for op in ops),
            bwd_bytes=sum(op.bwd_bytes for op in ops),
            params=sum(op.params for op in ops),
            activation_bytes=sum(op.activation_bytes for op in ops),
            output_bytes=self.output_bytes / out_div,
            comm=tuple(c for op in ops for c in op.shardings[0].comm),
        )

    def activation_bytes(self, tp: int = 1, sp: bool = False, recompute: str = "none",
                         ops: tuple[Op, ...] | None = None) -> float:
        """Activation bytes one micro-batch keeps in this layer from forward to backward
        (`ops`: `sharded_ops(tp, sp)` where the caller has them already).

        Korthikanti et al. 2022: with no recompute the sum of the ops' saved tensors (per GPT
        block s·b·h·(34 + 5as/h), Table 2); "selective" drops the attention-core tensors but
        keeps Q, K, V (34·s·b·h, /t with TP+SP); "full" keeps only the layer input (2·s·b·h,
        /t with SP) for recomputable layers.
        """
        if recompute not in RECOMPUTE_POLICIES:
            raise ValueError(f"recompute={recompute!r} is not one of {RECOMPUTE_POLICIES}")
        if recompute == "full" and self.recomputable:
            return self.input_bytes / (tp if sp else 1)
        if recompute == "selective" and self.selective_policy == "op":
            return self.op_sac(tp, sp)[0]
        policy = "selective" if recompute == "selective" else "none"
        return float(sum(op.saved_bytes(policy)
                         for op in (self.sharded_ops(tp, sp) if ops is None else ops)))

    def recompute_fwd_flops(self, recompute: str = "none", tp: int = 1, sp: bool = False) -> float:
        """Forward FLOPs run again before the backward pass under `recompute`."""
        ops = self.sharded_ops(tp, sp)
        if recompute == "full" and self.recomputable:
            return sum(op.fwd_flops for op in ops)
        if recompute == "selective":
            share = self.selective_shares(tp, sp)
            return sum(share.get(op.name, 0.0) * op.fwd_flops for op in ops)
        return 0.0

    def selective_shares(self, tp: int = 1, sp: bool = False) -> dict[str, float]:
        """Share of each op's forward that selective recompute runs again (1 or absent under
        Megatron's policy; GEMMs fused here but separate in PyTorch may be partly re-run
        under the op-level one)."""
        if self.selective_policy == "op":
            return self.op_sac(tp, sp)[1]
        return {op.name: 1.0 for op in self.ops if op.selective_recompute}

    def op_sac(self, tp: int = 1, sp: bool = False) -> tuple[float, dict[str, float]]:
        """Saved bytes and recomputed forward shares under torchtitan's op-level selective
        activation checkpointing (torchtitan activation_checkpoint.py `_custom_policy`).

        The checkpointed block keeps its input; of the ops inside it keeps the outputs of the
        matmuls -- but every second one, counted in call order per block -- and of the
        attention kernel (its output and logsumexp); everything else (norms, rotary, the
        activation, residual adds) and the skipped matmuls run again before the backward.
        Without `sac_keeps_unread` (a compiled block) the down projection's output, which only
        the residual add reads, is neither kept nor recomputed (the call still counts).
        """
        kept = self.input_bytes / (tp if sp else 1)
        shares: dict[str, float] = {}
        count = 0
        splits = dict(self.gemm_splits)
        for op in self.sharded_ops(tp, sp):
            if op.kind == "flash_attention":
                kept += op.output_bytes + op.activation_bytes - op.selective_kept_bytes
            elif op.kind == "matmul":
                redo = 0.0
                unread = not self.sac_keeps_unread and op.name.endswith("mlp.fc2")
                if unread:  # neither kept nor recomputed: no backward reads it
                    count += len(splits.get(op.name, (1.0,)))
                    continue
                for part in splits.get(op.name, (1.0,)):
                    count += 1
                    if count % 2:
                        kept += part * op.output_bytes
                    else:
                        redo += part
                if redo:
                    shares[op.name] = redo
            elif op.fwd_flops > 0 or op.fwd_bytes > 0:
                shares[op.name] = 1.0
        return kept, shares
