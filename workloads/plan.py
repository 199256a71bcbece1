"""ParallelPlan: how one training iteration is split over a cluster.

A plan is a frozen, JSON-round-trippable record (Calculon's "execution" input, STYLE.md §2).
It checks what it can on its own in `__post_init__` (positive degrees, a known schedule, a
recompute policy, ZeRO stage 0–3, ...) and everything that needs the model and the cluster in
`check(model, cluster)`: degrees versus GPU count and head count, the stage partition versus the
number of layers, frequencies versus the GPU's clock range, placement versus node groups.
`ParallelPlan.build(model, cluster, **fields)` does both, so an impossible plan fails where it
is made, with a message that names the field, the value and what would be valid. Plans come from
hand-written JSON, so every field is type-checked first (an integer that is not a bool, a number
of MHz, a string, a list of the right elements): a wrong type is a PlanError naming
`plan.<field>` and the value, never a TypeError from deep inside a check.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from trainsim.errors import PlanError, read_user_text, unknown_name
from trainsim.workloads.plan_fields import (
    _action_key,
    _divisors,
    _global_batch_hint,
    _int,
    _items,
    _mhz,
    _names,
    _pairs,
    _text,
)
from trainsim.workloads.plan_op_tp import (
    check_op_tp,
    check_op_tp_model,
    op_tp_of_stage,
    op_tp_pairs,
    stage_op_tp_maps,
)

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "explicit", "cyclic")
"""Built-in schedule names; `torch:<ScheduleClass>` imports one from torch.distributed.pipelining;
`cyclic-K` is DynaPipe's cyclic order with at most K micro-batches in flight per rank."""
SCHEDULE_ALIASES = {"interleaved_1f1b": "interleaved", "zbh1": "zb-h1", "zb_h1": "zb-h1",
                    "pipedream-flush": "1f1b", "1F1B": "1f1b"}
