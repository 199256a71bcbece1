"""Exports of a searched plan: trainsim JSON, Aceso's config JSON, Megatron-LM flags.

* trainsim JSON is `ParallelPlan.to_json()` (round-trips through `ParallelPlan.from_json`).
* Aceso's runtime (a Megatron-LM fork) reads a JSON config with per-stage lists and per-op
  lists: ``num_stages``, ``num_gpus`` (per stage), ``num_ops_in_each_stage``,
  ``model_parallel_size_of_each_op`` / ``data_parallel_size_of_each_op`` (per stage, per op),
  ``recompute_ops`` (per stage, per op, 0/1), ``algo_of_each_op``, ``checkpoint_activations``,
  ``resharding_stages``, ``micro_batch_size``, ``global_batch_size`` (key names from Aceso's
  runtime FlexModelConfig). Ops are Aceso's op names in model order (search/aceso/profile.py's
  map); a stage boundary falls between layers. Per-op degrees (`op_tp`/`stage_op_tp`) fill
  the per-op tp/dp lists (dp = stage GPUs / tp); ``resharding_stages[s]`` says whether stage
  s's ops differ in tp or dp (so Aceso's runtime inserts resharding between them), as Aceso's
  own config writer sets it. ``trainsim_stage_tp`` (ignored by Aceso) keeps each stage's
  boundary degree so the import is exact; without it the stage's first op's degree is taken.
  `from_aceso_config` reads such a config back into ParallelPlan fields; per-op recompute
  flags that differ between layers of one stage become the union of recomputed op names
  (trainsim's recompute is per stage), and so must per-op degrees (one degree per op name
  per stage, else a SpecError).
* Megatron-LM flags exist only for plans Megatron-LM runs as they are (`megatron_blocker`):
  one tp and dp, an even layer split and batch split, none/selective/full recompute, 1F1B or
  interleaved, ZeRO 0/1, no per-op degrees, GPU clocks or placement. `to_megatron_flags` lists
  the flags (and the Megatron-LM source they were checked against); for any other plan
  megatron_flags.txt is one comment line naming the field that prevents it.
"""

from __future__ import annotations

import json
from typing import Any

from trainsim.errors import SpecError
from trainsim.hwmodels.cluster import Cluster
from trainsim.search.aceso.profile import aceso_family, aceso_size, layer_op_map
from trainsim.search.planner import SearchResult
from trainsim.workloads.model import ModelSpec, build_graph
from trainsim.workloads.plan import ParallelPlan


def _stage_ops(plan: ParallelPlan, model: ModelSpec
               ) -> list[list[tuple[str, list[str], bool]]]:
    """Per stage: (Aceso op name, zoo op names, is in a recomputable block) in model order."""
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


