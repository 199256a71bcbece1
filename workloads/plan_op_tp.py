"""Per-op tensor-parallel degrees of a ParallelPlan (`op_tp`, `stage_op_tp`): type checks,
self-consistency and model checks (Aceso, EuroSys'24 §3: every op of a stage picks its own
tensor-parallel degree; its data-parallel degree is the stage's GPUs over it).

Kept out of workloads/plan.py so that module stays about one concept. Meaning of the fields:

* `op_tp` — {op name: degree} applied to every physical stage;
* `stage_op_tp` — one such map per physical stage, overriding `op_tp` for that stage.

Op names are the zoo's per-block names ("attn.qkv", "mlp.fc1", ...), so a name covers that op
in every block of the stage. An op not named runs at the stage's degree (`tp_of_stage`). An op
at degree t on a stage of G GPUs runs on G / t data-parallel replicas; each takes
(pipeline micro-batch) · t / G samples, which must be a whole number.
"""

from __future__ import annotations

from typing import Any

from trainsim.errors import PlanError, unknown_name
from trainsim.workloads.plan_fields import _divisors, _int, _items, _pairs

OpTp = tuple[tuple[str, int], ...]
"""(op name, tensor-parallel degree) pairs, in the order given."""

_EXPECTED = 'a map from op name to tensor-parallel degree, e.g. {"mlp.fc1": 2}'


def op_tp_pairs(name: str, value: Any) -> OpTp:
    """A {op name: degree} map (or [name, degree] pairs) as checked pairs, or a PlanError
    naming `plan.<name>`."""
    pairs = _pairs(name, value, _EXPECTED)
    return tuple((k, _int(f"{name}[{k!r}]", v)) for k, v in pairs)


def stage_op_tp_maps(value: Any) -> tuple[OpTp, ...]:
    """`stage_op_tp` as one checked map per stage (an empty map or null: no per-op degrees)."""
    maps = _items("stage_op_tp", value, f"a list with one map per stage, each {_EXPECTED}")
    return tuple(() if m is None else op_tp_pairs(f"stage_op_tp[{s}]", m)
                 for s, m in enumerate(maps))


def _field(plan: Any, stage: int, op: str) -> str:
    """The plan field that set `op`'s degree on `stage` (for error messages)."""
    if plan.stage_op_tp is not None and any(k == op for k, _ in plan.stage_op_tp[stage]):
        return f"plan.stage_op_tp[{stage}][{op!r}]"
    return f"plan.op_tp[{op!r}]"


def check_op_tp(plan: Any) -> None:
    """What the per-op degrees need from the rest of the plan (no model or cluster needed):
    one map per stage; where some op's degree differs from its stage's, no sequence, expert
    parallelism or ZeRO (their layouts and shards assume one tp group per stage), each degree
    divides the stage's GPUs, and each op's replicas split every micro-batch evenly."""
    if plan.stage_op_tp is not None and len(plan.stage_op_tp) != plan.pp:
        raise PlanError(f"plan.stage_op_tp has {len(plan.stage_op_tp)} maps but pp={plan.pp}")
    if not plan.op_tp and not any(plan.stage_op_tp or ()):
        return
    if plan.stage_tp is not None and len(plan.stage_tp) != plan.pp:
        return  # `check` names plan.stage_tp's length first
    if not any(plan.has_op_tp(s) for s in range(plan.pp)):
        return  # every named op runs at its stage's degree: a one-degree plan
    field = "plan.op_tp" if plan.op_tp else "plan.stage_op_tp"
    for other, bad, why in (("sp", plan.sp, "sequence parallelism splits along one tp group"),
                            ("ep", plan.ep > 1, "expert groups span the stage's tp ranks"),
                            ("zero", plan.zero > 0, "ZeRO shards over one dp degree per stage")):
        if bad:
            raise PlanError(f"{field} (per-op degrees) cannot be combined with "
                            f"plan.{other}={getattr(plan, other)!r} ({why})")
    batches = sorted({m.batch_size for m in plan.micro_batch_list(1)})
    for s in range(plan.pp):
        gpus, tp = plan.gpus_of_stage(s), plan.tp_of_stage(s)
        for op, t in plan.op_tp_of_stage(s).items():
            if gpus % t:
                raise PlanError(f"{_field(plan, s, op)}={t} must divide stage {s}'s {gpus} GPUs "
                                f"(valid: {_divisors(gpus)})")
            for b in batches:
                replica = plan.replica_batch(s, b)
                if replica * t % tp:
                    dp = gpus // t
                    raise PlanError(
                        f"{_field(plan, s, op)}={t}: the op runs on {dp} data-parallel "
                        f"replicas (stage {s}'s {gpus} GPUs / {t}), which must divide the "
                        f"stage's micro-batch of {replica * gpus // tp} samples")


def check_op_tp_model(plan: Any, model: Any) -> None:
    """Op names exist in the model; degrees divide its heads, KV heads and FFN width."""
    known = set(getattr(model, "op_names", list)())
    heads = int(getattr(model, "num_heads", 0) or 0)
    kv_heads = int(getattr(model, "num_kv_heads", 0) or heads)
    ffn = int(getattr(model, "ffn_hidden", 0) or 0)
    for s in range(plan.pp):
        for op, t in plan.op_tp_of_stage(s).items():
            where = _field(plan, s, op)
            if known and op not in known:
                raise PlanError(f"{where}: {unknown_name('op', op, known)}")
            if heads and heads % t:
                raise PlanError(f"{where}={t} does not divide model.num_heads={heads} "
                                f"(valid: {[d for d in _divisors(heads) if d <= 64]})")
            if kv_heads and kv_heads % t and t % kv_heads:
                raise PlanError(f"{where}={t} and model.num_kv_heads={kv_heads}: one must "
                                f"divide the other")
            if ffn and ffn % t:
                raise PlanError(f"{where}={t} does not divide model.ffn_hidden={ffn}")


def op_tp_of_stage(plan: Any, stage: int) -> dict[str, int]:
    """{op name: degree} on a physical stage: `op_tp` updated by `stage_op_tp[stage]`."""
    out = dict(plan.op_tp)
    if plan.stage_op_tp is not None:
        out.update(plan.stage_op_tp[stage])
    return out


__all__ = ["OpTp", "check_op_tp", "check_op_tp_model", "op_tp_of_stage",
           "op_tp_pairs", "stage_op_tp_maps"]
