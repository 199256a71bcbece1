"""Ops: the smallest unit of work in a model graph, with its costs and sharding options.

An `Op` records everything the simulator and the planners need about one kernel of one
micro-batch: forward and backward FLOPs, bytes read and written, parameters, the activation
bytes it saves for its backward pass, and the ways it may be sharded under tensor (and
sequence/expert) parallelism with the collective each way needs.

Conventions (all numbers are for the whole, unsharded op of one micro-batch):

* GEMM FLOPs are 2·m·n·k; the backward of a GEMM is two GEMMs of the same size (input and weight
  gradients), hence 2x the forward (Narayanan et al. 2021, §5.1). Non-GEMM ops count a small
  number of FLOPs per element, read from ``data/op_flops.yaml``; their backward is
  ``backward_factor`` x forward.
* Activation bytes follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", §4.1: every op saves the inputs its backward needs (fp16: 2 bytes per
  element; dropout masks 1 byte per element).
* `CommNeed.size_bytes` is the size of the full (unsharded) tensor the collective acts on; the
  collective cost model turns it into per-rank traffic (a ring all-reduce moves 2(n-1)/n of it).
* `Op.sharded(tp, sp)` returns the per-GPU op of Megatron-LM's default sharding (Shoeybi et al.
  2019; with sequence parallelism, Korthikanti et al. 2022 §4.2.2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from importlib import resources

import yaml

PHASES = ("fwd", "bwd")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SHARDING_NAMES = ("replicate", "column", "row", "heads", "sequence", "expert")
OP_KINDS = frozenset(
    {
        "matmul", "attention_score", "attention_context", "softmax", "layernorm", "rmsnorm",
        "gelu", "swiglu", "dropout", "elementwise", "embedding", "cross_entropy", "conv2d",
        "batchnorm", "pool", "router", "flash_attention",
    }
)
MATMUL_KINDS = frozenset({"matmul", "attention_score", "attention_context", "conv2d", "router",
                          "flash_attention"})
"""Op kinds whose FLOPs are GEMMs (or convolutions); Megatron's model-FLOPs count only these.
``flash_attention`` is the fused attention core (FlashAttention-2 / PyTorch SDPA): its FLOPs
are the two attention GEMMs QKᵀ and PV (transformer_block.flash_attention_op)."""

RECOMPUTE_POLICIES = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True, slots=True)
class CommNeed:
    """A collective an op needs when it is sharded."""

    phase: str
    """"fwd" or "bwd": the pass in which the collective runs."""
    collective: str
    """"all_reduce", "all_gather", "reduce_scatter" or "all_to_all"."""
    size_bytes: float
    """Size of the full (unsharded) tensor the collective acts on."""
    group_size: int = 0
    """Ranks of the collective's groups: 0 = the stage's tensor-parallel group (Megatron's
    one degree per stage); t >= 1 = groups of t consecutive ranks of the stage (tp innermost),
    as when ops of one stage have their own degrees (Aceso; workloads/op_parallel.py)."""

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"CommNeed.phase={self.phase!r} is not one of {PHASES}")
        if self.collective not in COLLECTIVES:
            raise ValueError(f"CommNeed.collective={self.collective!r} is not one of {COLLECTIVES}")
        if self.size_bytes < 0:
            raise ValueError(f"CommNeed.size_bytes={self.size_bytes} is negative")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) \
                or self.group_size < 0:
            raise ValueError(f"CommNeed.group_size={self.group_size!r} must be an integer >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class Sharding:
    """One way to split an op over a tensor-parallel (or expert-parallel) group.

    What a sharding divides by the degree: FLOPs and bytes for every name but "replicate";
    parameters for "column", "row", "heads" and "expert"; the output for "column", "heads",
    "sequence" and sequence-parallel "row"; the saved activations when `splits_activations`.
    """

    name: str
    """"replicate", "column", "row", "heads", "sequence" or "expert"."""
    comm: tuple[CommNeed, ...] = ()
    """Collectives this sharding needs (only when the degree is > 1)."""
    splits_activations: bool = False
    """Whether the activation bytes this op saves are divided among the ranks."""
    sequence_parallel: bool = False
    """Whether this is the sequence-parallel variant (Korthikanti et al. 2022 §4.2.2)."""
    split_dim: int | None = None
    """Which dimension of `Op.shape` the sharding divides (None: the shape is kept)."""

    def __post_init__(self) -> None:
        if self.name not in SHARDING_NAMES:
            raise ValueError(f"Sharding.name={self.name!r} is not one of {SHARDING_NAMES}")


REPLICATE = Sharding(name="replicate")


@dataclass(frozen=True, kw_only=True, slots=True)
class Op:
    """One kernel of one micro-batch, with its costs and its sharding options."""

    name: str
    """Unique within its layer, e.g. "attn.qkv"."""
    kind: str
    """One of `OP_KINDS`; the cost model picks its efficiency curve by kind."""
    fwd_flops: float
    """Forward FLOPs of the whole op."""
    bwd_flops: float
    """Backward FLOPs (input and weight gradients)."""
    fwd_bytes: float
    """Bytes read plus written by the forward kernel."""
    bwd_bytes: float
    """Bytes read plus written by the backward kernels."""
    params: int
    """Trainable parameters owned by this op."""
    replicated_params: int = 0
    """Of `params`, those every tensor-parallel rank keeps whole whatever the sharding:
    Megatron-LM's position and token-type embedding tables are plain ``torch.nn.Embedding``s
    beside the vocab-parallel word embedding (megatron/core/models/common/embeddings/
    language_model_embedding.py: "Position embedding (serial)"), so each rank holds, updates
    and data-parallel-reduces all of them (GPT-3 175B: 2048 x 12288 = 25.2 M parameters on
    the first stage's GPUs, not 3.1 M at tp 8)."""
    activation_bytes: float
    """Bytes saved in the forward pass for the backward pass (no recompute)."""
    output_bytes: float
    """Bytes of the op's output tensor."""
    selective_recompute: bool = False
    """Whether selective recompute (Korthikanti et al. 2022 §5) drops and recomputes this op."""
    selective_kept_bytes: float = 0.0
    """Of `activation_bytes`, the inputs from outside the recomputed region (Q, K, V) that stay
    in memory under selective recompute."""
    shardings: tuple[Sharding, ...] = (REPLICATE,)
    """Sharding options, Megatron-LM's default first (the sequence-parallel variant may follow)."""
    shape: tuple[int, ...] | None = None
    """Kernel shape for the cost model: matmul (m, n, k); batched matmul (batch, m, n, k);
    conv2d (N, C_in, H, W, C_out, kernel, stride); elementwise (elements,)."""
    fp8: bool = False
    """Whether FP8 training recipes run this GEMM in FP8 when the plan's dtype is "fp8": the
    linear layers of the blocks (torchao Float8Linear swaps every ``nn.Linear`` but the output
    layer; Transformer Engine's ``te.Linear`` likewise). The attention core, the LM head and
    every non-GEMM op stay in BF16 (op_work.op_pass_work)."""

    fp8_recipe: str = "dynamic"
    """How an FP8 linear layer's casts run (`workloads.op_work.fp8_cast_elements`): "dynamic"
    (torchao's tensorwise dynamic scaling) or "delayed" (Transformer Engine's delayed scaling,
    fused casts); set from `ModelSpec.fp8_recipe` when the graph is built."""
    fp8_input_fused: bool = False
    """Under "delayed": the norm before this GEMM writes its FP8 input itself (Transformer
    Engine's LayerNormLinear), so no cast pass reads it."""

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise ValueError(f"Op {self.name!r}: kind={self.kind!r} is not one of {sorted(OP_KINDS)}")
        for name in ("fwd_flops", "bwd_flops", "fwd_bytes", "bwd_bytes", "params",
                     "activation_bytes", "output_bytes", "selective_kept_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"Op {self.name!r}: {name}={getattr(self, name)} is negative")
        if not 0 <= self.replicated_params <= self.params:
            raise ValueError(f"Op {self.name!r}: replicated_params={self.replicated_params} "
                             f"is not within 0..params ({self.params})")
        if self.selective_kept_bytes > self.activation_bytes:
            raise ValueError(f"Op {self.name!r}: selective_kept_bytes exceeds activation_bytes")
        if not self.shardings:
            raise ValueError(f"Op {self.name!r}: needs at least one sharding option")

    @property
    def model_bwd_flops(self) -> float:
        """Backward FLOPs a model-FLOPs count (MFU) includes: 2x forward for the fused
        attention core, whose `bwd_flops` (2.5x) also hold its in-kernel recompute of QKᵀ
        (Dao 2023 §4.1) -- rematerialisation, which MFU leaves out (Chowdhery et al. 2022,
        App. B); `bwd_flops` for every other op."""
        if self.kind == "flash_attention":
            return 2.0 * self.fwd_flops
        return self.bwd_flops

    @property
    def is_matmul(self) -> bool:
        """Whether the op is a GEMM/convolution (counted in Megatron's model FLOPs)."""
        return self.kind in MATMUL_KINDS

    def saved_bytes(self, recompute: str = "none") -> float:
        """Activation bytes this op keeps between forward and backward under `recompute`.

        "full" is a layer-level policy (see `Layer.activation_bytes`); here it reads as "none".
        """
        if recompute == "selective" and self.selective_recompute:
            return self.selective_kept_bytes
        return self.activation_bytes

    def sharding_for(self, sp: bool = False) -> Sharding:
        """Megatron-LM's default sharding of this op, with or without sequence parallelism."""
        for option in self.shardings:
            if option.sequence_parallel == sp:
                return option
        return self.shardings[0]

    def sharded(self, tp: int = 1, sp: bool = False, ep: int = 1,
                sharding: Sharding | None = None) -> Op:
        """The per-GPU op under tensor-parallel degree `tp` (and expert-parallel degree `ep`).

        Args:
            tp: Tensor-parallel degree.
            sp: Sequence parallelism on (Korthikanti et al. 2022 §4.2.2).
            ep: Expert-parallel degree (divides expert parameters; the GPU processes the tokens
                routed to its experts from all `ep` ranks, so its FLOPs stay those of one
                rank's micro-batch, as in GShard).
            sharding: The option to apply; default `sharding_for(sp)`.

        Returns:
            An `Op` with per-GPU numbers whose only sharding is the one applied (its `comm` is
            empty where the degree is 1).
        """
        if tp < 1 or ep < 1:
            raise ValueError(f"Op.sharded: tp={tp} and ep={ep} must be >= 1")
        chosen = sharding if sharding is not None else self.sharding_for(sp)
        name = chosen.name
        if name == "expert":
            work = tp if sp else 1
            param_div, out_div, act_div = ep, work, work
            comm = chosen.comm if ep > 1 else ()
        else:
            work = 1 if name == "replicate" else tp
            param_div = tp if name in ("column", "row", "heads") else 1
            out_split = name in ("column", "heads", "sequence") or (
                name == "row" and chosen.sequence_parallel)
            out_div = tp if out_split else 1
            act_div = tp if chosen.splits_activations else 1
            comm = chosen.comm if tp > 1 else ()
        if work == 1 and param_div == 1 and out_div == 1 and act_div == 1:
            return replace(self, shardings=(replace(chosen, comm=comm),))
        shape = self.shape
        if shape is not None and chosen.split_dim is not None and work > 1:
            dims = list(shape)
            dims[chosen.split_dim] = max(1, dims[chosen.split_dim] // work)
            shape = tuple(dims)
        return replace(
            self,
            fwd_flops=self.fwd_flops / work,
            bwd_flops=self.bwd_flops / work,
            fwd_bytes=self.fwd_bytes / work,
            bwd_bytes=self.bwd_bytes / work,
            params=self.replicated_params
            + -(-(self.params - self.replicated_params) // param_div),
            activation_bytes=self.activation_bytes / act_div,
            selective_kept_bytes=self.selective_kept_bytes / act_div,
            output_bytes=self.output_bytes / out_div,
            shardings=(replace(chosen, comm=comm),),
            shape=shape,
        )

    def comm_needs(self, tp: int = 1, sp: bool = False, ep: int = 1) -> tuple[CommNeed, ...]:
        """Collectives of this op's default sharding at degrees `tp`/`ep`."""
        return self.sharded(tp, sp, ep).shardings[0].comm


# --- sharding options of Megatron-LM's tensor parallelism ------------------------------------

def column_shardings(input_bytes: float, split_dim: int | None = 1) -> tuple[Sharding, ...]:
    """Column-parallel GEMM (Shoeybi et al. 2019, Fig. 3 "f"): weight split along its output.

    Without SP the input is replicated and its gradient all-reduced in the backward pass; with SP
    the input is all-gathered in the forward pass and its gradient reduce-scattered in the
    backward (Korthikanti et al. 2022, Fig. 6), and the saved input is the sequence shard.
    The row-parallel option is listed too (Aceso's swapped partition).
    """
    return (
        Sharding(name="column", split_dim=split_dim,
                 comm=(CommNeed(phase="bwd", collective="all_reduce", size_bytes=input_bytes),)),
        Sharding(name="column", split_dim=split_dim, sequence_parallel=True, splits_activations=True,
                 comm=(CommNeed(phase="fwd", collective="all_gather", size_bytes=input_bytes),
                       CommNeed(phase="bwd", collective="reduce_scatter", size_bytes=input_bytes))),
    )


def row_shardings(output_bytes: float, split_dim: int | None = 2) -> tuple[Sharding, ...]:
    """Row-parallel GEMM (Shoeybi et al. 2019, Fig. 3 "g"): weight split along its input.

    Partial outputs are all-reduced in the forward pass; with SP they are reduce-scattered in the
    forward and the output gradient all-gathered in the backward (Korthikanti et al. 2022, Fig. 6).
    The input is already split, so the saved input is divided either way.
    """
    return (
        Sharding(name="row", split_dim=split_dim, splits_activations=True,
                 comm=(CommNeed(phase="fwd", collective="all_reduce", size_bytes=output_bytes),)),
        Sharding(name="row", split_dim=split_dim, sequence_parallel=True, splits_activations=True,
                 comm=(CommNeed(phase="fwd", collective="reduce_scatter", size_bytes=output_bytes),
                       CommNeed(phase="bwd", collective="all_gather", size_bytes=output_bytes))),
    )


def heads_shardings(split_dim: int = 0) -> tuple[Sharding, ...]:
    """Attention core split by heads: no communication, everything divided by the degree."""
    return (Sharding(name="heads", split_dim=split_dim, splits_activations=True),)


def follows_column(split_dim: int = -1) -> tuple[Sharding, ...]:
    """Elementwise op between a column- and a row-parallel GEMM (GeLU): split, no communication."""
    return (Sharding(name="column", split_dim=split_dim, splits_activations=True),)


def replicated(split_dim: int = 0) -> tuple[Sharding, ...]:
    """Layernorm/dropout: replicated under TP; split along the sequence under SP."""
    return (
        REPLICATE,
        Sharding(name="sequence", split_dim=split_dim, sequence_parallel=True,
                 splits_activations=True),
    )


def expert_shardings(dispatch_bytes: float) -> tuple[Sharding, ...]:
    """Expert parallelism (GShard, Lepikhin et al. 2021 §2.2): all-to-all in both passes."""
    return (
        Sharding(name="expert", splits_activations=True,
                 comm=(CommNeed(phase="fwd", collective="all_to_all", size_bytes=dispatch_bytes),
                       CommNeed(phase="bwd", collective="all_to_all", size_bytes=dispatch_bytes))),
    )


# --- op constructors ----------------------------------------------------------------------------

@functools.cache
def _op_flops_table() -> tuple[float, dict[str, float]]:
    """Per-element FLOPs of non-GEMM kinds and the backward factor, from data/op_flops.yaml."""
    text = resources.files("trainsim.workloads").joinpath("data/op_flops.yaml").read_text()
    data = yaml.safe_load(text)
    return float(data["backward_factor"]), {k: float(v) for k, v in
                                            data["flops_per_element"].items()}


def backward_factor() -> float:
    """Backward FLOPs of a non-GEMM op as a multiple of its forward FLOPs."""
    return _op_flops_table()[0]


def flops_per_element(key: str) -> float:
    """Forward FLOPs per element of a non-GEMM op (data/op_flops.yaml)."""
    return _op_flops_table()[1][key]


def matmul_op(name: str, *, m: int, n: int, k: int, dtype_bytes: int, bias: bool,
              shardings: tuple[Sharding, ...], activation_bytes: float | None = None,
              params: int | None = None, kind: str = "matmul", fp8: bool | None = None) -> Op:
    """A GEMM [m, k] x [k, n]: 2mnk forward FLOPs, 2x that backward; saves its input.

    `fp8` (default: True for kind "matmul") marks a linear layer that FP8 recipes run in FP8.
    """
    fwd_flops = 2.0 * m * n * k
    fwd_bytes = dtype_bytes * (m * k + k * n + m * n)
    return Op(
        name=name, kind=kind, fwd_flops=fwd_flops, bwd_flops=2.0 * fwd_flops,
        fwd_bytes=fwd_bytes, bwd_bytes=2.0 * fwd_bytes,
        params=(k * n + (n if bias else 0)) if params is None else params,
        activation_bytes=dtype_bytes * m * k if activation_bytes is None else activation_bytes,
        output_bytes=dtype_bytes * m * n, shardings=shardings, shape=(m, n, k),
        fp8=(kind == "matmul") if fp8 is None else fp8,
    )


def elementwise_op(name: str, *, kind: str, elements: float, dtype_bytes: int,
                   flops_key: str | None = None, inputs: int = 1, params: int = 0,
                   replicated_params: int = 0,
                   activation_bytes: float = 0.0, output_bytes: float | None = None,
                   shardings: tuple[Sharding, ...] = (REPLICATE,),
                   selective_recompute: bool = False) -> Op:
    """A memory-bound op over `elements` elements of each of `inputs` inputs.

    Bytes: the forward reads its inputs and writes one output; the backward reads the output
    gradient and the saved inputs and writes the input gradients.
    """
    fwd_flops = flops_per_element(flops_key or kind) * elements
    return Op(
        name=name, kind=kind, fwd_flops=fwd_flops, bwd_flops=backward_factor() * fwd_flops,
        fwd_bytes=dtype_bytes * elements * (inputs + 1),
        bwd_bytes=dtype_bytes * elements * (2 * inputs + 1),
        params=params, replicated_params=replicated_params, activation_bytes=activation_bytes,
        output_bytes=dtype_bytes * elements if output_bytes is None else output_bytes,
        selective_recompute=selective_recompute, shardings=shardings, shape=(int(elements),),
    )


def ops_total(ops: tuple[Op, ...], attr: str) -> float:
    """Sum of one numeric attribute over `ops`."""
    return float(sum(getattr(op, attr) for op in ops))


__all__ = [
    "COLLECTIVES", "MATMUL_KINDS", "OP_KINDS", "PHASES", "RECOMPUTE_POLICIES", "REPLICATE",
    "SHARDING_NAMES", "CommNeed", "Op", "Sharding", "backward_factor", "column_shardings",
    "elementwise_op", "expert_shardings", "flops_per_element", "follows_column",
    "heads_shardings", "matmul_op", "ops_total", "replicated", "row_shardings",
]