RECOMPUTE_POLICIES = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True, slots=True)
class MicroBatch:
    """One micro-batch of an explicit, possibly variable-shape list (DynaPipe-style data)."""

    batch_size: int
    """Samples in this micro-batch (per data-parallel replica)."""
    seq_len: int
    """Sequence length of this micro-batch's samples (padded to the longest); for an
    encoder-decoder model, the encoder's."""
    target_len: int = 0
    """Encoder-decoder models: the decoder length of this micro-batch's samples (padded to the
    longest); 0 = the model's `decoder_seq_len`."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len"):
            object.__setattr__(self, name, _int(f"micro_batches: {name}", getattr(self, name),
                                                 "a positive integer", minimum=1))
        object.__setattr__(self, "target_len", _int("micro_batches: target_len",
                                                    self.target_len, "an integer >= 0",
                                                    minimum=0))

    def to_dict(self) -> dict[str, int]:
        """JSON form; `target_len` only when set."""
        out = {"batch_size": self.batch_size, "seq_len": self.seq_len}
        if self.target_len:
            out["target_len"] = self.target_len
        return out


def _micro_batch(index: int | str, value: Any) -> MicroBatch:
    """One explicit micro-batch from a MicroBatch or a {"batch_size", "seq_len"} mapping."""
    if isinstance(value, MicroBatch):
        return value
    name = f"micro_batches[{index}]" if isinstance(index, int) else index
    if not isinstance(value, Mapping) or not {"batch_size", "seq_len"} <= set(value) \
            or not set(value) <= {"batch_size", "seq_len", "target_len"}:
        raise PlanError(f'plan.{name}={value!r} must be {{"batch_size": <int>, '
                        f'"seq_len": <int>[, "target_len": <int>]}}')
    for key in ("batch_size", "seq_len"):
        _int(f"{name}.{key}", value[key])
    _int(f"{name}.target_len", value.get("target_len", 0), "an integer >= 0", minimum=0)
    return MicroBatch(batch_size=value["batch_size"], seq_len=value["seq_len"],
                      target_len=value.get("target_len", 0))


def normalise_schedule(name: str) -> str:
    """Canonical schedule name, or a PlanError listing the valid ones."""
    if name.startswith("torch:"):
        if len(name) <= len("torch:"):
            raise PlanError("plan.schedule='torch:' names no torch schedule class, "
                            "e.g. torch:Schedule1F1B")
        return name
    canonical = SCHEDULE_ALIASES.get(name, name.lower())
    if re.fullmatch(r"cyclic-[1-9][0-9]*", canonical):  # simulator/cyclic_schedule.py
        return canonical
    if canonical not in SCHEDULES:
        raise PlanError(f"plan.schedule: {unknown_name('schedule', name, [*SCHEDULES, 'torch:<Class>'])}")
    return canonical


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelPlan:
    """Degrees, partition, micro-batching, schedule, recompute, ZeRO, frequencies, placement."""

    dp: int = 1
    """Data-parallel degree (replicas of each stage)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row sharding inside a layer)."""
    pp: int = 1
    """Pipeline-parallel degree (number of physical stages)."""
    sp: bool = False
    """Sequence parallelism on top of tensor parallelism (Korthikanti et al. 2022)."""
    ep: int = 1
    """Expert-parallel degree for MoE layers; must divide the expert count and dp·tp."""
    cp: int = 1
    """Context-parallel degree: each sample's sequence is split over cp GPUs, which run every
    op on their seq/cp tokens and exchange keys and values around a ring for self attention
    (torchtitan, Megatron-LM --context-parallel-size). GPUs = dp·cp·tp·pp; gradients are
    reduced over dp·cp."""
    micro_batch_size: int = 1
    """Samples per micro-batch per data-parallel replica (ignored with `micro_batches`)."""
    global_batch: int | None = None
    """Samples per iteration over all replicas; sets the micro-batch count."""
    num_micro_batches: int | None = None
    """Micro-batches per replica per iteration; used when `global_batch` is not given (with
    `dp_batch_split`, the largest replica's count)."""
    dp_batch_split: tuple[int, ...] | None = None
    """Samples of each data-parallel replica per iteration (replica d: the d-th dp index of
    every stage), summing to `global_batch`, each a multiple of `micro_batch_size`: replica d
    runs dp_batch_split[d] / micro_batch_size micro-batches (heterogeneous clusters give faster
    GPUs more). None: an even split (global_batch / dp each)."""
    micro_batches: tuple[MicroBatch, ...] | None = None
    """Explicit per-replica micro-batches with their own size and sequence length."""
    replica_micro_batches: tuple[tuple[MicroBatch, ...], ...] | None = None
    """Each data-parallel replica's own micro-batches (DynaPipe: variable-length samples are
    grouped per iteration and the groups split over the replicas), one list per replica; the
    replicas meet only in the gradient reduction. Sets global_batch (all samples) and
    num_micro_batches (the longest list)."""
    seq_len: int | None = None
    """Sequence length; the model's default when None."""
    stage_layers: tuple[int, ...] | None = None
    """Transformer layers per (virtual) stage, first to last; uniform when None."""
    stage_tp: tuple[int, ...] | None = None
    """Per-stage tensor-parallel degree (each stage keeps dp·tp GPUs; its dp is dp·tp/stage_tp,
    and its replicas share the dp replicas' micro-batches: `replica_batch`)."""
    stage_gpus: tuple[int, ...] | None = None
    """GPUs of each physical stage (Aceso-style plans: stages of 1/2/4/8 GPUs, each with its own
    tp and dp). When set, `dp` must be 1, stage s runs tp = `tp_of_stage(s)` and
    dp = stage_gpus[s] / tp, and `micro_batch_size` is the whole pipeline micro-batch, split
    over each stage's data-parallel replicas (micro_batch_size / dp_s samples per replica)."""
    stage_recompute: tuple[str | tuple[str, ...], ...] | None = None
    """Per-physical-stage recompute policy (overrides `recompute`): none, selective, full or a
    tuple of op names, one entry per stage (Aceso's per-stage, per-op recompute)."""
    op_tp: tuple[tuple[str, int], ...] = ()
    """Per-op tensor-parallel degrees for every physical stage: (op name, degree dividing the
    stage's GPUs); an op at degree t runs on GPUs/t data-parallel replicas (Aceso's per-op
    tp/dp, workloads/plan_op_tp.py). Ops not named keep the stage's tp."""
    stage_op_tp: tuple[tuple[tuple[str, int], ...], ...] | None = None
    """Per-physical-stage per-op degrees, one {op name: degree} map per stage (overrides
    `op_tp` for the ops it names)."""
    schedule: str = "1f1b"
    """gpipe, 1f1b, interleaved, zb-h1, explicit, cyclic, cyclic-K, or torch:<ScheduleClass>."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved schedules)."""
    order: tuple[tuple[str, ...], ...] | None = None
    """Explicit per-rank action order ("0F0", "0B0", ...) for schedule='explicit'."""
    recompute: str | tuple[str, ...] = "none"
    """none, selective (attention core), full (whole layer), or a tuple of op names."""
    zero: int = 0
    """ZeRO stage 0–3: shard optimizer states (1), + gradients (2), + weights (3) over dp."""
    overlap_grad_reduce: bool = True
    """Reduce each gradient bucket as soon as its part of the last backward is done, behind the
    rest of the backward (PyTorch DDP's and FSDP's default; Megatron-LM's
    --overlap-grad-reduce). False: one reduction of all gradients after the backward ends, on
    the critical path (Megatron-LM's default without that flag)."""
    reshard_after_forward: bool = True
    """ZeRO-3 / FSDP: free the gathered parameters after each pass and gather them again for
    the next (True, FSDP's default), or keep the stage's gathered parameters -- and, over a
    step's micro-batches, its unsharded gradients -- until the step ends (False: torchtitan's
    default with pipeline parallelism, one gather per step instead of one per micro-batch)."""
    tp_comm_overlap: bool = False
    """Whether tensor-parallel collectives run behind compute (Megatron-LM's --tp-comm-overlap,
    torchtitan's AsyncTP: GEMMs decomposed so the all-gather / reduce-scatter hide behind
    them). False (every stack's default): they run in the compute stream's order, on the
    critical path, as a synchronous NCCL call between GEMMs does."""
    overlap_param_gather: bool = False
    """ZeRO-1/2 (Megatron's distributed optimizer): gather the updated parameter shards behind
    the next step's forward, bucket by bucket (Megatron-LM's --overlap-param-gather, NeMo's
    overlap_param_sync), so only the first bucket's all-gather is exposed. False (Megatron-LM's
    default): the whole all-gather runs after the optimizer step, on the critical path."""
    freq_mhz: float | None = None
    """One SM frequency for every GPU; the GPU's maximum when None."""
    stage_freq_mhz: tuple[float, ...] | None = None
    """Per-stage SM frequency (overrides `freq_mhz`)."""
    instruction_freq_mhz: tuple[tuple[str, float], ...] = ()
    """Per-instruction frequency: (action like "2F3" = stage 2 forward of micro-batch 3, MHz)."""
    placement: tuple[int, ...] | None = None
    """Node-group index per stage (heterogeneous clusters); if None, stages fill node groups
    fastest GPU first (whatever order the cluster is written in)."""
    node_order: tuple[int, ...] | None = None
    """The order in which stages fill the cluster's nodes (FASOP's device placement): a
    permutation of the node indices, numbered as the cluster is written (group 0's nodes
    first). Stage s takes the next dp×tp GPUs of that sequence, so a stage may span nodes of
    two GPU types. None: node groups fastest first (or as `placement` says)."""
    dtype: str = "fp16"
    """Compute precision: fp16, bf16 or fp32."""

    def __post_init__(self) -> None:
        self._check_types()
        if self.schedule == "interleaved" and self.virtual_stages == 1:
            raise PlanError("plan.schedule='interleaved' with plan.virtual_stages=1 is plain 1F1B; "
                            "give virtual_stages >= 2 (model chunks per pipeline rank) or use "
                            "schedule '1f1b'")
        if self.micro_batches is not None and not self.micro_batches:
            raise PlanError("plan.micro_batches is empty; give at least one micro-batch")
        if self.replica_micro_batches is not None:
            self._check_replica_lists()
        else:
            self._check_counts()
        if self.cp > 1:
            self._check_context_parallel()
        if isinstance(self.recompute, str) and self.recompute not in RECOMPUTE_POLICIES:
            raise PlanError(f"plan.recompute={self.recompute!r} must be one of "
                            f"{', '.join(RECOMPUTE_POLICIES)} or a list of op names")
        if self.recompute == ():
            raise PlanError("plan.recompute is an empty op list; use 'none' instead")
        if self.zero not in (0, 1, 2, 3):
            raise PlanError(f"plan.zero={self.zero!r} must be 0, 1, 2 or 3")
        if self.dtype not in ("fp16", "bf16", "fp32", "tf32", "fp8"):
            raise PlanError(f"plan.dtype={self.dtype!r} must be fp16, bf16, fp32, tf32 or fp8")
        if self.virtual_stages > 1 and self.schedule not in ("interleaved", "explicit") \
                and not self.schedule.startswith("torch:"):
            raise PlanError(f"plan.virtual_stages={self.virtual_stages} needs schedule "
                            f"'interleaved', 'explicit' or a torch schedule, not {self.schedule!r}")
        if self.schedule == "explicit" and self.order is None:
            raise PlanError("plan.schedule='explicit' needs plan.order (per-rank action lists)")
        if self.order is not None and len(self.order) != self.pp:
            raise PlanError(f"plan.order has {len(self.order)} rank lists but plan.pp={self.pp}")
        self._check_frequencies()
        self._check_stage_fields()
        self._check_split_fields()
        check_op_tp(self)

    def _check_types(self) -> None:
        """Normalise every field to its declared type, or raise a PlanError naming it.

        Runs first, so the value checks after it compare ints with ints and never raise a
        TypeError: `"tp": "two"`, `"tp": 2.5`, `"sp": "yes"` or `"freq_mhz": "fast"` in a plan
        file are user errors like any other.
        """
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for name in ("dp", "tp", "pp", "ep", "cp", "micro_batch_size", "virtual_stages"):
            put(name, _int(name, getattr(self, name)))
        put("zero", _int("zero", self.zero, "0, 1, 2 or 3", minimum=0))
        for name in ("global_batch", "num_micro_batches", "seq_len"):
            if getattr(self, name) is not None:
                put(name, _int(name, getattr(self, name)))
        if self.dp_batch_split is not None:
            what = "a list of positive integers (samples of each data-parallel replica)"
            put("dp_batch_split", tuple(
                _int(f"dp_batch_split[{i}]", v, f"a positive integer (samples of data-parallel "
                                                f"replica {i})")
                for i, v in enumerate(_items("dp_batch_split", self.dp_batch_split, what))))
        for flag in ("sp", "overlap_grad_reduce", "tp_comm_overlap", "reshard_after_forward",
                     "overlap_param_gather"):
            if not isinstance(getattr(self, flag), bool):
                raise PlanError(f"plan.{flag}={getattr(self, flag)!r} must be true or false")
        if self.overlap_param_gather and (self.zero not in (1, 2)
                                          or not self.overlap_grad_reduce):
            raise PlanError("plan.overlap_param_gather needs a distributed optimizer (zero 1 or "
                            "2) and overlap_grad_reduce, as Megatron-LM's "
                            f"--overlap-param-gather does (this plan: zero {self.zero}, "
                            f"overlap_grad_reduce {str(self.overlap_grad_reduce).lower()})")
        put("schedule", normalise_schedule(_text(
            "schedule", self.schedule, f"a schedule name ({', '.join(SCHEDULES)} or "
            f"torch:<ScheduleClass>)")))
        _text("dtype", self.dtype, "fp16, bf16 or fp32")
        if not isinstance(self.recompute, str):
            put("recompute", _names("recompute", self.recompute))
        if self.freq_mhz is not None:
            put("freq_mhz", _mhz("freq_mhz", self.freq_mhz))
        lists = {"stage_layers": ("integer", "layers of each (virtual) stage", None),
                 "stage_tp": ("positive integer", "tensor-parallel degree of each stage", 1),
                 "stage_gpus": ("positive integer", "GPUs of each stage", 1),
                 "placement": ("integer", "node-group index of each stage", None),
                 "node_order": ("integer", "node indices in the order stages fill them", 0)}
        for name, (kind, what, minimum) in lists.items():
            if getattr(self, name) is not None:
                items = _items(name, getattr(self, name), f"a list of {kind}s ({what})")
                article = "an" if kind[0] == "i" else "a"
                put(name, tuple(_int(f"{name}[{i}]", v, f"{article} {kind} ({what})", minimum)
                                for i, v in enumerate(items)))
        if self.stage_freq_mhz is not None:
            freqs = _items("stage_freq_mhz", self.stage_freq_mhz, "a list of MHz, one per stage")
            put("stage_freq_mhz", tuple(float(_mhz(f"stage_freq_mhz[{i}]", f))
                                        for i, f in enumerate(freqs)))
        if self.micro_batches is not None:
            put("micro_batches", tuple(_micro_batch(i, m) for i, m in enumerate(_items(
                "micro_batches", self.micro_batches,
                'a list of {"batch_size": ..., "seq_len": ...} objects'))))
        if self.replica_micro_batches is not None:
            what = 'a list (one per data-parallel replica) of lists of {"batch_size": ..., ' \
                   '"seq_len": ...} objects'
            put("replica_micro_batches", tuple(
                tuple(_micro_batch(f"replica_micro_batches[{d}][{i}]", m)
                      for i, m in enumerate(_items(f"replica_micro_batches[{d}]", ms, what)))
                for d, ms in enumerate(_items("replica_micro_batches",
                                              self.replica_micro_batches, what))))
        if self.stage_recompute is not None:
            policies = _items("stage_recompute", self.stage_recompute,
                              "a list with one recompute policy per stage")
            put("stage_recompute", tuple(
                rc if isinstance(rc, str) else (_names(f"stage_recompute[{s}]", rc) or "none")
                for s, rc in enumerate(policies)))
        put("op_tp", op_tp_pairs("op_tp", self.op_tp))
        if self.stage_op_tp is not None:
            put("stage_op_tp", stage_op_tp_maps(self.stage_op_tp))
        freqs = _pairs("instruction_freq_mhz", self.instruction_freq_mhz,
                       'a map from action to MHz, e.g. {"0F0": 1100}')
        put("instruction_freq_mhz", tuple(
            (k, float(_mhz(f"instruction_freq_mhz[{k!r}]", v))) for k, v in freqs))
        if self.order is not None:
            expected = 'a list of per-rank action lists, e.g. [["0F0", "0B0"], ["1F0", "1B0"]]'
            ranks = _items("order", self.order, expected)
            put("order", tuple(tuple(_text(f"order[{r}][{i}]", a, 'an action like "0F0"')
                                     for i, a in enumerate(_items(f"order[{r}]", acts,
                                                                  "a list of actions like '0F0'")))
                               for r, acts in enumerate(ranks)))

    # ----------------------------------------------------------------- self-consistency
    def _check_counts(self) -> None:
        if self.dp_batch_split is not None:
            self._check_batch_split(self.dp_batch_split)
            return
        if self.micro_batches is not None:
            if self.global_batch is not None:
                total = sum(m.batch_size for m in self.micro_batches) * self.dp
                if total != self.global_batch:
                    raise PlanError(
                        f"plan.global_batch={self.global_batch} but the explicit micro_batches "
                        f"hold {total} samples over dp={self.dp}")
            object.__setattr__(self, "global_batch",
                               sum(m.batch_size for m in self.micro_batches) * self.dp)
            object.__setattr__(self, "num_micro_batches", len(self.micro_batches))
            return
        if self.global_batch is not None:
            per_step = self.micro_batch_size * self.dp
            if self.global_batch % per_step:
                raise PlanError(_global_batch_hint(self.global_batch, self.micro_batch_size,
                                                   self.dp))
            m = self.global_batch // per_step
            if self.num_micro_batches is not None and self.num_micro_batches != m:
                raise PlanError(f"plan.num_micro_batches={self.num_micro_batches} disagrees with "
                                f"global_batch/(micro_batch_size·dp)={m}")
            object.__setattr__(self, "num_micro_batches", m)
        elif self.num_micro_batches is None:
            object.__setattr__(self, "num_micro_batches", 1)
        if self.global_batch is None:
            object.__setattr__(self, "global_batch",
                               cast(int, self.num_micro_batches) * self.micro_batch_size * self.dp)

    def _check_context_parallel(self) -> None:
        """cp > 1 splits every sample's sequence evenly over the ring: uniform micro-batches of
        one length, the same replicas on every stage."""
        for name in ("micro_batches", "replica_micro_batches", "dp_batch_split", "stage_gpus",
                     "stage_tp", "stage_op_tp"):
            if getattr(self, name) is not None:
                raise PlanError(f"plan.cp={self.cp} cannot be combined with plan.{name}")
        if self.op_tp:
            raise PlanError(f"plan.cp={self.cp} cannot be combined with plan.op_tp")
        if self.seq_len is not None and self.seq_len % self.cp:
            raise PlanError(f"plan.seq_len={self.seq_len} is not divisible by plan.cp={self.cp}: "
                            f"each context-parallel rank takes an equal share of the sequence")

    def _check_replica_lists(self) -> None:
        """`replica_micro_batches`: one non-empty list per replica, alone among the batch
        fields; sets global_batch and num_micro_batches."""
        lists = self.replica_micro_batches or ()
        if len(lists) != self.dp:
            raise PlanError(f"plan.replica_micro_batches has {len(lists)} lists but plan.dp="
                            f"{self.dp}: give one list of micro-batches per replica")
        for d, ms in enumerate(lists):
            if not ms:
                raise PlanError(f"plan.replica_micro_batches[{d}] is empty; every replica "
                                f"needs at least one micro-batch")
        for name in ("micro_batches", "dp_batch_split", "stage_gpus", "stage_tp",
                     "stage_op_tp"):
            if getattr(self, name) is not None:
                raise PlanError(f"plan.replica_micro_batches cannot be combined with "
                                f"plan.{name}")
        if self.op_tp:
            raise PlanError("plan.replica_micro_batches cannot be combined with plan.op_tp")
        if len(set(lists)) > 1 and (self.zero >= 3 or self.ep > 1):
            raise PlanError("plan.replica_micro_batches gives replicas different micro-batches, "
                            "which zero=3 weight gathers and expert all-to-alls (run in "
                            "lockstep per micro-batch) cannot follow; use zero <= 2 and ep=1, "
                            "or the same list on every replica")
        if self.schedule == "interleaved" and self.virtual_stages > 1:
            for d, ms in enumerate(lists):
                if len(ms) % self.pp:
                    raise PlanError(f"plan.schedule='interleaved' needs every replica's micro-"
                                    f"batch count divisible by pp={self.pp}, but plan."
                                    f"replica_micro_batches[{d}] has {len(ms)}")
        total = sum(m.batch_size for ms in lists for m in ms)
        if self.global_batch is not None and self.global_batch != total:
            raise PlanError(f"plan.global_batch={self.global_batch} but plan."
                            f"replica_micro_batches hold {total} samples")
        longest = max(len(ms) for ms in lists)
        if self.num_micro_batches is not None and self.num_micro_batches != longest:
            raise PlanError(f"plan.num_micro_batches={self.num_micro_batches} disagrees with "
                            f"plan.replica_micro_batches (the longest list has {longest})")
        object.__setattr__(self, "global_batch", total)
        object.__setattr__(self, "num_micro_batches", longest)

    def _check_batch_split(self, split: tuple[int, ...]) -> None:
        """`dp_batch_split` against dp, micro_batch_size and global_batch; sets global_batch and
        num_micro_batches (the largest replica's count)."""
        shown = list(split)
        if self.micro_batches is not None:
            raise PlanError("plan.dp_batch_split cannot be combined with plan.micro_batches "
                            "(explicit micro-batches are per replica already); give one of them")
        if len(split) != self.dp:
            raise PlanError(f"plan.dp_batch_split={shown} has {len(split)} entries but plan.dp="
                            f"{self.dp}: give one sample count per data-parallel replica")
        mbs = self.micro_batch_size
        for d, n in enumerate(split):
            if n % mbs:
                raise PlanError(f"plan.dp_batch_split[{d}]={n} is not divisible by plan."
                                f"micro_batch_size={mbs}: each replica runs whole micro-batches "
                                f"(e.g. {max(mbs, n // mbs * mbs)} or {(n // mbs + 1) * mbs})")
        total = sum(split)
        if self.global_batch is not None and self.global_batch != total:
            raise PlanError(f"plan.dp_batch_split={shown} sums to {total} but plan.global_batch="
                            f"{self.global_batch}; the replicas' samples must add up to it")
        m = max(split) // mbs
        if self.num_micro_batches is not None and self.num_micro_batches != m:
            raise PlanError(f"plan.num_micro_batches={self.num_micro_batches} disagrees with "
                            f"plan.dp_batch_split={shown}: the largest replica runs "
                            f"max(dp_batch_split)/micro_batch_size={m} micro-batches")
        object.__setattr__(self, "global_batch", total)
        object.__setattr__(self, "num_micro_batches", m)

    def _check_split_fields(self) -> None:
        """Plan fields a `dp_batch_split` cannot go with: it splits whole pipeline replicas, so
        every stage needs the same replicas (no stage_gpus, stage_tp or per-op degrees), and
        replicas that run different micro-batch counts cannot meet in per-micro-batch
        collectives (ZeRO-3 parameter gathers, expert all-to-alls)."""
        if self.dp_batch_split is None:
            return
        for name in ("stage_gpus", "stage_tp", "stage_op_tp"):
            if getattr(self, name) is not None:
                raise PlanError(f"plan.dp_batch_split cannot be combined with plan.{name} (it "
                                f"splits whole pipeline replicas, which need the same dp on "
                                f"every stage)")
        if self.op_tp:
            raise PlanError("plan.dp_batch_split cannot be combined with plan.op_tp (it splits "
                            "whole pipeline replicas, which need the same dp for every op)")
        if len(set(self.replica_micro_batch_counts())) > 1:
            if self.zero >= 3:
                raise PlanError(f"plan.dp_batch_split={list(self.dp_batch_split)} gives replicas "
                                f"different micro-batch counts, but plan.zero=3 gathers the "
                                f"weights on every replica in lockstep for each micro-batch; "
                                f"use zero <= 2 or an even split")
            if self.ep > 1:
                raise PlanError(f"plan.dp_batch_split={list(self.dp_batch_split)} gives replicas "
                                f"different micro-batch counts, but plan.ep={self.ep} runs "
                                f"expert all-to-alls across replicas for each micro-batch; use "
                                f"ep=1 or an even split")

    def _check_frequencies(self) -> None:
        if self.stage_freq_mhz is not None and len(self.stage_freq_mhz) != self.pp:
            raise PlanError(f"plan.stage_freq_mhz has {len(self.stage_freq_mhz)} values but "
                            f"pp={self.pp}")
        if not self.instruction_freq_mhz:
            return
        for key, _ in self.instruction_freq_mhz:
            _action_key("instruction_freq_mhz", key)

    def _check_stage_fields(self) -> None:
        if self.stage_gpus is not None:
            gpus = self.stage_gpus
            if len(gpus) != self.pp:
                raise PlanError(f"plan.stage_gpus has {len(gpus)} values but pp={self.pp}")
            if self.dp != 1:
                raise PlanError(f"plan.dp={self.dp} must be 1 with plan.stage_gpus (each stage's "
                                f"dp is its GPUs over its tp)")
            if self.micro_batches is not None or self.virtual_stages != 1:
                raise PlanError("plan.stage_gpus works with uniform micro-batches and "
                                "virtual_stages=1 only")
            if self.stage_tp is not None and len(self.stage_tp) != self.pp:
                raise PlanError(f"plan.stage_tp has {len(self.stage_tp)} values but pp={self.pp}")
            for s in range(self.pp):
                t = self.tp_of_stage(s)
                if gpus[s] % t:
                    raise PlanError(f"plan.stage_tp[{s}]={t} must divide plan.stage_gpus[{s}]="
                                    f"{gpus[s]} (valid: {_divisors(gpus[s])})")
                dp = gpus[s] // t
                if self.micro_batch_size % dp:
                    raise PlanError(f"plan.micro_batch_size={self.micro_batch_size} must be "
                                    f"divisible by stage {s}'s dp={dp} (stage_gpus[{s}]="
                                    f"{gpus[s]} / tp={t})")
        elif self.stage_tp is not None and len(self.stage_tp) == self.pp:
            sizes = sorted({mb.batch_size for mb in self.micro_batches}
                           if self.micro_batches is not None else {self.micro_batch_size})
            for s, t in enumerate(self.stage_tp):
                if t < 1 or (self.dp * self.tp) % t:
                    continue  # _check_gpus names it
                dp = self.dp * self.tp // t
                bad = [b for b in sizes if (b * self.dp) % dp]
                if bad:
                    raise PlanError(f"plan.stage_tp[{s}]={t}: stage {s} runs dp={dp} replicas, "
                                    f"which must split the dp={self.dp} replicas' "
                                    f"{bad[0]}-sample micro-batches evenly "
                                    f"({bad[0] * self.dp} samples in all)")
        if self.stage_recompute is not None:
            for s, rc in enumerate(self.stage_recompute):
                if isinstance(rc, str) and rc not in RECOMPUTE_POLICIES:
                    raise PlanError(f"plan.stage_recompute[{s}]={rc!r} must be one of "
                                    f"{', '.join(RECOMPUTE_POLICIES)} or a list of op names")
            if len(self.stage_recompute) != self.pp:
                raise PlanError(f"plan.stage_recompute has {len(self.stage_recompute)} values "
                                f"but pp={self.pp}")

    # ----------------------------------------------------------------- derived values
    @property
    def num_stages(self) -> int:
        """Virtual stages in the pipeline (pp × virtual_stages)."""
        return self.pp * self.virtual_stages

    @property
    def gpus(self) -> int:
        """GPUs the plan occupies: dp × tp × pp, or the sum of `stage_gpus`."""
        if self.stage_gpus is not None:
            return sum(self.stage_gpus)
        return self.dp * self.cp * self.tp * self.pp

    def gpus_of_stage(self, stage: int) -> int:
        """GPUs of a physical stage: `stage_gpus[stage]`, else dp × tp."""
        if self.stage_gpus is not None:
            return self.stage_gpus[stage]
        return self.dp * self.cp * self.tp

    def recompute_of_stage(self, stage: int) -> str | tuple[str, ...]:
        """Recompute policy of a physical stage (`stage_recompute`, else `recompute`)."""
        if self.stage_recompute is not None:
            return self.stage_recompute[stage]
        return self.recompute

    @property
    def has_stage_degrees(self) -> bool:
        """Whether stages may differ in dp (`stage_gpus` or `stage_tp`), so a pipeline
        micro-batch is split over each stage's own replicas (`replica_batch`)."""
        return self.stage_gpus is not None or self.stage_tp is not None

    def replica_batch(self, stage: int, batch_size: int) -> int:
        """Samples one data-parallel replica of `stage` runs per micro-batch of `batch_size`:
        the micro-batch itself; with `stage_gpus` (where `batch_size` is the pipeline's
        micro-batch) its share over the stage's dp; with `stage_tp` alone the plan's dp
        replicas' micro-batches together (batch_size x dp) shared over the stage's dp, so every
        stage runs the same samples whatever its tp."""
        if self.stage_gpus is not None:
            return max(1, batch_size // self.dp_of_stage(stage))
        if self.stage_tp is not None:
            return max(1, batch_size * self.dp // self.dp_of_stage(stage))
        return batch_size

    def replica_micro_batch_counts(self) -> tuple[int, ...]:
        """Micro-batches each data-parallel replica runs per iteration: its `dp_batch_split`
        share over micro_batch_size, else `num_micro_batches` on every replica."""
        if self.dp_batch_split is not None:
            return tuple(n // self.micro_batch_size for n in self.dp_batch_split)
        if self.replica_micro_batches is not None:
            return tuple(len(ms) for ms in self.replica_micro_batches)
        assert self.num_micro_batches is not None  # set in __post_init__
        return (self.num_micro_batches,) * self.dp

    def replica_micro_batch_lists(self, default_seq_len: int) -> tuple[tuple[MicroBatch, ...],
                                                                        ...]:
        """Each replica's micro-batches: its own list, else the first `count` of the shared
        list (`replica_micro_batch_counts`)."""
        if self.replica_micro_batches is not None:
            return self.replica_micro_batches
        shared = self.micro_batch_list(default_seq_len)
        return tuple(shared[:m] for m in self.replica_micro_batch_counts())

    def micro_batch_list(self, default_seq_len: int) -> tuple[MicroBatch, ...]:
        """The per-replica micro-batches, explicit or uniform (with `dp_batch_split`, the
        largest replica's; the others run a prefix of them; with `replica_micro_batches`, the
        longest list)."""
        if self.micro_batches is not None:
            return self.micro_batches
        if self.replica_micro_batches is not None:
            return max(self.replica_micro_batches, key=len)
        seq = self.seq_len or default_seq_len
        assert self.num_micro_batches is not None  # set in __post_init__
        # one frozen micro-batch, repeated: a plan of 512 micro-batches built 512 equal ones
        return (MicroBatch(batch_size=self.micro_batch_size, seq_len=seq),) \
            * self.num_micro_batches

    def layers_per_stage(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers of each virtual stage; uniform split spreads the remainder.

        A uniform split gives the first `num_layers % stages` stages one extra layer, like
        `numpy.array_split`; the stage holding the embedding or the LM head is not lightened.
        """
        n = self.num_stages
        if self.stage_layers is not None:
            return tuple(self.stage_layers)
        base, extra = divmod(num_layers, n)
        return tuple(base + (1 if s < extra else 0) for s in range(n))

    def tp_of_stage(self, stage: int) -> int:
        """Tensor-parallel degree of a physical stage."""
        return self.stage_tp[stage] if self.stage_tp is not None else self.tp

    def dp_of_stage(self, stage: int) -> int:
        """Data-parallel degree of a physical stage (its GPUs over its tp)."""
        return self.gpus_of_stage(stage) // self.tp_of_stage(stage)

    def op_tp_of_stage(self, stage: int) -> dict[str, int]:
        """{op name: tensor-parallel degree} of a physical stage (`op_tp`, then
        `stage_op_tp[stage]`); ops not named run at `tp_of_stage(stage)`."""
        return op_tp_of_stage(self, stage)

    def has_op_tp(self, stage: int) -> bool:
        """Whether some op of a physical stage runs at a degree other than the stage's tp (its
        costs then come from workloads/op_parallel.py and its collectives carry group sizes)."""
        if not self.op_tp and self.stage_op_tp is None:
            return False
        tp = self.tp_of_stage(stage)
        return any(t != tp for t in self.op_tp_of_stage(stage).values())

    def frequency_of(self, stage: int, action: str | None = None) -> float | None:
        """SM frequency for a stage's instruction: per-instruction, then per-stage, then global."""
        if action is not None and self.instruction_freq_mhz:
            for key, f in self.instruction_freq_mhz:
                if key == action:
                    return f
        if self.stage_freq_mhz is not None:
            return self.stage_freq_mhz[stage % self.pp]
        return self.freq_mhz

    # ----------------------------------------------------------------- checks vs model/cluster
    def check(self, model: Any, cluster: Any) -> None:
        """Raise PlanError if this plan cannot run `model` on `cluster`."""
        self._check_gpus(cluster)
        self._check_model(model)
        self._check_partition(model)
        self._check_cluster_fit(cluster)
        check_op_tp_model(self, model)

    def _check_gpus(self, cluster: Any) -> None:
        n = cluster.num_gpus
        if self.stage_gpus is not None:
            if self.gpus != n:
                raise PlanError(f"plan.stage_gpus={list(self.stage_gpus)} sum to {self.gpus} "
                                f"but the cluster has {n} GPUs")
            if self.stage_tp is not None and len(self.stage_tp) != self.pp:
                raise PlanError(f"plan.stage_tp has {len(self.stage_tp)} values but pp={self.pp}")
            return
        if self.gpus != n:
            if self.cp > 1:
                raise PlanError(f"plan dp×cp×tp×pp = {self.dp}×{self.cp}×{self.tp}×{self.pp} = "
                                f"{self.gpus} but the cluster has {n} GPUs")
            options = sorted({(d, t, n // (d * t)) for t in _divisors(n) for d in _divisors(n // t)
                              if t == self.tp or n // (d * t) == self.pp})
            hint = ", ".join(f"dp={d} tp={t} pp={p}" for d, t, p in options[:4])
            raise PlanError(f"plan dp×tp×pp = {self.dp}×{self.tp}×{self.pp} = {self.gpus} but the "
                            f"cluster has {n} GPUs (valid e.g.: {hint})")
        if self.stage_tp is not None:
            if len(self.stage_tp) != self.pp:
                raise PlanError(f"plan.stage_tp has {len(self.stage_tp)} values but pp={self.pp}")
            per_stage = self.dp * self.tp
            for s, t in enumerate(self.stage_tp):
                if t < 1 or per_stage % t:
                    raise PlanError(f"plan.stage_tp[{s}]={t} must divide the stage's "
                                    f"dp×tp={per_stage} GPUs (valid: {_divisors(per_stage)})")

    def _check_model(self, model: Any) -> None:
        heads = int(getattr(model, "num_heads", 0) or 0)
        kv_heads = int(getattr(model, "num_kv_heads", 0) or heads)
        tps = {self.tp, *(self.stage_tp or ())}
        for t in sorted(tps):
            if heads and heads % t:
                valid = [d for d in _divisors(heads) if d <= 64]
                raise PlanError(f"plan.tp={t} does not divide model.num_heads={heads} "
                                f"(valid tp: {valid})")
            if kv_heads and kv_heads % t and t % kv_heads:
                raise PlanError(f"plan.tp={t} and model.num_kv_heads={kv_heads}: one must divide "
                                f"the other (valid tp: {_divisors(kv_heads)} or multiples)")
        ffn = int(getattr(model, "ffn_hidden", 0) or 0)
        if ffn and any(ffn % t for t in tps):
            raise PlanError(f"plan.tp={self.tp} does not divide model.ffn_hidden={ffn}")
        experts = int(getattr(model, "num_experts", 0) or 0)
        if self.ep > 1:
            if not experts:
                raise PlanError(f"plan.ep={self.ep} but model {model.name!r} has no experts")
            if experts % self.ep:
                raise PlanError(f"plan.ep={self.ep} does not divide model.num_experts={experts} "
                                f"(valid: {_divisors(experts)})")
            if (self.dp * self.tp) % self.ep:
                raise PlanError(f"plan.ep={self.ep} must divide dp×tp={self.dp * self.tp}")
        if getattr(model, "family", None) != "t5" and any(
                m.target_len for ms in (self.replica_micro_batches or (self.micro_batches or (),))
                for m in ms):
            raise PlanError("plan micro-batches set target_len, which only an encoder-decoder "
                            "model (t5) has")
        if self.cp > 1:
            family = getattr(model, "family", None)
            if family not in ("gpt", "llama", "moe"):
                raise PlanError(f"plan.cp={self.cp}: context parallelism is modelled for "
                                f"decoder-only transformers (gpt, llama, moe), not {family}")
            if getattr(model, "attention", "flash") != "flash":
                raise PlanError(f"plan.cp={self.cp} needs the fused attention kernel (ring "
                                f"attention streams keys and values through it); the model "
                                f"runs eager attention")
            seq = self.seq_len or int(getattr(model, "seq_len", 0) or 0)
            if seq % self.cp:
                raise PlanError(f"sequence length {seq} is not divisible by plan.cp={self.cp}")
        stage_tps = {self.tp_of_stage(s) for s in range(self.pp)} if self.sp else set()
        if stage_tps == {1}:
            raise PlanError("plan.sp=true needs plan.tp > 1 (or stage_tp > 1: sequence "
                            "parallelism splits along the tensor-parallel group)")
        if len(stage_tps) > 1:
            # a stage-boundary transfer between sequence-split groups of different sizes
            # would need resharding that layout.p2p_pairs does not size (it scales by the
            # replica batch only)
            raise PlanError(f"plan.sp=true needs one tensor-parallel degree on every stage; "
                            f"plan.stage_tp has {sorted(stage_tps)}")
        if self.seq_len is not None and getattr(model, "family", None) == "wresnet":
            raise PlanError(f"plan.seq_len={self.seq_len}: model {model.name!r} is a Wide-ResNet "
                            f"(images, no sequence dimension); leave seq_len unset (--seq-len)")
        if self.seq_len is not None:
            max_seq = int(getattr(model, "max_seq_len", 0) or 0)
            if max_seq and self.seq_len > max_seq:
                raise PlanError(f"plan.seq_len={self.seq_len} exceeds model.max_seq_len={max_seq}")

    def _check_partition(self, model: Any) -> None:
        layers = int(getattr(model, "num_blocks", None) or model.num_layers)
        n = self.num_stages
        if n > layers:
            raise PlanError(f"plan.pp×virtual_stages={self.pp}×{self.virtual_stages}={n} exceeds "
                            f"the model's {layers} layers (valid pp: {_divisors(layers)[:8]}...)")
        if self.stage_layers is not None:
            sl = tuple(int(x) for x in self.stage_layers)
            if len(sl) != n:
                raise PlanError(f"plan.stage_layers has {len(sl)} entries but the pipeline has "
                                f"pp×virtual_stages={n} stages")
            if any(x < 1 for x in sl):
                raise PlanError(f"plan.stage_layers={list(sl)}: every stage needs >= 1 layer")
            if sum(sl) != layers:
                raise PlanError(f"plan.stage_layers={list(sl)} sum to {sum(sl)} but "
                                f"the model has {layers} layers")
        if self.schedule == "interleaved" and self.virtual_stages > 1 \
                and self.dp_batch_split is not None:
            for d, m in enumerate(self.replica_micro_batch_counts()):
                if m % self.pp:
                    raise PlanError(f"plan.schedule='interleaved' needs every replica's micro-"
                                    f"batch count divisible by pp={self.pp}, but plan."
                                    f"dp_batch_split[{d}]={self.dp_batch_split[d]} gives {m}")
        if self.schedule == "interleaved" and self.virtual_stages > 1 \
                and len(self.micro_batch_list(1)) % self.pp:
            raise PlanError(f"plan.schedule='interleaved' needs the micro-batch count "
                            f"({len(self.micro_batch_list(1))}) divisible by pp={self.pp}")
        for rc in (self.recompute, *(self.stage_recompute or ())):
            if not isinstance(rc, tuple):
                continue
            known = set(getattr(model, "op_names", list)())
            for name in rc:
                if known and name not in known:
                    raise PlanError(str(unknown_name("op in plan.recompute", name, known)))

    def _check_cluster_fit(self, cluster: Any) -> None:
        groups = list(cluster.node_groups)
        if self.node_order is not None:
            self._check_node_order(groups)
        if self.placement is not None:
            if len(self.placement) != self.pp:
                raise PlanError(f"plan.placement has {len(self.placement)} entries but pp={self.pp}")
            need: dict[int, int] = {}
            for s, g in enumerate(self.placement):
                if not 0 <= g < len(groups):
                    raise PlanError(f"plan.placement[{s}]={g}: the cluster has node groups "
                                    f"0..{len(groups) - 1}")
                need[g] = need.get(g, 0) + self.gpus_of_stage(s)
            for g, n in need.items():
                have = _group_gpus(groups[g])
                if n > have:
                    raise PlanError(f"plan.placement puts {n} GPUs on node group {g} "
                                    f"which has {have}")
        # The plan-wide clock runs on every GPU type. A stage's or an instruction's clock runs
        # on its stage's GPUs, known once stages are placed: the lowering checks those
        # (workloads/lowering/layout.py `_check_stage_clocks`); here, some GPU type must run it.
        firsts = [sum(_group_gpus(g) for g in groups[:i]) for i in range(len(groups))]
        types = list({gpu.name: gpu for gpu in map(cluster.gpu, firsts)}.values())
        named = [("plan.freq_mhz", self.freq_mhz, True),
                 *((f"plan.stage_freq_mhz[{i}]", f, False)
                   for i, f in enumerate(self.stage_freq_mhz or ())),
                 *((f"plan.instruction_freq_mhz[{k!r}]", f, False)
                   for k, f in self.instruction_freq_mhz)]
        for field, f, everywhere in named:
            if f is None:
                continue
            misfits = [g for g in types if not g.sm_clock_min_mhz <= f <= g.sm_clock_max_mhz]
            if misfits and (everywhere or len(misfits) == len(types)):
                gpu = misfits[0]
                raise PlanError(f"{field}: plan frequency {f:g} MHz is outside {gpu.name}'s SM "
                                f"clock range {gpu.sm_clock_min_mhz:g}–{gpu.sm_clock_max_mhz:g} "
                                f"MHz")

    def _check_node_order(self, groups: list[Any]) -> None:
        """`node_order` is a permutation of the cluster's nodes, alone (not with placement)."""
        order = list(self.node_order or ())
        nodes = sum(int(g.nodes) for g in groups)
        if self.placement is not None:
            raise PlanError("plan.node_order cannot be combined with plan.placement (give the "
                            "order stages fill nodes, or a node group per stage, not both)")
        if sorted(order) != list(range(nodes)):
            raise PlanError(f"plan.node_order={order} must list each of the cluster's {nodes} "
                            f"nodes 0..{nodes - 1} once")

    # ----------------------------------------------------------------- construction & JSON
    @classmethod
    def build(cls, model: Any, cluster: Any, **fields: Any) -> ParallelPlan:
        """Make a plan and check it against `model` and `cluster` in one step.

        An fp32 model (e.g. Wide-ResNet, the small validation models) is trained in fp32 unless
        `dtype` says otherwise; other models default to fp16, which every catalog GPU runs.
        """
        if "dtype" not in fields and getattr(model, "dtype", None) == "fp32":
            fields = {**fields, "dtype": model.dtype}
        degrees: dict[str, Any] = {k: fields[k] for k in ("dp", "cp", "tp", "pp") if k in fields}
        if fields.get("stage_gpus") is None and all(
                type(d) is int and d >= 1 for d in degrees.values()) \
                and math.prod(degrees.values()) != cluster.num_gpus:
            # degrees the cluster cannot hold first: a batch hint for them would mislead
            cls.from_dict(degrees)._check_gpus(cluster)
        plan = cls.from_dict(fields)
        plan.check(model, cluster)
        return plan

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict holding every field (round-trips through `from_dict`); an unset
        `dp_batch_split` (the even split), an unset `node_order` and the default
        `overlap_grad_reduce`, `tp_comm_overlap`, `reshard_after_forward` and
        `overlap_param_gather` are left out, so plans without them print as before."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (f.name in ("dp_batch_split", "node_order", "replica_micro_batches")
                    and value is None) or (f.name == "cp" and value == 1) or \
                    (f.name == "overlap_grad_reduce" and value) or \
                    (f.name in ("tp_comm_overlap", "overlap_param_gather") and not value) or \
                    (f.name == "reshard_after_forward" and value):
                continue
            if f.name == "micro_batches" and value is not None:
                value = [m.to_dict() for m in value]
            elif f.name == "replica_micro_batches" and value is not None:
                value = [[m.to_dict() for m in ms] for ms in value]
            elif f.name in ("op_tp", "instruction_freq_mhz"):
                value = dict(value)
            elif f.name == "stage_op_tp" and value is not None:
                value = [dict(m) for m in value]
            elif f.name == "order" and value is not None:
                value = [list(r) for r in value]
            elif f.name == "stage_recompute" and value is not None:
                value = [v if isinstance(v, str) else list(v) for v in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParallelPlan:
        """Build from a dict, rejecting unknown keys by name (the run keys of a saved plan
        file, RUN_KEYS, are not plan fields and are skipped: workloads/plan_file.py)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in data if k not in names and k not in RUN_KEYS]
        if unknown:
            raise PlanError(str(unknown_name("plan field", str(unknown[0]), names)))
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in RUN_KEYS:
                continue
            try:  # lists stay lists: _check_types turns them into tuples, checking elements
                if key == "order" and isinstance(value, Mapping):  # {"0": [...], "1": [...]}
                    value = [value[k] for k in sorted(value, key=int)]
                kwargs[key] = value
            except (TypeError, ValueError, AttributeError, OverflowError) as exc:
                raise PlanError(f"plan.{key}={data[key]!r}: {exc} (as a map, plan.{key} "
                                f"needs rank numbers as keys)") from None
        try:
            return cls(**kwargs)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise PlanError(f"plan: {exc}") from None  # a safety net: _check_types names fields

    def to_json(self) -> str:
        """Stable, indented JSON (same plan, same bytes)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> ParallelPlan:
        """Parse JSON text; `source` names the file in errors."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise PlanError(f"{source}: expected a JSON object of plan fields")
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> ParallelPlan:
        """Load a plan from a JSON file."""
        p = Path(path)
        if not p.is_file():
            raise PlanError(f"plan file {str(p)!r} does not exist")
        return cls.from_json(read_user_text(p), source=str(p))

    def save(self, path: str | Path, *, force: bool = False) -> None:
        """Write the plan as JSON; refuses to overwrite an existing file unless `force`."""
        p = Path(path)
        if p.exists() and not force:
            raise PlanError(f"{p} exists; pass force=True (--force) to overwrite it")
        p.write_text(self.to_json())

    def replace(self, **changes: Any) -> ParallelPlan:
        """A copy with some fields changed (re-checked)."""
        return dataclasses.replace(self, **changes)


RUN_KEYS = ("model", "cluster", "framework", "trainsim_version", "prices")
"""Keys a saved plan file carries beside the plan's fields, so the file alone reproduces the
run (workloads/plan_file.py); "framework" only where the run named one, "prices" (USD per
GPU-hour by GPU type, `--price`) only where the run overrode the catalog's."""


def _group_gpus(group: Any) -> int:
    for attr in ("num_gpus", "gpus"):
        value = getattr(group, attr, None)
        if isinstance(value, int):
            return value
    return int(group.nodes) * int(group.gpus_per_node)


def uniform_split(num_layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage as even as possible (first stages take the remainder)."""
    if stages < 1:
        raise PlanError(f"stages={stages} must be >= 1")
    base, extra = divmod(num_layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))


__all__ = ["RUN_KEYS", "SCHEDULES", "MicroBatch", "ParallelPlan", "normalise_schedule",
           "uniform_split"]
