"""Exports of a searched plan: trainsim JSON, Aceso's config JSON, Megatron-LM flags.

* trainsim JSON is `ParallelPlan.to_json()` (round-trips through `ParallelPlan.from_json`).
* Aceso's runtime (a Megatron-LM fork) reads a JSON config with per-stage lists and per-op
  lists: ``num_stages``, ``num_gpus`` (per stage), ``num_ops_in_each_stage``,
  ``model_parallel_size_of_each_op`` / ``data_parallel_size_of_each_op`` (per stage, per op),
  ``recompute_ops`` (per stage, per op, 0/1), ``algo_of_each_op``, ``checkpoint_activations``,
  ``resharding_stages``, ``micro_batch_size``, ``global_batch_size`` (key names from Aceso's
  runtime FlexModelConfig). Ops are Aceso's op names in model order (search/aceso_profile.py's
  map); a stage boundary falls between layers. `from_aceso_config` reads such a config back
  into ParallelPlan fields; per-op flags that differ between layers of one stage become the
  union of recomputed op names (trainsim's recompute is per stage).
* Megatron-LM flags exist for uniform plans only (one tp, one dp, even split):
  ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``, ``--micro-batch-size``,
  ``--global-batch-size``, ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1`` or ``--recompute-granularity selective``.
"""

from __future__ import annotations

from typing import Any

from trainsim.errors import SpecError
from trainsim.search.aceso_profile import aceso_family, aceso_size, layer_op_map


def _stage_ops(plan: Any, model: Any) -> list[list[tuple[str, list[str], bool]]]:
    """Per stage: (Aceso op name, zoo op names, is in a recomputable block) in model order."""
    from trainsim.workloads.model import build_graph

    graph = build_graph(model, 1)
    counts = plan.layers_per_stage(len(graph.transformer_layers()))
    out: list[list[tuple[str, list[str], bool]]] = [[] for _ in counts]
    stage, seen = 0, 0
    for i, layer in enumerate(graph.layers):
        if layer.recomputable:
            while seen >= counts[stage]:
                stage, seen = stage + 1, 0
            seen += 1
        for names, zoo in layer_op_map(model, layer, i):
            for n in names:
                out[stage].append((n, zoo, layer.recomputable))
    return out


def _recomputed(policy: str | tuple[str, ...], zoo: list[str], in_block: bool,
                selective: set[str]) -> bool:
    if not in_block:
        return False
    if policy == "full":
        return True
    if policy == "none":
        return False
    names = selective if policy == "selective" else set(policy)
    return any(z in names for z in zoo)


def to_aceso_config(plan: Any, model: Any, cluster: Any | None = None) -> dict[str, Any]:
    """Aceso's runtime config for `plan` (module docstring)."""
    from trainsim.workloads.model import build_graph

    graph = build_graph(model, 1)
    selective = {op.name for la in graph.layers for op in la.ops if op.selective_recompute}
    stage_ops = _stage_ops(plan, model)
    tp = [plan.tp_of_stage(s) for s in range(plan.pp)]
    dp = [plan.dp_of_stage(s) for s in range(plan.pp)]
    mbs = plan.micro_batch_size * (plan.dp if plan.stage_gpus is None else 1)
    rec = [[int(_recomputed(plan.recompute_of_stage(s), zoo, blk, selective))
            for _, zoo, blk in ops] for s, ops in enumerate(stage_ops)]
    return {
        "model_name": aceso_family(model), "model_size": aceso_size(model),
        "num_layers": len(graph.transformer_layers()),
        "seq_length": int(getattr(model, "seq_len", 0) or 0),
        "hidden_size": int(getattr(model, "hidden", 0) or 0),
        "num_attention_heads": int(getattr(model, "num_heads", 0) or 0),
        "global_batch_size": plan.global_batch, "micro_batch_size": mbs,
        "num_stages": plan.pp,
        "num_gpus": [plan.gpus_of_stage(s) for s in range(plan.pp)],
        "num_ops_in_each_stage": [len(ops) for ops in stage_ops],
        "op_names": [[n for n, _, _ in ops] for ops in stage_ops],
        "model_parallel_size_of_each_op": [[tp[s]] * len(ops) for s, ops in enumerate(stage_ops)],
        "data_parallel_size_of_each_op": [[dp[s]] * len(ops) for s, ops in enumerate(stage_ops)],
        "recompute_ops": rec,
        "algo_of_each_op": [[0] * len(ops) for ops in stage_ops],
        "checkpoint_activations": [bool(any(r)) for r in rec],
        "resharding_stages": [s > 0 and (tp[s], dp[s]) != (tp[s - 1], dp[s - 1])
                              for s in range(plan.pp)],
    }


