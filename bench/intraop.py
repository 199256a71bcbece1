"""Intra-operator sharding benchmark (issue 17): Megatron-hand TP vs Alpa's ILP vs CFP.

For each model (GPT-3 1.3B; LLaMA-2 7B, SwiGLU; LLaMA-2 with GQA — llama2-7b with 8 KV heads,
since the zoo's GQA model, 70B, fits no 8-GPU mesh; GShard-style MoE 1.3B with 8 experts;
BERT-Large), node type (A100-SXM4-40GB, V100-SXM2-32GB) and mesh (4 GPUs 1-D, 8 GPUs 1-D,
2 × 4 on two 4-GPU nodes: axis 0 across the nodes) it prints each method's plan as the engine
scores it: samples/s, GPU memory, search time (wall clock, this machine), Oracle evaluations
(engine runs of CFP), the ILP's strategy space (its variables) and MIP gap, and CFP's gain
over the ILP and over Megatron. "intraop+rc" is CFP with per-block recompute where memory
binds (beyond CFP; the same as intraop where it does not). Under the table, for every case where CFP's plan differs from
the ILP's, the ops whose strategy differs, and both plans under both cost models: the ILP
prices with Alpa's α-β model (elementwise ops free, compute split evenly, no link sharing
between a mesh axis' groups), CFP with the engine. Where the ILP's model rates its own plan
faster but the engine does not, the model is why CFP wins.

A case whose models fit no plan in the GPU's memory prints the smallest limit any plan meets.

Usage: ``python bench/intraop.py [--quick] [--json] [--ilp-limit-s 60]``
(``--quick``: GPT and MoE on A100 only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from typing import Any

from trainsim.hwmodels.cluster import parse_cluster
from trainsim.search.intraop.costs import AlphaBetaPricing
from trainsim.search.intraop.planner import IntraopMemoryError, IntraopResult, run_intraop
from trainsim.search.intraop.problem import build_problem, plan_cost
from trainsim.workloads.model import ModelSpec
from trainsim.workloads.zoo import get_model


def _models(quick: bool) -> list[tuple[str, ModelSpec, int]]:
    """(label, model, global batch)."""
    llama = get_model("llama2-7b")
    gqa = dataclasses.replace(llama, name="llama2-7b-gqa8", num_kv_heads=8)
    out = [("gpt3-1.3b", get_model("gpt3-1.3b"), 8),
           ("gpt-moe-1.3b-8e", get_model("gpt-moe-1.3b-8e"), 8)]
    if not quick:
        out[1:1] = [("llama2-7b", llama, 4), ("llama2-7b-gqa8", gqa, 4)]
        out.append(("bert-large", get_model("bert-large"), 32))
    return out


def _clusters(quick: bool) -> list[tuple[str, str, str]]:
    """(cluster spec, mesh, label)."""
    out = []
    for gpu in ("A100-SXM4-40GB",) if quick else ("A100-SXM4-40GB", "V100-SXM2-32GB"):
        out += [(f"1x4x{gpu}", "4", f"{gpu} 4"), (f"1x8x{gpu}", "8", f"{gpu} 8"),
                (f"2x4x{gpu}", "2x4", f"{gpu} 2x4")]
    return out


def _why(cfp: IntraopResult, ilp: IntraopResult) -> str:
    """Both plans under both cost models: the ILP's α-β objective and the engine."""
    graph, mesh = cfp.plan.graph, cfp.plan.mesh
    pricing = AlphaBetaPricing(cfp.cluster, mesh, cfp.plan.dtype)
    problem = build_problem(graph, cfp.blocks, cfp.cluster, pricing, engine=False)
    a_cfp, a_ilp = plan_cost(problem, cfp.choice)[0], plan_cost(problem, ilp.choice)[0]
    return (f"alpha-beta model: CFP plan {a_cfp * 1e3:.1f} ms vs ILP plan {a_ilp * 1e3:.1f} ms; "
            f"engine: CFP plan {cfp.iteration_time_s * 1e3:.1f} ms vs ILP plan "
            f"{ilp.iteration_time_s * 1e3:.1f} ms")


