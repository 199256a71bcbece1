"""Intra-operator sharding benchmark (issue 17): Megatron-hand TP vs Alpa's ILP vs CFP.

For each model (GPT-3 1.3B; LLaMA-2 7B, SwiGLU; LLaMA-2 with GQA — llama2-7b with 8 KV heads,
since the zoo's GQA model, 70B, fits no 8-GPU mesh; GShard-style MoE 1.3B with 8 experts;
BERT-Large), node type (A100-SXM4-40GB, V100-SXM2-32GB) and mesh (4 GPUs 1-D, 8 GPUs 1-D,
2 × 4 on two 4-GPU nodes: axis 0 across the nodes) it prints each method's plan as the engine
scores it: samples/s, GPU memory, search time (wall clock, this machine), Oracle evaluations
(engine runs of CFP), the ILP's strategy space (its variables) and MIP gap, and CFP's gain
over the ILP and over Megatron. "intraop+rc" is CFP with per-block recompute where memory
binds (beyond CFP; the same as intraop where it does not). "intraop-pp" (beyond CFP, GPT and
LLaMA on the 8-GPU meshes) adds pipeline stages and micro-batches under 1F1B around per-stage
CFP and keeps the engine's best of its grid; its "pp×M" column is the plan's depth and
micro-batch count, and a note under the table gives its best plan with pp ≥ 2. Under the
table, for every case where CFP's plan differs from the ILP's, the ops whose strategy
differs, and both plans under both cost models: the ILP prices with Alpa's α-β model
(elementwise ops free, compute split evenly, no link sharing between a mesh axis' groups),
CFP with the engine. Where the ILP's model rates its own plan
faster but the engine does not, the model is why CFP wins.

A case whose models fit no plan in the GPU's memory prints the smallest limit any plan meets.

Usage: ``python bench/intraop.py [--quick] [--json] [--ilp-limit-s 60] [--models a,b]
[--meshes 8,2x4]`` (``--quick``: GPT and MoE on A100 only; ``--models`` / ``--meshes``: only
these labels / meshes).
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
from trainsim.search.intraop.pipeline import PipelineResult, run_intraop_pp
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


def _single(r: IntraopResult | PipelineResult | None) -> IntraopResult | None:
    return r if isinstance(r, IntraopResult) else None


def _pp_note(r: PipelineResult, cfp: IntraopResult | None) -> str:
    """The best grid point with pipeline stages (pp ≥ 2) against the single-mesh CFP plan."""
    staged = [c for c in r.candidates if c.pp > 1 and c.iteration_time_s is not None]
    if not staged:
        return "no plan with pp >= 2 fits"
    c = min(staged, key=lambda x: x.iteration_time_s or 0.0)
    assert c.iteration_time_s is not None
    text = (f"best with stages pp {c.pp} × {c.micro_batches}: "
            f"{r.global_batch / c.iteration_time_s:.2f} samples/s, "
            f"{c.memory_bytes / 1e9:.2f} GB/GPU")
    if cfp is not None:
        text += (f"; single-mesh CFP {cfp.samples_per_s:.2f} samples/s, "
                 f"{cfp.memory_bytes / 1e9:.2f} GB/GPU")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ilp-limit-s", type=float, default=60.0)
    parser.add_argument("--models", default=None, help="comma-separated model labels")
    parser.add_argument("--meshes", default=None, help="comma-separated meshes, e.g. 8,2x4")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    head = (f"{'model':<16} {'GPUs':<19} {'method':<10} {'pp×M':>5} {'samples/s':>9} "
            f"{'GB/GPU':>7} "
            f"{'search s':>8} {'evals':>6} {'ILP vars':>8} {'MIP gap':>8} {'CFP/ILP':>8} "
            f"{'CFP/Meg':>8}")
    if not args.json:
        print(head)
        print("-" * len(head))
    only_models = set(args.models.split(",")) if args.models else None
    only_meshes = set(args.meshes.split(",")) if args.meshes else None
    for label, spec, batch in _models(args.quick):
        if only_models is not None and label not in only_models:
            continue
        for cluster_spec, mesh, where in _clusters(args.quick):
            if only_meshes is not None and mesh not in only_meshes:
                continue
            cluster = parse_cluster(cluster_spec)
            dtype = "fp16" if cluster.gpu(0).name.startswith("V100") else spec.dtype
            got: dict[str, IntraopResult | PipelineResult] = {}
            methods = ["megatron", "alpa", "intraop", "intraop+rc"]
            if label.startswith(("gpt3", "llama")) and mesh in ("8", "2x4"):
                methods.append("intraop-pp")
            for method in methods:
                try:
                    if method == "intraop-pp":
                        got[method] = run_intraop_pp(spec, cluster, global_batch=batch,
                                                     mesh=mesh, dtype=dtype)
                        continue
                    got[method] = run_intraop(spec, cluster, method=method.split("+")[0],
                                              global_batch=batch, mesh=mesh,
                                              time_limit_s=args.ilp_limit_s, dtype=dtype,
                                              recompute=method.endswith("+rc"))
                except IntraopMemoryError as exc:
                    notes.append(f"{label} on {where}, {method}: {exc}")
            for method, r in got.items():
                cfp, ilp, meg = (_single(got.get(k)) for k in ("intraop", "alpa", "megatron"))
                single = _single(r)
                pp_m = f"{r.pp}×{r.micro_batches}" if isinstance(r, PipelineResult) else "-"
                row = {"model": label, "gpus": where, "method": method, "pp_x_m": pp_m,
                       "samples_per_s": r.samples_per_s, "gb_per_gpu": r.memory_bytes / 1e9,
                       "search_s": r.search_s, "oracle_evaluations": r.oracle_evaluations,
                       "ilp_variables": single.strategy_space if single else None,
                       "mip_gap": single.ilp.mip_gap if single and single.ilp else None,
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
                    space = str(row["ilp_variables"]) if row["ilp_variables"] else "-"
                    print(f"{label:<16} {where:<19} {method:<10} {pp_m:>5} "
                          f"{r.samples_per_s:>9.2f} {row['gb_per_gpu']:>7.2f} "
                          f"{r.search_s:>8.2f} {r.oracle_evaluations:>6} {space:>8} {gap:>8} "
                          f"{ratio:>8} {over:>8}")
            if cfp and ilp and cfp.choice != ilp.choice:
                notes.append(f"{label} on {where}: CFP/ILP differ at {_diff(cfp, ilp)}\n    "
                             f"{_why(cfp, ilp)}")
            piped = got.get("intraop-pp")
            if isinstance(piped, PipelineResult):
                notes.append(f"{label} on {where}, intraop-pp: {_pp_note(piped, cfp)}")
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
