"""Aceso's plan space and moves (Aceso, EuroSys'24 §3–4), on trainsim's ParallelPlan.

An `AcesoConfig` is a list of pipeline stages — each a contiguous run of the model's layers on
1/2/4/8… GPUs (a power of two, node-aligned), with its own tensor-parallel degree (its data-
parallel degree is GPUs / tp), per-op degrees for some of its ops (each op at degree t runs on
GPUs / t data-parallel replicas; Aceso §3) and a recompute policy — and one micro-batch size
for the whole pipeline (split over each stage's data-parallel replicas). `to_fields` turns it
into ParallelPlan fields (`stage_gpus`, `stage_tp`, `stage_layers`, `stage_recompute`, and
`stage_op_tp` when some stage has per-op degrees).

Moves change one thing around a bottleneck stage: migrate layers to a neighbour, raise or lower
its tp (trading dp), raise or lower the degree of one op group of it (`op_groups`: a block's
attention or MLP ops, heaviest first, so the op kinds whose time dominates move first; the
resharding between groups is costed by workloads/op_parallel.py), take GPUs from another stage,
split or merge stages, double or halve the micro-batch, switch its recompute up or down the
ladder none → selective → full. A move may return a config `check_config` refuses (callers
filter) or None.

Partition dimension: every op keeps Megatron's default partition (the first of `op.shardings`:
column for the first GEMM of a pair, row for the second, heads for the attention core); Aceso's
swapped column/row option (`algo` 1) is not searched. Out of scope: stage boundaries inside a
layer (trainsim partitions at layer granularity).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from trainsim.workloads.model import ModelSpec, build_graph
from trainsim.workloads.plan import ParallelPlan

RECOMPUTE_LADDER = ("none", "selective", "full")
"""Recompute levels a stage moves through (Korthikanti et al. 2022: selective drops the attention
core's activations, full keeps only each layer's input)."""


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@dataclass(frozen=True, kw_only=True, slots=True)
class AcesoStage:
    """One pipeline stage."""

    layers: int
    """Consecutive transformer (or conv) blocks it holds."""
    gpus: int
    """GPUs it runs on (power of two)."""
    tp: int = 1
    """Tensor-parallel degree (divides gpus); dp = gpus / tp."""
    recompute: str = "none"
    """none, selective or full."""
    op_tp: tuple[tuple[str, int], ...] = ()
    """(op name, degree) of ops not at `tp`; sorted, clamped to `gpus`, entries equal to `tp`
    dropped, so equal stages compare (and hash) equal."""

    def __post_init__(self) -> None:
        degrees = {n: min(t, self.gpus) for n, t in self.op_tp}
        object.__setattr__(self, "op_tp", tuple(sorted((n, t) for n, t in degrees.items()
                                                       if t != self.tp)))

    @property
    def dp(self) -> int:
        """Data-parallel degree."""
        return self.gpus // self.tp

    def degree(self, op: str) -> int:
        """Tensor-parallel degree of op `op` on this stage."""
        return dict(self.op_tp).get(op, self.tp)


@dataclass(frozen=True, kw_only=True, slots=True)
class AcesoConfig:
    """Stages plus the pipeline micro-batch size."""

    stages: tuple[AcesoStage, ...]
    micro_batch_size: int
    """Samples per pipeline micro-batch (all replicas of a stage together)."""

    def to_fields(self, global_batch: int) -> dict[str, Any]:
        """ParallelPlan fields of this config (`stage_op_tp` only where some stage has
        per-op degrees, so one-degree configs give the same fields as before)."""
        fields: dict[str, Any] = {
            "pp": len(self.stages), "dp": 1, "tp": 1,
            "stage_gpus": [s.gpus for s in self.stages],
            "stage_tp": [s.tp for s in self.stages],
            "stage_layers": [s.layers for s in self.stages],
            "stage_recompute": [s.recompute for s in self.stages],
            "micro_batch_size": self.micro_batch_size, "global_batch": global_batch,
            "schedule": "1f1b"}
        if any(s.op_tp for s in self.stages):
            fields["stage_op_tp"] = [dict(s.op_tp) for s in self.stages]
        return fields

    def with_stage(self, i: int, **changes: Any) -> AcesoConfig:
        stages = list(self.stages)
        stages[i] = replace(stages[i], **changes)
        return replace(self, stages=tuple(stages))


def config_of(plan: ParallelPlan, num_layers: int) -> AcesoConfig:
    """The AcesoConfig of a ParallelPlan (uniform Megatron plans included)."""
    pp = plan.pp
    layers = plan.layers_per_stage(num_layers)
    stages = []
    for s in range(pp):
        rc = plan.recompute_of_stage(s)
        stages.append(AcesoStage(layers=layers[s], gpus=plan.gpus_of_stage(s),
                                 tp=plan.tp_of_stage(s),
                                 recompute=rc if isinstance(rc, str) else "selective",
                                 op_tp=tuple(plan.op_tp_of_stage(s).items())))
    mbs = plan.micro_batch_size * (plan.dp if plan.stage_gpus is None else 1)
    return AcesoConfig(stages=tuple(stages), micro_batch_size=mbs)


def check_config(cfg: AcesoConfig, *, num_gpus: int, gpus_per_node: int, num_layers: int,
                 global_batch: int, heads: int = 0, ladder: tuple[str, ...] = RECOMPUTE_LADDER,
                 ffn: int = 0) -> bool:
    """True when `cfg` is a valid Aceso plan: GPUs add up, powers of two, node-aligned
    (a stage within one node, or whole nodes), tp | gpus and | heads, dp | micro-batch,
    micro-batch | global batch, ≥ 1 layer per stage, layers add up; each per-op degree a
    power of two dividing the stage's GPUs, the heads and the FFN width, its dp | micro-batch."""
    if sum(s.gpus for s in cfg.stages) != num_gpus:
        return False
    if sum(s.layers for s in cfg.stages) != num_layers:
        return False
    mbs = cfg.micro_batch_size
    if mbs < 1 or global_batch % mbs:
        return False
    start = 0
    for s in cfg.stages:
        if s.layers < 1 or not _pow2(s.gpus) or not _pow2(s.tp) or s.gpus % s.tp:
            return False
        if heads and heads % s.tp:
            return False
        if mbs % s.dp or s.recompute not in ladder:
            return False
        for _, t in s.op_tp:
            if not _pow2(t) or s.gpus % t or (heads and heads % t) or (ffn and ffn % t) \
                    or mbs % (s.gpus // t):
                return False
        if s.gpus <= gpus_per_node:
            if start // gpus_per_node != (start + s.gpus - 1) // gpus_per_node:
                return False
        elif start % gpus_per_node or s.gpus % gpus_per_node:
            return False
        start += s.gpus
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class Move:
    """A named change of a config."""

    name: str
    config: AcesoConfig


def migrate(cfg: AcesoConfig, src: int, dst: int, k: int = 1) -> AcesoConfig | None:
    """Move k boundary layers of stage `src` to its neighbour `dst`."""
    if abs(src - dst) != 1 or not 0 <= dst < len(cfg.stages):
        return None
    if cfg.stages[src].layers - k < 1:
        return None
    cfg = cfg.with_stage(src, layers=cfg.stages[src].layers - k)
    return cfg.with_stage(dst, layers=cfg.stages[dst].layers + k)


def set_tp(cfg: AcesoConfig, i: int, tp: int) -> AcesoConfig | None:
    """Change stage i's tensor-parallel degree (its dp changes inversely)."""
    s = cfg.stages[i]
    if tp == s.tp or tp < 1 or s.gpus % tp:
        return None
    return cfg.with_stage(i, tp=tp)


def set_op_tp(cfg: AcesoConfig, i: int, ops: tuple[str, ...], tp: int) -> AcesoConfig | None:
    """Run ops `ops` of stage i at degree `tp` (their dp becomes gpus / tp)."""
    s = cfg.stages[i]
    if tp < 1 or s.gpus % tp or all(s.degree(op) == tp for op in ops):
        return None
    return cfg.with_stage(i, op_tp=(*s.op_tp, *((op, tp) for op in ops)))


def _group_key(name: str) -> str:
    """"attn.qkv" -> "attn"; "conv2" and "bn2" -> "2"; "downsample" -> itself."""
    if "." in name:
        return name.split(".")[0]
    stem = name.rstrip("0123456789")
    return name[len(stem):] or name


def op_groups(model: ModelSpec) -> tuple[tuple[str, ...], ...]:
    """Op groups a per-op move changes together, heaviest (forward + backward FLOPs per block)
    first: ops named "<group>.<op>" group by prefix (a block's attention, its MLP), others
    by their trailing number (Wide-ResNet's conv1 + bn1); only groups with a GEMM or
    convolution (degrees of elementwise ops alone do not pay for their resharding). The
    moves then raise or lower the op kinds whose time dominates the bottleneck first."""

    weight: dict[str, float] = {}
    members: dict[str, list[str]] = {}
    heavy: set[str] = set()
    for layer in build_graph(model, 1).transformer_layers():
        for op in layer.ops:
            key = _group_key(op.name)
            if op.name not in members.setdefault(key, []):
                members[key].append(op.name)
            weight[key] = weight.get(key, 0.0) + op.fwd_flops + op.bwd_flops
            if op.is_matmul and op.params > 0:
                heavy.add(key)
    order = sorted((k for k in members if k in heavy), key=lambda k: (-weight[k], k))
    return tuple(tuple(members[k]) for k in order)


def trade_gpus(cfg: AcesoConfig, to: int, donor: int) -> AcesoConfig | None:
    """Give stage `to` as many more GPUs as it has, taken from `donor` (which must keep ≥ 1;
    both stay powers of two); tp shrinks where it no longer divides."""
    a, d = cfg.stages[to], cfg.stages[donor]
    if to == donor or d.gpus - a.gpus < 1 or not _pow2(d.gpus - a.gpus):
        return None
    new_d = d.gpus - a.gpus
    cfg = cfg.with_stage(to, gpus=a.gpus * 2)
    return cfg.with_stage(donor, gpus=new_d, tp=min(d.tp, new_d))


def set_recompute(cfg: AcesoConfig, i: int, step: int,
                  ladder: tuple[str, ...] = RECOMPUTE_LADDER) -> AcesoConfig | None:
    """Move stage i's recompute `step` rungs along the ladder."""
    j = ladder.index(cfg.stages[i].recompute) + step
    if not 0 <= j < len(ladder):
        return None
    return cfg.with_stage(i, recompute=ladder[j])


def set_micro_batch(cfg: AcesoConfig, factor: float) -> AcesoConfig | None:
    """Double (2) or halve (0.5) the pipeline micro-batch."""
    mbs = cfg.micro_batch_size * factor
    if mbs < 1 or mbs != int(mbs):
        return None
    return replace(cfg, micro_batch_size=int(mbs))


def split_stage(cfg: AcesoConfig, i: int) -> AcesoConfig | None:
    """Split stage i into two with half its GPUs and layers each."""
    s = cfg.stages[i]
    if s.gpus < 2 or s.layers < 2:
        return None
    half = s.gpus // 2
    a = replace(s, layers=s.layers - s.layers // 2, gpus=half, tp=min(s.tp, half))
    b = replace(s, layers=s.layers // 2, gpus=half, tp=min(s.tp, half))
    return replace(cfg, stages=cfg.stages[:i] + (a, b) + cfg.stages[i + 1:])


def merge_stages(cfg: AcesoConfig, i: int) -> AcesoConfig | None:
    """Merge stage i with stage i + 1 (their GPUs must add to a power of two)."""
    if i + 1 >= len(cfg.stages):
        return None
    a, b = cfg.stages[i], cfg.stages[i + 1]
    if not _pow2(a.gpus + b.gpus):
        return None
    merged = AcesoStage(layers=a.layers + b.layers, gpus=a.gpus + b.gpus, tp=max(a.tp, b.tp),
                        recompute=max(a.recompute, b.recompute, key=RECOMPUTE_LADDER.index),
                        op_tp=a.op_tp if a.op_tp == b.op_tp else ())
    return replace(cfg, stages=cfg.stages[:i] + (merged,) + cfg.stages[i + 2:])


def moves(cfg: AcesoConfig, bottleneck: int, *, memory_bound: bool,
          busy_s: tuple[float, ...] = (), ladder: tuple[str, ...] = RECOMPUTE_LADDER,
          op_groups: tuple[tuple[str, ...], ...] = ()) -> Iterator[Move]:
    """Candidate moves around the bottleneck stage, most promising first (Aceso §4.2: the
    order follows what dominates the bottleneck — memory, recompute, compute, parallelism).
    Per-op degree moves are tried for the `op_groups` given (heaviest first; see
    `op_groups(model)`), none when empty."""
    b = bottleneck
    n = len(cfg.stages)
    s = cfg.stages[b]
    busy = list(busy_s) if len(busy_s) == n else [0.0] * n
    neighbours = sorted((j for j in (b - 1, b + 1) if 0 <= j < n), key=lambda j: busy[j])
    donors = sorted((j for j in range(n) if j != b), key=lambda j: busy[j])

    def gen() -> Iterator[tuple[str, AcesoConfig | None]]:
        if memory_bound:
            yield f"recompute+ s{b}", set_recompute(cfg, b, +1, ladder)
            for j in neighbours:
                yield f"migrate s{b}->s{j}", migrate(cfg, b, j)
            yield f"tp*2 s{b}", set_tp(cfg, b, s.tp * 2)
            for g in op_groups:
                yield f"op-tp*2 {g[0]} s{b}", set_op_tp(cfg, b, g, s.degree(g[0]) * 2)
            yield "mbs/2", set_micro_batch(cfg, 0.5)
            for j in donors:
                yield f"gpus s{j}->s{b}", trade_gpus(cfg, b, j)
            yield f"split s{b}", split_stage(cfg, b)
            return
        if s.recompute != ladder[0]:
            yield f"recompute- s{b}", set_recompute(cfg, b, -1, ladder)
        for j in neighbours:
            yield f"migrate s{b}->s{j}", migrate(cfg, b, j)
        for j in donors:
            yield f"gpus s{j}->s{b}", trade_gpus(cfg, b, j)
        yield f"tp/2 s{b}", set_tp(cfg, b, s.tp // 2) if s.tp > 1 else None
        yield f"tp*2 s{b}", set_tp(cfg, b, s.tp * 2)
        for g in op_groups:
            t = s.degree(g[0])
            yield f"op-tp/2 {g[0]} s{b}", set_op_tp(cfg, b, g, t // 2) if t > 1 else None
            yield f"op-tp*2 {g[0]} s{b}", set_op_tp(cfg, b, g, t * 2)
        yield "mbs*2", set_micro_batch(cfg, 2)
        yield "mbs/2", set_micro_batch(cfg, 0.5)
        for j in neighbours:
            yield f"migrate2 s{b}->s{j}", migrate(cfg, b, j, 2)
        yield f"merge s{min(b, neighbours[0]) if neighbours else b}", \
            merge_stages(cfg, min(b, neighbours[0])) if neighbours else None
        yield f"split s{b}", split_stage(cfg, b)
        for j in range(n):
            if j != b and cfg.stages[j].recompute != ladder[0]:
                yield f"recompute- s{j}", set_recompute(cfg, j, -1, ladder)

    for name, new in gen():
        if new is not None and new != cfg:
            yield Move(name=name, config=new)


__all__ = ["RECOMPUTE_LADDER", "AcesoConfig", "AcesoStage", "Move", "check_config", "config_of",
           "merge_stages", "migrate", "moves", "op_groups", "set_micro_batch", "set_op_tp",
           "set_recompute", "set_tp", "split_stage", "trade_gpus"]
