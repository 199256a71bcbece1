"""Framework profiles: how a training stack runs a model's kernels, from data/frameworks.yaml.

A `FrameworkProfile` (megatron, nemo, deepspeed, torchtitan, hf-eager, default) says which
attention kernel the stack runs (`ModelSpec.attention`: "flash" or "eager"), whether it turns
sequence parallelism on with tensor parallelism, what its selective activation checkpointing
drops, how much memory its loss's backward holds, and which fused kernels it uses, each value
with its source. `apply_framework(spec, framework, attention)` returns the model as that stack
trains it: the profile's kernel (unless `attention` overrides it), selective policy and loss
workspace.
The lowering sees the result through the `ModelSpec` it builds the graph from.

Fusion facts are recorded, not applied: the op graph already models Megatron-LM's fused
kernels (workloads/transformer_block.py), and no profile here departs from them in a way the
graph could express with a citable number.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trainsim.errors import DataFileError, SpecError, unknown_name
from trainsim.workloads.data_files import read_data_yaml
from trainsim.workloads.model import (
    ATTENTION_KERNELS,
    FP8_RECIPES,
    GRAD_BUFFERS,
    GRAD_REDUCE_DTYPES,
    SELECTIVE_POLICIES,
    ModelSpec,
)

_FILE = "data/frameworks.yaml"
_WHERE = f"workloads/{_FILE}"
DEFAULT_FRAMEWORK = "default"

FUSIONS = ("masked_softmax", "bias_gelu", "bias_dropout_add", "layernorm")
"""Fused kernels a profile may record (Megatron-LM's --no-*-fusion flags and fused layernorm)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Sourced:
    """One value of a profile and where it comes from ("assumed: ..." where not cited)."""

    value: Any
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class FrameworkProfile:
    """One training stack's kernel choices."""

    name: str
    description: str
    attention: Sourced
    """Attention kernel: "flash" or "eager" (`ModelSpec.attention`)."""
    fusions: Mapping[str, Sourced] = field(default_factory=dict, hash=False)
    """Fused kernels the stack runs by default (recorded facts; see the module docstring)."""
    sequence_parallel: Sourced = field(default_factory=lambda: Sourced(
        value=False, source="assumed: off unless the profile says otherwise"))
    """Whether the stack shards the norms' and dropouts' activations over the tensor-parallel
    group (Korthikanti et al. 2022) by default when tp > 1 (`ParallelPlan.sp`)."""
    reshard_with_pp: Sourced = field(default_factory=lambda: Sourced(
        value=True, source="assumed: FSDP's default, reshard after every forward"))
    """Whether FSDP / ZeRO-3 frees gathered parameters after each forward when the run is
    also pipeline-parallel (`ParallelPlan.reshard_after_forward`)."""
    distributed_optimizer: Sourced = field(default_factory=lambda: Sourced(
        value=False, source="assumed: off unless the profile says otherwise"))
    """Whether the stack shards optimizer state over data-parallel ranks by default (Megatron's
    distributed optimizer, ZeRO-1: `ParallelPlan.zero` 1)."""
    overlap_grad_reduce: Sourced = field(default_factory=lambda: Sourced(
        value=True, source="assumed: PyTorch DDP's and FSDP's default (buckets reduced during "
                           "the backward)"))
    """Whether the stack reduces gradient buckets behind the backward by default
    (`ParallelPlan.overlap_grad_reduce`): true, false, or "zero3" (under ZeRO-3 only;
    `overlaps_grad_reduce`)."""
    overlap_param_gather: Sourced = field(default_factory=lambda: Sourced(
        value=False, source="assumed: the parameter all-gather after the optimizer step"))
    """Whether the stack gathers ZeRO-1/2 parameter shards behind the next forward by default
    (`ParallelPlan.overlap_param_gather`)."""
    grad_buffer: Sourced = field(default_factory=lambda: Sourced(
        value="param", source="assumed: gradients in the training dtype"))
    """Where the stack keeps gradients (`ModelSpec.grad_buffer`)."""
    grad_reduce_dtype: Sourced = field(default_factory=lambda: Sourced(
        value="param", source="assumed: the gradients' own dtype"))
    """What the data-parallel gradient reduction carries (`ModelSpec.grad_reduce_dtype`)."""
    fp8_recipe: Sourced = field(default_factory=lambda: Sourced(
        value="dynamic", source="assumed: torchao-style dynamic scaling"))
    """How the stack's FP8 linear layers cast (`ModelSpec.fp8_recipe`)."""
    unfused_traffic: Sourced = field(default_factory=lambda: Sourced(
        value={}, source="assumed: the graph's fused kernels"))
    """Op kind (or name suffix) -> memory traffic of the stack's eager kernels relative to the
    fused one (`ModelSpec.unfused_traffic`)."""
    interleaved_virtual_stages: Sourced = field(default_factory=lambda: Sourced(
        value=0, source="assumed: unknown (the run must state it)"))
    """Model chunks per pipeline rank an interleaved schedule gets when the run does not say
    (0: no default)."""
    selective_recompute: Sourced = field(default_factory=lambda: Sourced(
        value="megatron", source="assumed: Megatron-LM's attention-core policy"))
    """What the stack's "selective" activation checkpointing drops (`ModelSpec.selective_policy`)."""
    loss_workspace: Sourced = field(default_factory=lambda: Sourced(
        value=0.0, source="assumed: not modelled"))
    """Bytes per logit the loss's backward holds beyond the saved fp32 logits
    (`ModelSpec.loss_workspace_bytes`)."""
    sac_keeps_unread: Sourced = field(default_factory=lambda: Sourced(
        value=True, source="assumed: eager PyTorch"))
    """Under op-level selective checkpointing, whether outputs the backward never reads are
    kept too (`ModelSpec.sac_keeps_unread`)."""
    loss_workspace_tp: Sourced = field(default_factory=lambda: Sourced(
        value=0.0, source="assumed: as without tensor parallelism"))
    """`loss_workspace` where the loss is vocab-parallel (tp > 1)
    (`ModelSpec.loss_workspace_tp_bytes`; 0: the same)."""
    fsdp_copy_out: Sourced = field(default_factory=lambda: Sourced(
        value=0.0, source="assumed: parameters view the gathered buffer (no copy)"))
    """Bytes moved per gathered parameter byte by the stack's FSDP copy on the compute stream
    after each parameter all-gather (`ModelSpec.fsdp_copy_out_traffic`)."""
    logged_memory_factor: Sourced = field(default_factory=lambda: Sourced(
        value=1.0, source="assumed: the stack reports peak allocated bytes"))
    """The peak memory the stack logs over the peak bytes its tensors take (1: it reports
    allocated memory; above 1: it reports what PyTorch's caching allocator reserved). Used
    where a prediction is compared with the stack's own figure (`sim accuracy`)."""
    pipeline_microbatches: Sourced = field(default_factory=lambda: Sourced(
        value="given", source="assumed: the run states its micro-batch size"))
    """How a pipeline-parallel run splits each data-parallel rank's local batch: "given"
    (the micro-batch size is stated) or "pp" (into as many micro-batches as pipeline stages,
    torchtitan's default)."""

    def overlaps_grad_reduce(self, zero: int) -> bool:
        """The profile's `overlap_grad_reduce` for a plan at ZeRO stage `zero`."""
        value = self.overlap_grad_reduce.value
        return zero == 3 if value == "zero3" else bool(value)

    def overlaps_param_gather(self, zero: int, overlap_grad_reduce: bool) -> bool:
        """The profile's `overlap_param_gather` where it can apply: a distributed optimizer
        (ZeRO-1/2) whose gradient reduction overlaps the backward (`ParallelPlan` refuses it
        elsewhere)."""
        return bool(self.overlap_param_gather.value) and zero in (1, 2) and overlap_grad_reduce

    def plan_defaults(self, fields: Mapping[str, Any], family: str | None = None
                      ) -> dict[str, Any]:
        """The plan fields this stack sets where `fields` leave them unset (absent or None):
        sequence parallelism with tensor parallelism where the profile turns it on, its
        distributed optimizer (ZeRO-1) unless no stage is data-parallel (an Aceso plan's
        stages: `stage_gpus` / `stage_tp`) or degrees are per op (`ParallelPlan` refuses
        ZeRO and sequence parallelism with those), and its gradient-reduction and
        parameter-gather overlap for the resulting ZeRO stage. What `make_plan` and an
        Oracle given a framework (`sim search --framework`) fill in alike. Sequence
        parallelism splits a transformer's norms and dropouts along the sequence, so a
        convolutional model (`family` "wresnet") gets none."""
        out: dict[str, Any] = {}
        replicas, tp = fields.get("dp") or 0, fields.get("tp") or 1
        gpus, tps = fields.get("stage_gpus"), fields.get("stage_tp")
        if tps:  # Aceso-style stages (plan tp 1): sp where they share one degree, as
            # ParallelPlan.check requires of sequence parallelism
            tp = tps[0] if len(set(tps)) == 1 else 1
        if gpus:  # Aceso-style stages (plan dp 1): each stage's own data-parallel degree
            tps = tps or [fields.get("tp") or 1] * len(gpus)
            replicas = max(g // t for g, t in zip(gpus, tps, strict=True))
        per_op = bool(fields.get("op_tp")) or any(fields.get("stage_op_tp") or ())
        if fields.get("sp") is None and tp > 1 and family != "wresnet" and not per_op:
            out["sp"] = bool(self.sequence_parallel.value)
        zero = fields.get("zero")
        if zero is None and self.distributed_optimizer.value and replicas != 1 and not per_op:
            zero = out["zero"] = 1
        overlap = fields.get("overlap_grad_reduce")
        if overlap is None:
            overlap = out["overlap_grad_reduce"] = self.overlaps_grad_reduce(zero or 0)
        if fields.get("overlap_param_gather") is None:
            out["overlap_param_gather"] = self.overlaps_param_gather(zero or 0, bool(overlap))
        return out


def _sourced(where: str, raw: object, check: tuple[Any, ...] | type) -> Sourced:
    if not isinstance(raw, Mapping) or set(raw) != {"value", "source"}:
        raise DataFileError(f"{where}: must be a mapping with exactly 'value' and 'source'")
    source = raw["source"]
    if not isinstance(source, str) or not source.strip():
        raise DataFileError(f"{where}.source: must be a non-empty string (a citation, or "
                            f"'assumed: ...')")
    value = raw["value"]
    if isinstance(check, tuple):
        if value not in check:
            raise DataFileError(f"{where}.value={value!r} is not one of "
                                f"{', '.join(map(str, check))}")
    elif not isinstance(value, check):
        raise DataFileError(f"{where}.value={value!r} must be a {check.__name__}")
    return Sourced(value=value, source=source)


def _workspace(where: str, raw: object) -> Sourced:
    """A bytes-per-element value (per logit, per parameter): a number in [0, 64)."""
    entry = _sourced(where, raw, object)
    if not isinstance(entry.value, (int, float)) or isinstance(entry.value, bool) \
            or not 0 <= entry.value < 64:
        raise DataFileError(f"{where}.value={entry.value!r} must be a number of bytes in "
                            f"[0, 64)")
    return Sourced(value=float(entry.value), source=entry.source)


def _memory_factor(where: str, raw: object) -> Sourced:
    """A ratio of logged to allocated peak memory: a number in [1, 2]."""
    entry = _sourced(where, raw, object)
    if not isinstance(entry.value, (int, float)) or isinstance(entry.value, bool) \
            or not 1 <= entry.value <= 2:
        raise DataFileError(f"{where}.value={entry.value!r} must be a ratio in [1, 2]")
    return Sourced(value=float(entry.value), source=entry.source)


def _traffic(where: str, raw: object) -> Sourced:
    """Op kind or name suffix -> factor in [1, 64]."""
    entry = _sourced(where, raw, object)
    value = entry.value
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            and 1 <= v <= 64 for k, v in value.items()):
        raise DataFileError(f"{where}.value must map op kinds to factors in [1, 64]")
    return Sourced(value={str(k): float(v) for k, v in value.items()}, source=entry.source)


_OPTIONAL: dict[str, Callable[[str, object], Sourced]] = {
    "sequence_parallel": lambda where, raw: _sourced(where, raw, bool),
    "pipeline_microbatches": lambda where, raw: _sourced(where, raw, ("given", "pp")),
    "selective_recompute": lambda where, raw: _sourced(where, raw, SELECTIVE_POLICIES),
    "loss_workspace": _workspace,
    "loss_workspace_tp": _workspace,
    "sac_keeps_unread": lambda where, raw: _sourced(where, raw, bool),
    "logged_memory_factor": _memory_factor,
    "fsdp_copy_out": _workspace,
    "reshard_with_pp": lambda where, raw: _sourced(where, raw, bool),
    "distributed_optimizer": lambda where, raw: _sourced(where, raw, bool),
    "fp8_recipe": lambda where, raw: _sourced(where, raw, FP8_RECIPES),
    "grad_reduce_dtype": lambda where, raw: _sourced(where, raw, GRAD_REDUCE_DTYPES),
    "grad_buffer": lambda where, raw: _sourced(where, raw, GRAD_BUFFERS),
    "overlap_grad_reduce": lambda where, raw: _sourced(where, raw, (True, False, "zero3")),
    "overlap_param_gather": lambda where, raw: _sourced(where, raw, bool),
    "unfused_traffic": _traffic,
    "interleaved_virtual_stages": lambda where, raw: _sourced(where, raw, (2, 3, 4, 5, 6, 7, 8)),
}
"""The profile fields a profile may leave out (its dataclass default applies), each with the
check of its value."""
PROFILE_FIELDS = ("description", "attention", "fusions", *_OPTIONAL)
"""Keys a profile in frameworks.yaml may have."""


def parse_profiles(data: object, where: str = _WHERE) -> dict[str, FrameworkProfile]:
    """Validate a frameworks.yaml document; errors are one line naming the field."""
    if not isinstance(data, Mapping) or set(data) != {"profiles"}:
        raise DataFileError(f"{where}: must have exactly one top-level key 'profiles'")
    profiles = data["profiles"]
    if not isinstance(profiles, Mapping) or not profiles:
        raise DataFileError(f"{where}: profiles must map profile names to their fields")
    out: dict[str, FrameworkProfile] = {}
    for name, raw in profiles.items():
        at = f"{where}: profiles.{name}"
        if not isinstance(raw, Mapping):
            raise DataFileError(f"{at}: must be a mapping of fields")
        unknown = sorted(set(raw) - set(PROFILE_FIELDS))
        if unknown:
            raise DataFileError(f"{at}: unknown field {unknown[0]!r} (valid: "
                                f"{', '.join(sorted(PROFILE_FIELDS))})")
        if "attention" not in raw:
            raise DataFileError(f"{at}: misses field 'attention'")
        fusions_raw = raw.get("fusions") or {}
        if not isinstance(fusions_raw, Mapping):
            raise DataFileError(f"{at}.fusions: must map fusion names to value/source")
        fusions = {}
        for key, entry in fusions_raw.items():
            if key not in FUSIONS:
                raise DataFileError(f"{at}.fusions.{key}: unknown fusion (valid: "
                                    f"{', '.join(FUSIONS)})")
            fusions[str(key)] = _sourced(f"{at}.fusions.{key}", entry, bool)
        out[str(name).lower()] = FrameworkProfile(
            name=str(name).lower(), description=str(raw.get("description", "")),
            attention=_sourced(f"{at}.attention", raw["attention"], ATTENTION_KERNELS),
            fusions=MappingProxyType(fusions),
            **{key: check(f"{at}.{key}", raw[key]) for key, check in _OPTIONAL.items()
               if key in raw})
    if DEFAULT_FRAMEWORK not in out:
        raise DataFileError(f"{where}: profiles misses the '{DEFAULT_FRAMEWORK}' profile")
    return out


@functools.cache
def _profiles() -> dict[str, FrameworkProfile]:
    return parse_profiles(read_data_yaml(_FILE))


def list_frameworks() -> list[str]:
    """Names of the framework profiles, in file order."""
    return list(_profiles())


def get_framework(name: str) -> FrameworkProfile:
    """A framework profile by name (case-insensitive).

    Raises:
        UnknownNameError: listing the valid profile names.
    """
    profile = _profiles().get(name.strip().lower())
    if profile is None:
        raise unknown_name("framework", name, list_frameworks())
    return profile


def apply_framework(spec: ModelSpec, framework: str | None = None,
                    attention: str | None = None) -> ModelSpec:
    """`spec` as `framework` trains it, with `attention` overriding the profile's kernel.

    With neither given, `spec` is returned unchanged (its own `attention`, "flash" unless its
    file says otherwise).

    Raises:
        UnknownNameError: an unknown framework.
        SpecError: an attention kernel other than "flash" or "eager".
    """
    if attention is not None and attention not in ATTENTION_KERNELS:
        raise SpecError(f"attention={attention!r} must be one of {', '.join(ATTENTION_KERNELS)}")
    changes: dict[str, Any] = {}
    if framework is not None:
        profile = get_framework(framework)
        changes = {"attention": str(profile.attention.value),
                   "selective_policy": str(profile.selective_recompute.value),
                   "loss_workspace_bytes": float(profile.loss_workspace.value),
                   "loss_workspace_tp_bytes": float(profile.loss_workspace_tp.value),
                   "sac_keeps_unread": bool(profile.sac_keeps_unread.value),
                   "fsdp_copy_out_traffic": float(profile.fsdp_copy_out.value),
                   "unfused_traffic": tuple(sorted(profile.unfused_traffic.value.items())),
                   "fp8_recipe": str(profile.fp8_recipe.value),
                   "grad_reduce_dtype": str(profile.grad_reduce_dtype.value),
                   "grad_buffer": str(profile.grad_buffer.value)}
    if attention is not None:
        changes["attention"] = attention
    changes = {k: v for k, v in changes.items() if getattr(spec, k) != v}
    return dataclasses.replace(spec, **changes) if changes else spec


__all__ = ["DEFAULT_FRAMEWORK", "FUSIONS", "PROFILE_FIELDS", "FrameworkProfile", "Sourced", "apply_framework",
           "get_framework", "list_frameworks", "parse_profiles"]
