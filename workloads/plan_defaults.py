"""ParallelPlan's defaults for a model on a cluster, and how overrides combine with a saved plan.

One place for what `sim simulate` with no plan flags means, so the CLI, the Python API and the
planners agree: every GPU in one pipeline when the model has enough layers (else data
parallelism), global batch 512 (Megatron-LM's GPT-3 1.3B runs; rounded to the nearest
multiple of the data-parallel degree × micro-batch size where 512 is not one), and the
ParallelPlan field defaults for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainsim.errors import PlanError
from trainsim.hwmodels.cluster import Cluster
from trainsim.workloads.model import ModelSpec

DEFAULT_GLOBAL_BATCH = 512
"""Samples per iteration when neither a plan nor the caller gives one."""

RECOMPUTE_POLICIES = ("none", "selective", "full")

_BATCH_FIELDS = ("global_batch", "micro_batch_size", "dp", "dp_batch_split")
"""Fields whose override re-derives a saved plan's micro-batch count."""


def default_degrees(gpus: int, blocks: int, dp: int | None, tp: int | None,
                    pp: int | None) -> tuple[int, int, int]:
    """Fill unset degrees: with none given, a pipeline over every GPU when the model has enough
    layers (else data parallelism); otherwise tp and pp default to 1 and dp takes the rest."""
    for flag, value in (("--dp", dp), ("--tp", tp), ("--pp", pp)):
        if value is not None and value < 1:
            raise PlanError(f"{flag}={value} must be a positive integer")
    if dp is None and tp is None and pp is None:
        if 1 < gpus <= blocks:
            return 1, 1, gpus
        return gpus, 1, 1
    tp = 1 if tp is None else tp
    pp = 1 if pp is None else pp
    if dp is None:
        if gpus % (tp * pp):
            raise PlanError(f"plan tp×pp = {tp}×{pp} does not divide the cluster's {gpus} GPUs; "
                            f"give --dp or change --tp/--pp")
        dp = gpus // (tp * pp)
    return dp, tp, pp


def default_global_batch(samples_per_step: int) -> int:
    """DEFAULT_GLOBAL_BATCH rounded to the nearest multiple of `samples_per_step` (dp × micro-
    batch size; at least one), so the default plan is valid on any cluster: 36 replicas on the
    README's 1x8xA100-SXM4-40GB+7x4xA10 get 504."""
    steps = max(1, round(DEFAULT_GLOBAL_BATCH / samples_per_step))
    return steps * samples_per_step


def parse_recompute(value: str | list[str] | tuple[str, ...]) -> str | list[str]:
    """A recompute policy name, or "op1,op2,..." as a list of op names."""
    if not isinstance(value, str) or value in RECOMPUTE_POLICIES:
        return value if isinstance(value, str) else list(value)
    return [r.strip() for r in value.split(",") if r.strip()]


def plan_fields(model: ModelSpec, cluster: Cluster, base: Mapping[str, Any] | None,
                overrides: Mapping[str, Any]) -> dict[str, Any]:
    """ParallelPlan fields: `base` (a saved plan's fields) or, without one, the defaults for
    `model` on `cluster`; then every non-None override."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if "recompute" in given:
        given["recompute"] = parse_recompute(given["recompute"])
    fields: dict[str, Any] = dict(base) if base is not None else {}
    if base is None:
        blocks = int(getattr(model, "num_blocks", 0) or model.num_layers)
        cp = given.get("cp", 1)
        if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1 \
                or cluster.num_gpus % cp:
            raise PlanError(f"plan.cp={cp!r} must be a positive integer dividing the cluster's "
                            f"{cluster.num_gpus} GPUs")
        given["dp"], given["tp"], given["pp"] = default_degrees(
            cluster.num_gpus // cp, blocks, given.get("dp"), given.get("tp"), given.get("pp"))
        if "global_batch" not in given:
            mbs = given.get("micro_batch_size", 1)
            if isinstance(mbs, bool) or not isinstance(mbs, int) or mbs < 1:
                raise PlanError(f"plan.micro_batch_size={mbs!r} must be a positive integer")
            given["global_batch"] = default_global_batch(given["dp"] * mbs)
    fields.update(given)
    if base is not None and any(k in given for k in _BATCH_FIELDS):
        fields["num_micro_batches"] = None  # re-derived from the overriding batch fields
        if "dp_batch_split" in given and "global_batch" not in given:
            fields["global_batch"] = None  # the new split's sum
    return fields