def _diff(a: IntraopResult, b: IntraopResult) -> str:
    """Ops whose strategy differs between two plans: `name: a/b ×count`."""
    seen: Counter[str] = Counter()
    for n, x, y in zip(a.plan.graph.nodes, a.plan.strategies, b.plan.strategies, strict=True):
        if x != y:
            seen[f"{n.op.name}: {x.name}/{y.name}"] += 1
    return ", ".join(f"{k} ×{v}" for k, v in seen.most_common(6))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ilp-limit-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    head = (f"{'model':<16} {'GPUs':<19} {'method':<10} {'samples/s':>9} {'GB/GPU':>7} "
            f"{'search s':>8} {'evals':>6} {'ILP vars':>8} {'MIP gap':>8} {'CFP/ILP':>8} "
            f"{'CFP/Meg':>8}")
    if not args.json:
        print(head)
        print("-" * len(head))
    for label, spec, batch in _models(args.quick):
        for cluster_spec, mesh, where in _clusters(args.quick):
            cluster = parse_cluster(cluster_spec)
            dtype = "fp16" if cluster.gpu(0).name.startswith("V100") else spec.dtype
            got: dict[str, IntraopResult] = {}
            for method in ("megatron", "alpa", "intraop", "intraop+rc"):
                try:
                    got[method] = run_intraop(spec, cluster, method=method.split("+")[0],
                                              global_batch=batch, mesh=mesh,
                                              time_limit_s=args.ilp_limit_s, dtype=dtype,
                                              recompute=method.endswith("+rc"))
                except IntraopMemoryError as exc:
                    notes.append(f"{label} on {where}, {method}: {exc}")
            for method, r in got.items():
                cfp, ilp, meg = got.get("intraop"), got.get("alpa"), got.get("megatron")
                row = {"model": label, "gpus": where, "method": method,
                       "samples_per_s": r.samples_per_s, "gb_per_gpu": r.memory_bytes / 1e9,
                       "search_s": r.search_s, "oracle_evaluations": r.oracle_evaluations,
                       "ilp_variables": r.strategy_space,
                       "mip_gap": r.ilp.mip_gap if r.ilp else None,
                       "cfp_over_ilp": (cfp.samples_per_s / ilp.samples_per_s
                                        if cfp and ilp and method == "intraop" else None),
                       "cfp_over_megatron": (cfp.samples_per_s / meg.samples_per_s
                                             if cfp and meg and method == "intraop" else None)}
                rows.append(row)
                if not args.json:
                    gap = f"{row['mip_gap']:.2g}" if row["mip_gap"] is not None else "-"
                    ratio = (f"{row['cfp_over_ilp']:.3f}" if row["cfp_over_ilp"] else "-")
                    over = (f"{row['cfp_over_megatron']:.3f}"
                            if row["cfp_over_megatron"] else "-")
                    print(f"{label:<16} {where:<19} {method:<10} {r.samples_per_s:>9.2f} "
                          f"{row['gb_per_gpu']:>7.2f} {r.search_s:>8.2f} "
                          f"{r.oracle_evaluations:>6} {r.strategy_space:>8} {gap:>8} "
                          f"{ratio:>8} {over:>8}")
            if "intraop" in got and "alpa" in got and got["intraop"].choice != got["alpa"].choice:
                notes.append(f"{label} on {where}: CFP/ILP differ at "
                             f"{_diff(got['intraop'], got['alpa'])}\n    "
                             f"{_why(got['intraop'], got['alpa'])}")
            sys.stdout.flush()
    if args.json:
        print(json.dumps({"rows": rows, "notes": notes}, indent=2))
    else:
        print()
        for note in notes:
            print(note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