def to_aceso_config(plan: ParallelPlan, model: ModelSpec, cluster: Cluster | None = None
                    ) -> dict[str, Any]:
    """Aceso's runtime config for `plan` (module docstring)."""
    graph = build_graph(model, 1)
    selective = {op.name for la in graph.layers for op in la.ops if op.selective_recompute}
    stage_ops = _stage_ops(plan, model)
    tp = [plan.tp_of_stage(s) for s in range(plan.pp)]
    gpus = [plan.gpus_of_stage(s) for s in range(plan.pp)]
    op_tp = [[plan.op_tp_of_stage(s).get(zoo[0], tp[s]) for _, zoo, _ in ops]
             for s, ops in enumerate(stage_ops)]
    op_dp = [[gpus[s] // t for t in degrees] for s, degrees in enumerate(op_tp)]
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
        "num_gpus": gpus,
        "num_ops_in_each_stage": [len(ops) for ops in stage_ops],
        "op_names": [[n for n, _, _ in ops] for ops in stage_ops],
        "model_parallel_size_of_each_op": op_tp,
        "data_parallel_size_of_each_op": op_dp,
        "recompute_ops": rec,
        "algo_of_each_op": [[0] * len(ops) for ops in stage_ops],
        "checkpoint_activations": [bool(any(r)) for r in rec],
        "resharding_stages": [len(set(degrees)) > 1 for degrees in op_tp],
        "trainsim_stage_tp": tp,
    }


def from_aceso_config(config: dict[str, Any], model: ModelSpec) -> dict[str, Any]:
    """ParallelPlan fields from an Aceso config (stage_gpus/stage_tp/stage_layers/
    stage_recompute form).

    Raises:
        SpecError: a key is missing, an op's tp and dp do not multiply to the stage's GPUs,
            one op name has two degrees in one stage, or the op counts do not match the model.
    """
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
    stage_layers, stage_tp, stage_op_tp = [], [], []
    stage_rc: list[str | list[str]] = []
    start = 0
    for s in range(pp):
        ops = flat[start:start + counts[s]]
        rec = [int(x) for x in config["recompute_ops"][s]]
        start += counts[s]
        stage_layers.append(len({b for _, _, b in ops if b is not None}))
        degrees = _stage_degrees(config, s, ops)
        given = config.get("trainsim_stage_tp")
        tp = int(given[s]) if isinstance(given, list) and len(given) == pp \
            else degrees[ops[0][1][0]]
        stage_tp.append(tp)
        stage_op_tp.append({n: t for n, t in degrees.items() if t != tp})
        in_block = [(zoo, r) for (_, zoo, b), r in zip(ops, rec) if b is not None]
        flags = [r for _, r in in_block]
        if flags and all(flags):
            stage_rc.append("full")
        elif not any(flags):
            stage_rc.append("none")
        else:
            names = sorted({z for zoo, r in in_block if r for z in zoo})
            stage_rc.append("selective" if set(names) == selective else names)
    fields = {"pp": pp, "dp": 1, "tp": 1, "stage_gpus": [int(g) for g in config["num_gpus"]],
              "stage_tp": stage_tp, "stage_layers": stage_layers, "stage_recompute": stage_rc,
              "micro_batch_size": int(config["micro_batch_size"]),
              "global_batch": int(config["global_batch_size"]), "schedule": "1f1b"}
    if any(stage_op_tp):
        fields["stage_op_tp"] = stage_op_tp
    return fields


def _stage_degrees(config: dict[str, Any], s: int, ops: list[tuple[str, list[str], Any]]
                   ) -> dict[str, int]:
    """{zoo op name: tp degree} of stage s from the per-op lists (one degree per name)."""
    tps = [int(t) for t in config["model_parallel_size_of_each_op"][s]]
    dps = config.get("data_parallel_size_of_each_op")
    gpus = int(config["num_gpus"][s])
    if len(tps) != len(ops):
        raise SpecError(f"Aceso config model_parallel_size_of_each_op[{s}] has {len(tps)} "
                        f"entries but stage {s} has {len(ops)} ops")
    out: dict[str, int] = {}
    for k, ((name, zoo, _), t) in enumerate(zip(ops, tps)):
        dp = int(dps[s][k]) if dps is not None else gpus // max(t, 1)
        if t < 1 or t * dp != gpus:
            raise SpecError(f"Aceso config stage {s} op {k} ({name}): tp {t} × dp {dp} != "
                            f"num_gpus[{s}]={gpus}")
        for z in zoo:
            if out.setdefault(z, t) != t:
                raise SpecError(f"Aceso config stage {s} gives op {z!r} degrees {out[z]} and "
                                f"{t}; trainsim holds one degree per op name per stage")
    return out


MEGATRON_SCHEDULES = ("1f1b", "interleaved")
"""trainsim schedules Megatron-LM runs: 1F1B (forward_backward_pipelining_without_interleaving,
and forward_backward_no_pipelining at pp 1) and the interleaved 1F1B of virtual stages."""


def megatron_blocker(plan: ParallelPlan, num_layers: int) -> str | None:
    """None when Megatron-LM's flags express `plan` exactly, else the first field that
    prevents it, named ``plan.<field>=<value> (why)`` (see `to_megatron_flags`)."""
    pp = plan.pp
    if plan.micro_batches is not None:
        return ("plan.micro_batches (explicit variable-shape micro-batches; Megatron-LM runs "
                "one --micro-batch-size)")
    if plan.replica_micro_batches is not None:
        return ("plan.replica_micro_batches (each replica's own variable micro-batches; "
                "Megatron-LM runs one --micro-batch-size on every rank)")
    split = plan.dp_batch_split
    if split is not None and len(set(split)) > 1:
        return (f"plan.dp_batch_split={list(split)} (uneven per-replica batches; Megatron-LM "
                "splits --global-batch-size evenly over the data-parallel ranks)")
    per_op = [s for s in range(pp) if plan.has_op_tp(s)]
    if per_op:
        return (f"plan.op_tp/stage_op_tp (per-op degrees on stages {per_op}; Megatron-LM runs "
                "one tensor-parallel degree)")
    if len({plan.tp_of_stage(s) for s in range(pp)}) > 1:
        return (f"plan.stage_tp={[plan.tp_of_stage(s) for s in range(pp)]} (per-stage "
                "tensor-parallel degrees; Megatron-LM runs one)")
    if len({plan.dp_of_stage(s) for s in range(pp)}) > 1:
        return (f"plan.stage_gpus={[plan.gpus_of_stage(s) for s in range(pp)]} (per-stage "
                "data-parallel degrees; Megatron-LM runs one)")
    rcs = [plan.recompute_of_stage(s) for s in range(pp)]
    if len({str(r) for r in rcs}) > 1:
        return (f"plan.stage_recompute={[r if isinstance(r, str) else list(r) for r in rcs]} "
                "(per-stage recompute; Megatron-LM recomputes alike on every stage)")
    if not isinstance(rcs[0], str):
        return (f"plan.recompute={list(rcs[0])} (an op list; Megatron-LM's flags give "
                "--recompute-granularity full or selective)")
    layers = plan.layers_per_stage(num_layers)
    if max(layers) != min(layers):
        field = "plan.stage_layers" if plan.stage_layers is not None else "layers per stage"
        return (f"{field}={list(layers)} (not an even split of {num_layers} layers over "
                f"{plan.num_stages} stages; Megatron-LM's flags give one split)")
    if plan.schedule not in MEGATRON_SCHEDULES:
        return (f"plan.schedule={plan.schedule!r} (Megatron-LM runs 1F1B, or interleaved 1F1B "
                "with virtual stages)")
    if plan.zero >= 2:
        return (f"plan.zero={plan.zero} (ZeRO-{plan.zero}; Megatron-LM's "
                "--use-distributed-optimizer shards optimizer states only, ZeRO-1)")
    if plan.overlap_param_gather and not plan.overlap_grad_reduce:
        return ("plan.overlap_param_gather without plan.overlap_grad_reduce (Megatron-LM "
                "requires --overlap-grad-reduce with --overlap-param-gather)")
    if plan.tp_comm_overlap and not plan.sp:
        return ("plan.tp_comm_overlap without plan.sp (Megatron-LM's --tp-comm-overlap "
                "requires --sequence-parallel)")
    if plan.ep > 1:
        return (f"plan.ep={plan.ep} (trainsim's expert placement over dp×tp is not mapped to "
                "Megatron-LM's expert-parallel flags)")
    if plan.freq_mhz is not None or plan.stage_freq_mhz is not None \
            or plan.instruction_freq_mhz:
        return ("plan.freq_mhz/stage_freq_mhz/instruction_freq_mhz (GPU clocks are no "
                "Megatron-LM flag)")
    if plan.placement is not None:
        return f"plan.placement={list(plan.placement)} (stage placement is no Megatron-LM flag)"
    if plan.node_order is not None and plan.node_order != tuple(range(len(plan.node_order))):
        return (f"plan.node_order={list(plan.node_order)} (device placement is no Megatron-LM "
                "flag)")
    return None


def is_uniform(plan: ParallelPlan, num_layers: int) -> bool:
    """Whether Megatron-LM's flags express `plan` exactly (`megatron_blocker` is None): one
    tp and dp, an even layer split and batch split, none/selective/full recompute, 1F1B or
    interleaved, ZeRO 0/1, no per-op degrees, frequencies or placement (a node_order in the
    order the cluster is written is the launch order, fine)."""
    return megatron_blocker(plan, num_layers) is None


def megatron_data_parallel(plan: ParallelPlan) -> int:
    """Megatron-LM's data-parallel size of a uniform plan (world size / (tp·pp·cp))."""
    return plan.dp if plan.stage_gpus is None else plan.dp_of_stage(0)


def to_megatron_flags(plan: ParallelPlan, model: ModelSpec) -> str:
    """Megatron-LM command-line flags that run `plan` (one line), for a plan it can run.

    Megatron-LM has no data-parallel flag: its dp is world size / (tp·pp·cp), so the plan's
    dp is the number of GPUs it is launched on (`search_output_files` writes that as a comment
    line above the flags). Emitted: ``--tensor-model-parallel-size``,
    ``--pipeline-model-parallel-size``, ``--context-parallel-size`` (cp > 1),
    ``--num-layers-per-virtual-pipeline-stage`` (interleaved), ``--micro-batch-size`` (samples
    per data-parallel rank), ``--global-batch-size``, ``--seq-length`` (a plan seq_len),
    ``--sequence-parallel``, ``--recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1`` or ``--recompute-granularity selective`` (core attention,
    Megatron's default recompute module), ``--use-distributed-optimizer`` (ZeRO-1),
    ``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--tp-comm-overlap``, ``--fp16`` /
    ``--bf16`` (fp32: no flag, Megatron's default).

    Flag names checked against NVIDIA/Megatron-LM at d98e8a64 (2026-08-22):
    megatron/training/arguments.py defines --num-layers-per-virtual-pipeline-stage,
    --overlap-grad-reduce, --overlap-param-gather (asserts --use-distributed-optimizer and
    --overlap-grad-reduce), --use-distributed-optimizer, --seq-length, and asserts
    --tp-comm-overlap needs --sequence-parallel; the rest are generated from dataclass fields
    by argument_utils.ArgumentGroupFactory ("--" + name.replace("_", "-")):
    core/model_parallel_config.py's tensor_model_parallel_size, pipeline_model_parallel_size,
    context_parallel_size, sequence_parallel, fp16, bf16, tp_comm_overlap;
    core/transformer/transformer_config.py's recompute_granularity, recompute_method,
    recompute_num_layers; training/config/training_config.py's micro_batch_size,
    global_batch_size.

    Raises:
        SpecError: Megatron-LM cannot run the plan; the message names the field
            (`megatron_blocker`).
    """
    blocks = len(build_graph(model, 1).transformer_layers())
    blocker = megatron_blocker(plan, blocks)
    if blocker is not None:
        raise SpecError("Megatron-LM flags need a uniform plan Megatron-LM can run; this plan "
                        f"has {blocker}")
    dp = megatron_data_parallel(plan)
    mbs = plan.micro_batch_size if plan.stage_gpus is None else plan.micro_batch_size // dp
    assert plan.num_micro_batches is not None  # set in __post_init__
    gbs = plan.global_batch or mbs * dp * plan.num_micro_batches
    flags = [f"--tensor-model-parallel-size {plan.tp_of_stage(0)}",
             f"--pipeline-model-parallel-size {plan.pp}"]
    if plan.cp > 1:
        flags.append(f"--context-parallel-size {plan.cp}")
    if plan.virtual_stages > 1:
        per_chunk = plan.layers_per_stage(blocks)[0]
        flags.append(f"--num-layers-per-virtual-pipeline-stage {per_chunk}")
    flags += [f"--micro-batch-size {mbs}", f"--global-batch-size {gbs}"]
    if plan.seq_len is not None:
        flags.append(f"--seq-length {plan.seq_len}")
    if plan.sp:
        flags.append("--sequence-parallel")
    rc = plan.recompute_of_stage(0)
    if rc == "full":
        flags.append("--recompute-granularity full --recompute-method uniform "
                     "--recompute-num-layers 1")
    elif rc == "selective":
        flags.append("--recompute-granularity selective")
    if plan.zero == 1:
        flags.append("--use-distributed-optimizer")
    if plan.overlap_grad_reduce and (dp > 1 or plan.overlap_param_gather):
        flags.append("--overlap-grad-reduce")  # off in Megatron-LM unless given
    if plan.overlap_param_gather:
        flags.append("--overlap-param-gather")
    if plan.tp_comm_overlap:
        flags.append("--tp-comm-overlap")
    if plan.dtype in ("fp16", "bf16"):
        flags.append(f"--{plan.dtype}")
    return " ".join(flags)


def megatron_flags_file(plan: ParallelPlan, model: ModelSpec) -> str:
    """megatron_flags.txt: a comment line with the world size the flags assume, then the flags;
    or one comment line naming the field Megatron-LM cannot run."""
    blocker = megatron_blocker(plan, len(build_graph(model, 1).transformer_layers()))
    if blocker is not None:
        return f"# no Megatron-LM flags: this plan has {blocker}\n"
    flags = to_megatron_flags(plan, model)
    dp, tp, cp = megatron_data_parallel(plan), plan.tp_of_stage(0), plan.cp
    return (f"# launch on {dp * cp * tp * plan.pp} GPUs: Megatron-LM's data-parallel size = "
            f"world size / (tp {tp} x pp {plan.pp} x cp {cp}) = {dp}\n{flags}\n")


__all__ = ["MEGATRON_SCHEDULES", "from_aceso_config", "is_uniform", "megatron_blocker",
           "megatron_flags_file", "to_aceso_config", "to_megatron_flags"]


SEARCH_OUTPUT_FILES = ("best_plan.json", "aceso_config.json", "megatron_flags.txt",
                       "ranked.json", "search_log.json")
"""What `sim search --out DIR` writes."""


def search_output_files(result: SearchResult, model: ModelSpec, cluster: Cluster
                        ) -> dict[str, str]:
    """The text of each file a search writes: ranked.json and search_log.json always; with a
    best plan also best_plan.json, aceso_config.json and megatron_flags.txt
    (`megatron_flags_file`: the world size and the flags, or one comment line naming the field
    Megatron-LM cannot run). No wall-clock figures (elapsed_s, search_s): the same search
    writes the same bytes."""
    data = result.to_dict()
    files = {"ranked.json": json.dumps(data["ranked"], indent=2, sort_keys=True) + "\n",
             "search_log.json": json.dumps([r.to_dict(timing=False) for r in result.log],
                                           indent=2, sort_keys=True) + "\n"}
    best = result.best
    if best is None or best.plan is None:
        return files
    files["best_plan.json"] = best.plan.to_json()
    config = to_aceso_config(best.plan, model, cluster)
    files["aceso_config.json"] = json.dumps(config, indent=2, sort_keys=True) + "\n"
    files["megatron_flags.txt"] = megatron_flags_file(best.plan, model)
    return files
