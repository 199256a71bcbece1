"""Model specifications and their op-level graphs.

A `ModelSpec` is the shape of a model (what a paper's table or a Hugging Face `config.json`
says). `build_graph(spec, micro_batch_size, seq_len)` turns it into a `ModelGraph`: an ordered
tuple of `Layer`s (embedding, blocks, head — the units a pipeline partitioner splits by), each a
tuple of `Op`s with their per-micro-batch costs. Identical blocks are one immutable `Layer`
object repeated, so a 96-layer GPT-3 175B builds in about a millisecond.

`Layer` lives in layer.py and each family's builder in its own module (gpt.py, t5.py, ...); the
builders need `ModelSpec` only as a type, so they import layer.py and this module imports them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, fields

from trainsim.workloads.bert import build_bert
from trainsim.workloads.gpt import build_gpt
from trainsim.workloads.layer import TOKEN_ID_BYTES, Layer, LayerCosts
from trainsim.workloads.llama import build_llama
from trainsim.workloads.moe import build_moe
from trainsim.workloads.ops import RECOMPUTE_POLICIES, Op
from trainsim.workloads.t5 import build_t5
from trainsim.workloads.wide_resnet import build_wide_resnet

FAMILIES = ("gpt", "llama", "t5", "bert", "moe", "wresnet")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "relu", "swiglu", "geglu")
POSITION_EMBEDDINGS = ("learned", "rotary", "relative", "none")
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "tf32": 4, "fp8": 2}
"""Bytes per saved activation element by training precision. tf32 keeps fp32 storage (TF32 is
a tensor-core math mode on fp32 tensors); fp8 runs the linear layers' GEMMs in FP8 but keeps
activations in BF16 (torchao's Float8Linear saves its high-precision input for the backward,
``matmul_with_hp_or_float8_args.forward``), hence 2."""
ATTENTION_KERNELS = ("flash", "eager")
"""How the attention core runs: "flash", one fused kernel that keeps no s×s tensor
(FlashAttention-2, Dao 2023; PyTorch SDPA's flash / memory-efficient backends), or "eager",
separate QKᵀ, softmax, dropout and PV kernels whose s×s outputs are saved (Korthikanti et al.
2022). Every modern stack defaults to flash (workloads/data/frameworks.yaml)."""
FP8_RECIPES = ("dynamic", "delayed")
"""FP8 scaling recipes: torchao's dynamic tensorwise scaling, Transformer Engine's delayed one."""
SELECTIVE_POLICIES = ("megatron", "op")
"""What selective recompute drops: Megatron-LM's attention core, or torchtitan's op-level
policy (`workloads.layer.Layer.op_sac`)."""
GRAD_BUFFERS = ("param", "reduce")
"""Where a stack keeps the gradients (`ModelSpec.grad_buffer`): in the training dtype's bytes
("param") or in the reduction's dtype (`GRAD_REDUCE_DTYPES`; "reduce")."""
GRAD_REDUCE_DTYPES = ("param", "fp32", "fp32-for-bf16")
"""What the data-parallel gradient reduction carries per gradient (`ModelSpec.grad_reduce_dtype`):
the training dtype's gradient ("param"), fp32 whatever the dtype ("fp32"), or fp32 when
training in bf16 (or fp8, whose other layers are bf16) and the training dtype's otherwise
("fp32-for-bf16")."""


MAX_LAYERS = 100_000
"""Most layers (or decoder layers, or Wide-ResNet blocks) a model may have: about 800× the
deepest published transformer (Llama 3.1 405B: 126) and 100× Aceso's 1,000-layer stress test.
Lowering is linear in layers (`sim simulate` of a 100,000-layer GPT took 2.4 s to refuse on --max-tasks,
a 1,000,000-layer one 18 s); at 100,000,000 it ran out of time and memory before any check."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """The shape of a model. Transformer fields are unused (0) for Wide-ResNet and vice versa."""

    name: str
    """Zoo name (lower case) or the user file's name."""
    family: str
    """One of "gpt", "llama", "t5", "bert", "moe", "wresnet"."""
    num_layers: int = 0
    """Transformer blocks (the encoder's for T5); bottleneck blocks for Wide-ResNet (derived)."""
    hidden: int = 0
    """Model width d_model; for Wide-ResNet the base channel count of the first stage."""
    num_heads: int = 0
    """Attention (query) heads."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); default `num_heads`."""
    head_dim: int | None = None
    """Per-head width (T5's d_kv, Megatron's kv_channels); default hidden // num_heads."""
    ffn_hidden: int | None = None
    """MLP inner width; default 4 * hidden."""
    vocab_size: int = 0
    """Vocabulary size (rows of the word embedding)."""
    seq_len: int = 0
    """Default training sequence length (the encoder's for T5)."""
    max_position_embeddings: int | None = None
    """Rows of a learned position embedding; default `seq_len`."""
    norm: str = "layernorm"
    """"layernorm" (weight and bias) or "rmsnorm" (weight only)."""
    activation: str = "gelu"
    """MLP activation: "gelu", "relu", "swiglu" or "geglu" (gated: two input projections)."""
    bias: bool = True
    """Whether linear layers carry biases."""
    dropout: bool = True
    """Whether the model trains with dropout (masks are saved activations)."""
    position_embedding: str = "learned"
    """"learned" (absolute), "rotary", "relative" (T5 buckets) or "none"."""
    tied_embeddings: bool = True
    """Whether the LM head reuses the word embedding matrix."""
    dtype: str = "fp16"
    """Training precision of activations: "fp16", "bf16", "fp32", "tf32" or "fp8" (bytes per
    saved element: `DTYPE_BYTES`)."""
    attention: str = "flash"
    """Attention kernel: "flash" (fused, no s² activations) or "eager" (`ATTENTION_KERNELS`);
    a framework profile (workloads/framework.py) sets it."""
    context_parallel: int = 1
    """Context-parallel degree the graph is built for: with c > 1 the graph is one rank's
    share -- every op runs on seq/c tokens, while self attention reads the keys and values of
    the whole sequence (ring attention). Set by the lowering from `ParallelPlan.cp`, not by
    model files."""
    selective_policy: str = "megatron"
    """What `recompute="selective"` drops (`SELECTIVE_POLICIES`): "megatron", the attention
    core only (Korthikanti et al. 2022 §5), or "op", torchtitan's op-level selective
    checkpointing (every GEMM and attention output saved but every second GEMM's; the rest
    recomputed). A framework profile (workloads/framework.py) sets it."""
    sac_keeps_unread: bool = True
    """Under the "op" selective policy: whether every saved op's output is kept, read by the
    backward or not (eager PyTorch's checkpoint caches them all), or only those the backward
    reads (a compiled graph: the MLP's down projection, which feeds only the residual add, is
    not kept). A framework profile sets it."""
    loss_workspace_bytes: float = 0.0
    """Bytes per logit the loss's backward holds beyond the saved fp32 logits (the stack's
    cross-entropy implementation; workloads/data/frameworks.yaml). 0: not modelled."""
    loss_workspace_tp_bytes: float = 0.0
    """`loss_workspace_bytes` where the loss is vocab-parallel over tp > 1 (PyTorch's loss
    parallel holds more in its backward than a fused kernel); 0: the same figure."""
    fsdp_copy_out_traffic: float = 0.0
    """Bytes read and written per gathered parameter byte by the copy FSDP2 runs on the
    compute stream after each all-gather (the flat gathered buffer split into the parameters'
    own tensors: 2, read once and written once; a framework profile sets it). 0: the stack's
    parameters view the gathered buffer (FSDP1, DeepSpeed ZeRO-3), or no copy is modelled."""
    grad_copy_traffic: float = 0.0
    """Bytes read and written per gradient byte by the copies a stack runs around the
    data-parallel gradient reduction: the gradients copied into a reduction buffer before it
    (the first 2: read once, written once) and the reduced result scaled and copied back after
    it (the rest), on streams of their own (lowering/gradient_sync.py). PyTorch DDP does so unless
    ``gradient_as_bucket_view=True``; the CPU validation harness flattens its gradients into
    one buffer (validate/torch_parallel.py, 6). 0: the gradients live in the buffer
    (Megatron's contiguous gradient buffer, DDP with bucket views), or no copy is modelled."""
    grad_reduce_dtype: str = "param"
    """What the data-parallel gradient reduction (and the tied embedding's all-reduce) carries
    per gradient (`GRAD_REDUCE_DTYPES`; `grad_reduce_bytes`): a framework profile sets it
    (Megatron-LM reduces bf16 runs' gradients in fp32, torchtitan's FSDP2 reduce-scatters in
    fp32). The gradients' memory follows `grad_buffer`."""
    grad_buffer: str = "param"
    """Whether the gradients' memory is in the training dtype's bytes ("param") or in the
    reduction's (`grad_reduce_dtype`; "reduce": Megatron-Core's gradient buffer, fp32 under
    bf16 with grad_reduce_in_fp32). A framework profile sets it (`GRAD_BUFFERS`)."""
    fp8_recipe: str = "dynamic"
    """How FP8 linear layers cast (`FP8_RECIPES`, `Op.fp8_recipe`): "dynamic" (torchao) or
    "delayed" (Transformer Engine); a framework profile sets it."""
    unfused_traffic: tuple[tuple[str, float], ...] = ()
    """Memory traffic of ops an eager stack runs as several kernels, relative to the one fused
    kernel the graph models: (op kind, or the last part of an op's name, factor). A framework
    profile sets it (`unfused_traffic` in workloads/data/frameworks.yaml)."""
    type_vocab_size: int = 0
    """BERT token-type embeddings (2 for BERT)."""
    pooler: bool = False
    """BERT: pooler and next-sentence head next to the MLM head."""
    decoder_layers: int = 0
    """T5: decoder blocks (with cross attention)."""
    decoder_seq_len: int = 0
    """T5: decoder sequence length."""
    relative_attention_num_buckets: int = 0
    """T5: relative position buckets (one bias table per stack)."""
    num_experts: int = 0
    """MoE: experts per MoE layer."""
    top_k: int = 1
    """MoE: experts each token is routed to."""
    capacity_factor: float = 1.0
    """MoE: expert capacity = capacity_factor * top_k * tokens / num_experts (GShard §2.2)."""
    moe_layer_interval: int = 1
    """MoE: every n-th block is an MoE block (2 = every other block)."""
    blocks: tuple[int, ...] = ()
    """Wide-ResNet: bottleneck blocks per stage, e.g. (3, 4, 6, 3)."""
    width_factor: int = 0
    """Wide-ResNet: widening of each block's 3x3 convolution."""
    image_size: int = 0
    """Wide-ResNet: input image height = width."""
    num_classes: int = 0
    """Wide-ResNet: classifier outputs."""
    in_channels: int = 3
    """Wide-ResNet: input image channels."""
    source: str = ""
    """Where the shape comes from (paper, table, config file)."""

    def __post_init__(self) -> None:
        def bad(field_name: str, why: str) -> ValueError:
            return ValueError(f"model {self.name!r}: {field_name}={getattr(self, field_name)!r} {why}")

        if self.family not in FAMILIES:
            raise bad("family", f"is not one of {', '.join(FAMILIES)}")
        if self.dtype not in DTYPE_BYTES:
            raise bad("dtype", f"is not one of {', '.join(DTYPE_BYTES)}")
        if self.attention not in ATTENTION_KERNELS:
            raise bad("attention", f"is not one of {', '.join(ATTENTION_KERNELS)}")
        if self.selective_policy not in SELECTIVE_POLICIES:
            raise bad("selective_policy", f"is not one of {', '.join(SELECTIVE_POLICIES)}")
        if not 0 <= self.loss_workspace_bytes < 64:
            raise bad("loss_workspace_bytes", "must be in [0, 64) bytes per logit")
        if not 0 <= self.loss_workspace_tp_bytes < 64:
            raise bad("loss_workspace_tp_bytes", "must be in [0, 64) bytes per logit")
        if not 0 <= self.fsdp_copy_out_traffic < 64:
            raise bad("fsdp_copy_out_traffic", "must be in [0, 64) bytes per gathered byte")
        if not 0 <= self.grad_copy_traffic < 64:
            raise bad("grad_copy_traffic", "must be in [0, 64) bytes per gradient byte")
        if not isinstance(self.sac_keeps_unread, bool):
            raise bad("sac_keeps_unread", "must be true or false")
        if self.grad_buffer not in GRAD_BUFFERS:
            raise bad("grad_buffer", f"is not one of {', '.join(GRAD_BUFFERS)}")
        if self.grad_reduce_dtype not in GRAD_REDUCE_DTYPES:
            raise bad("grad_reduce_dtype", f"is not one of {', '.join(GRAD_REDUCE_DTYPES)}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise bad("fp8_recipe", f"is not one of {', '.join(FP8_RECIPES)}")
        if any(not 1 <= k <= 64 for _, k in self.unfused_traffic):
            raise bad("unfused_traffic", "factors must be in [1, 64]")
        if not isinstance(self.context_parallel, int) or self.context_parallel < 1:
            raise bad("context_parallel", "must be an integer >= 1")
        if self.family == "wresnet":
            if not self.blocks or any(b < 1 for b in self.blocks):
                raise bad("blocks", "must list >= 1 block per stage")
            for name in ("hidden", "width_factor", "image_size", "num_classes", "in_channels"):
                if getattr(self, name) < 1:
                    raise bad(name, "must be >= 1")
            object.__setattr__(self, "num_layers", sum(self.blocks))
            if self.num_layers > MAX_LAYERS:
                raise bad("blocks", f"sum to over {MAX_LAYERS:,} blocks, the most trainsim builds")
            return
        for name in ("num_layers", "hidden", "num_heads", "vocab_size", "seq_len"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        for name in ("num_layers", "decoder_layers"):
            if getattr(self, name) > MAX_LAYERS:
                raise bad(name, f"is over {MAX_LAYERS:,}, the most trainsim builds")
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim is None:
            if self.hidden % self.num_heads:
                raise bad("num_heads", f"does not divide hidden={self.hidden}; give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.num_heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.max_position_embeddings is None:
            object.__setattr__(self, "max_position_embeddings", self.seq_len)
        kv_heads = int(self.num_kv_heads or 0)  # resolved above
        if kv_heads < 1 or self.num_heads % kv_heads:
            raise bad("num_kv_heads", f"must be >= 1 and divide num_heads={self.num_heads}")
        if self.norm not in NORMS:
            raise bad("norm", f"is not one of {', '.join(NORMS)}")
        if self.activation not in ACTIVATIONS:
            raise bad("activation", f"is not one of {', '.join(ACTIVATIONS)}")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise bad("position_embedding", f"is not one of {', '.join(POSITION_EMBEDDINGS)}")
        if self.family == "t5" and (self.decoder_layers < 1 or self.decoder_seq_len < 1):
            raise bad("decoder_layers", "and decoder_seq_len must be >= 1 for T5")
        if self.family == "moe":
            if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
                raise bad("num_experts", f"must be >= top_k={self.top_k} >= 1")
            if self.capacity_factor <= 0 or self.moe_layer_interval < 1:
                raise bad("capacity_factor", "must be > 0 (and moe_layer_interval >= 1)")

    @property
    def dtype_bytes(self) -> int:
        """Bytes per activation element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def num_blocks(self) -> int:
        """Transformer (or bottleneck) blocks of the whole model: encoder + decoder for T5."""
        return self.num_layers + self.decoder_layers

    @property
    def max_seq_len(self) -> int:
        """Longest sequence the model can embed: the learned position table's rows; 0 (no hard
        limit) for rotary/relative/no positions and for images."""
        if self.family == "wresnet" or self.position_embedding != "learned":
            return 0
        return int(self.max_position_embeddings or 0)

    def parameters(self) -> int:
        """Trainable parameters (counted from the op graph; tied weights once)."""
        return _parameters(self)

    def op_names(self) -> list[str]:
        """Names of the ops in the model's layers, in first-seen order (per-op recompute keys)."""
        return list(_op_names(self))

    def to_dict(self) -> dict[str, object]:
        """Fields with non-default values, in declaration order (the models.yaml schema)."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "family", "source") or value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@functools.lru_cache(maxsize=256)
def _parameters(spec: ModelSpec) -> int:
    return build_graph(spec, micro_batch_size=1, seq_len=None).parameters


@functools.lru_cache(maxsize=256)
def _op_names(spec: ModelSpec) -> tuple[str, ...]:
    names: dict[str, None] = {}
    for layer in build_graph(spec, micro_batch_size=1, seq_len=None).layers:
        for op in layer.ops:
            names.setdefault(op.name)
    return tuple(names)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelGraph:
    """A model's ordered layers for one micro-batch of `micro_batch_size` × `seq_len` tokens."""

    spec: ModelSpec
    micro_batch_size: int
    seq_len: int
    """Sequence length of this graph (the encoder's for T5; 1 for images)."""
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or self.seq_len < 1:
            raise ValueError(f"micro_batch_size={self.micro_batch_size} and "
                             f"seq_len={self.seq_len} must be >= 1")

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch, micro_batch_size × seq_len: encoder tokens for T5, images for
        Wide-ResNet. The per-token figures below divide by this."""
        return self.micro_batch_size * self.seq_len

    @property
    def parameters(self) -> int:
        """Trainable parameters of the whole model."""
        cache: dict[int, int] = {}
        total = 0
        for layer in self.layers:
            key = id(layer)
            if key not in cache:
                cache[key] = layer.params
            total += cache[key]
        return total

    def _sum(self, fn: Callable[[Layer], float]) -> float:
        """Sum `fn` over the layers, evaluating it once per distinct Layer object."""
        cache: dict[int, float] = {}
        total = 0.0
        for layer in self.layers:
            key = id(layer)
            if key not in cache:
                cache[key] = fn(layer)
            total += cache[key]
        return total

    @property
    def fwd_flops(self) -> float:
        """Forward FLOPs of one micro-batch, all ops."""
        return self._sum(lambda la: sum(op.fwd_flops for op in la.ops))

    @property
    def bwd_flops(self) -> float:
        """Backward FLOPs of one micro-batch, all ops."""
        return self._sum(lambda la: sum(op.bwd_flops for op in la.ops))

    @property
    def matmul_fwd_flops(self) -> float:
        """Forward FLOPs of the GEMMs/convolutions only (Megatron's model FLOPs count these)."""
        return self._sum(lambda la: sum(op.fwd_flops for op in la.ops if op.is_matmul))

    def training_flops(self, recompute: str = "none", matmul_only: bool = False) -> float:
        """FLOPs of forward + backward (+ recomputed forward) of one micro-batch.

        With `matmul_only` and a GPT model this is Narayanan et al. 2021, eq. (3): with full
        recompute 96·B·s·l·h²·(1 + s/6h + V/16lh), without 72·B·s·l·h²·(1 + s/6h + V/12lh).
        These are model FLOPs: a fused attention core counts its backward as 2x forward
        (`Op.model_bwd_flops`), whatever the kernel recomputes inside, so the count (and MFU)
        does not depend on the attention kernel.
        """
        if recompute not in RECOMPUTE_POLICIES:
            raise ValueError(f"recompute={recompute!r} is not one of {RECOMPUTE_POLICIES}")

        def layer_flops(layer: Layer) -> float:
            ops = [op for op in layer.ops if op.is_matmul or not matmul_only]
            total = sum(op.fwd_flops + op.model_bwd_flops for op in ops)
            if recompute == "full" and layer.recomputable:
                total += sum(op.fwd_flops for op in ops)
            elif recompute == "selective":
                total += sum(op.fwd_flops for op in ops if op.selective_recompute)
            return total

        return self._sum(layer_flops)

    @property
    def flops_per_token(self) -> float:
        """Training FLOPs (forward + backward, no recompute, all ops) per token."""
        return self.training_flops("none") / self.tokens

    def activation_bytes(self, tp: int = 1, sp: bool = False, recompute: str = "none") -> float:
        """Activation bytes of one micro-batch summed over all layers (per GPU at `tp`)."""
        return self._sum(lambda la: la.activation_bytes(tp, sp, recompute))

    @property
    def activation_bytes_per_token(self) -> float:
        """Saved activation bytes of the whole model per token (no TP, no recompute)."""
        return self.activation_bytes() / self.tokens

    def layer_costs(self, tp: int = 1, sp: bool = False, ep: int = 1) -> tuple[LayerCosts, ...]:
        """Per-GPU costs of every layer, in order (repeated layers computed once)."""
        cache: dict[int, LayerCosts] = {}
        out = []
        for layer in self.layers:
            key = id(layer)
            if key not in cache:
                cache[key] = layer.costs(tp, sp, ep)
            out.append(cache[key])
        return tuple(out)

    def transformer_layers(self) -> tuple[Layer, ...]:
        """The recomputable blocks (transformer or conv blocks), in order."""
        return tuple(layer for layer in self.layers if layer.recomputable)


def build_graph(spec: ModelSpec, micro_batch_size: int = 1, seq_len: int | None = None) -> ModelGraph:
    """Build the op graph of `spec` for one micro-batch.

    Args:
        spec: The model.
        micro_batch_size: Samples per micro-batch.
        seq_len: Sequence length (encoder length for T5); default `spec.seq_len`. Ignored for
            Wide-ResNet, whose "sequence" is one image.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1")
    if seq_len is not None and seq_len < 1:
        raise ValueError(f"seq_len={seq_len} must be >= 1")
    builder = _BUILDERS[spec.family]
    if spec.family == "wresnet":
        layers = builder(spec, micro_batch_size)
        return ModelGraph(spec=spec, micro_batch_size=micro_batch_size, seq_len=1, layers=layers)
    s = spec.seq_len if seq_len is None else seq_len
    layers = builder(spec, micro_batch_size, s)
    if spec.unfused_traffic:
        layers = tuple(_unfused(layer, dict(spec.unfused_traffic)) for layer in layers)
    if spec.fp8_recipe != "dynamic":
        layers = tuple(_with_fp8_recipe(layer, spec.fp8_recipe) for layer in layers)
    return ModelGraph(spec=spec, micro_batch_size=micro_batch_size, seq_len=s, layers=layers)


def _with_fp8_recipe(layer: Layer, recipe: str) -> Layer:
    """`layer` with its FP8 GEMMs under `recipe`; a GEMM right after a norm takes its FP8 input
    from the norm (Transformer Engine's LayerNormLinear)."""
    ops: list[Op] = []
    for i, op in enumerate(layer.ops):
        if op.fp8:
            after_norm = i > 0 and layer.ops[i - 1].kind in ("layernorm", "rmsnorm")
            op = dataclasses.replace(op, fp8_recipe=recipe, fp8_input_fused=after_norm)
        ops.append(op)
    return dataclasses.replace(layer, ops=tuple(ops))


def _unfused(layer: Layer, factors: dict[str, float]) -> Layer:
    """`layer` with the memory traffic of the ops an eager stack splits into several kernels
    scaled (`ModelSpec.unfused_traffic`); FLOPs and saved activations are unchanged."""
    def scaled(op: Op) -> Op:
        k = factors.get(op.kind, factors.get(op.name.rsplit(".", 1)[-1], 1.0))
        if k == 1.0:
            return op
        return dataclasses.replace(op, fwd_bytes=op.fwd_bytes * k, bwd_bytes=op.bwd_bytes * k)
    return dataclasses.replace(layer, ops=tuple(scaled(op) for op in layer.ops))


_BUILDERS: dict[str, Callable[..., tuple[Layer, ...]]] = {
    "gpt": build_gpt, "llama": build_llama, "t5": build_t5, "bert": build_bert,
    "moe": build_moe, "wresnet": build_wide_resnet}
"""Layer builder of each family (FAMILIES)."""

def trained_in(spec: ModelSpec, dtype: str) -> ModelSpec:
    """`spec` with its activations in a plan's precision `dtype`: the ops size activations,
    tensor-parallel and pipeline messages by `spec.dtype_bytes`, so an fp32 plan of an fp16
    model file (or an fp16 plan of an fp32 one) must build its graph in the plan's bytes. The
    same object when the bytes agree, and one object per (model, dtype) otherwise, so caches
    keyed by the model's identity (lowering/cache.py) keep serving it."""
    if DTYPE_BYTES[dtype] == spec.dtype_bytes:
        return spec
    return _with_dtype(spec, dtype)


@functools.lru_cache(maxsize=32)
def _with_dtype(spec: ModelSpec, dtype: str) -> ModelSpec:
    return dataclasses.replace(spec, dtype=dtype)


__all__ = ["ACTIVATIONS", "ATTENTION_KERNELS", "DTYPE_BYTES", "FAMILIES", "FP8_RECIPES", "NORMS", "POSITION_EMBEDDINGS",
           "TOKEN_ID_BYTES", "Layer", "LayerCosts", "ModelGraph", "ModelSpec", "build_graph", "trained_in"]