def from_aceso_config(config: dict[str, Any], model: Any) -> dict[str, Any]:
    """ParallelPlan fields from an Aceso config (stage_gpus/stage_tp/stage_layers/
    stage_recompute form).

    Raises:
        SpecError: a key is missing, per-op degrees vary inside a stage (per-op tp/dp is out
            of trainsim's scope), or the op counts do not match the model.
    """
    from trainsim.workloads.model import build_graph

    for key in ("num_stages", "num_gpus", "num_ops_in_each_stage",
                "model_parallel_size_of_each_op", "recompute_ops", "micro_batch_size",
                "global_batch_size"):
        if key not in config:
            raise SpecError(f"Aceso config lacks {key!r}")
    pp = int(config["num_stages"])
    graph = build_graph(model, 1)
    # op list of the whole model, to find which blocks each stage holds
    flat: list[tuple[str, list[str], int | None]] = []
    block = -1
    for i, layer in enumerate(graph.layers):
        if layer.recomputable:
            block += 1
        for names, zoo in layer_op_map(model, layer, i):
            for n in names:
                flat.append((n, zoo, block if layer.recomputable else None))
    counts = [int(c) for c in config["num_ops_in_each_stage"]]
    if sum(counts) != len(flat) or len(counts) != pp:
        raise SpecError(f"Aceso config num_ops_in_each_stage={counts} (sum {sum(counts)}) does "
                        f"not match {model.name}'s {len(flat)} ops in {pp} stages")
    selective = {op.name for la in graph.layers for op in la.ops if op.selective_recompute}
    stage_layers, stage_tp, stage_rc = [], [], []
    start = 0
    for s in range(pp):
        ops = flat[start:start + counts[s]]
        rec = [int(x) for x in config["recompute_ops"][s]]
        start += counts[s]
        stage_layers.append(len({b for _, _, b in ops if b is not None}))
        tps = {int(t) for t in config["model_parallel_size_of_each_op"][s]}
        if len(tps) != 1:
            raise SpecError(f"Aceso config stage {s} has per-op tp degrees {sorted(tps)}; "
                            f"trainsim simulates one tp per stage")
        stage_tp.append(tps.pop())
        in_block = [(zoo, r) for (_, zoo, b), r in zip(ops, rec) if b is not None]
        flags = [r for _, r in in_block]
        if flags and all(flags):
            stage_rc.append("full")
        elif not any(flags):
            stage_rc.append("none")
        else:
            names = sorted({z for zoo, r in in_block if r for z in zoo})
            stage_rc.append("selective" if set(names) == selective else names)
    return {"pp": pp, "dp": 1, "tp": 1, "stage_gpus": [int(g) for g in config["num_gpus"]],
            "stage_tp": stage_tp, "stage_layers": stage_layers, "stage_recompute": stage_rc,
            "micro_batch_size": int(config["micro_batch_size"]),
            "global_batch": int(config["global_batch_size"]), "schedule": "1f1b"}


def is_uniform(plan: Any, num_layers: int) -> bool:
    """One tp, one dp, one recompute policy (none/selective/full) and an even layer split."""
    pp = plan.pp
    tps = {plan.tp_of_stage(s) for s in range(pp)}
    dps = {plan.dp_of_stage(s) for s in range(pp)}
    rcs = {str(plan.recompute_of_stage(s)) for s in range(pp)}
    layers = plan.layers_per_stage(num_layers)
    return (len(tps) == len(dps) == len(rcs) == 1 and rcs <= {"none", "selective", "full"}
            and max(layers) - min(layers) == 0 and plan.virtual_stages == 1)


def to_megatron_flags(plan: Any, model: Any) -> str:
    """Megatron-LM command-line flags of a uniform plan.

    Raises:
        SpecError: the plan is not uniform (Megatron-LM runs one tp/dp and an even split).
    """
    from trainsim.workloads.model import build_graph

    blocks = len(build_graph(model, 1).transformer_layers())
    if not is_uniform(plan, blocks):
        raise SpecError("Megatron-LM flags need a uniform plan (one tp and dp for every stage, "
                        f"layers split evenly); this plan has stage_layers="
                        f"{list(plan.layers_per_stage(blocks))}, "
                        f"tp={[plan.tp_of_stage(s) for s in range(plan.pp)]}")
    dp = plan.dp_of_stage(0)
    mbs = plan.micro_batch_size * (plan.dp if plan.stage_gpus is None else 1) // dp
    flags = [f"--tensor-model-parallel-size {plan.tp_of_stage(0)}",
             f"--pipeline-model-parallel-size {plan.pp}",
             f"--micro-batch-size {mbs}", f"--global-batch-size {plan.global_batch}"]
    if plan.sp:
        flags.append("--sequence-parallel")
    rc = plan.recompute_of_stage(0)
    if rc == "full":
        flags.append("--recompute-granularity full --recompute-method uniform "
                     "--recompute-num-layers 1")
    elif rc == "selective":
        flags.append("--recompute-granularity selective")
    if plan.zero >= 1:
        flags.append("--use-distributed-optimizer")
    return " ".join(flags)


__all__ = ["from_aceso_config", "is_uniform", "to_aceso_config", "to_megatron_flags"]
