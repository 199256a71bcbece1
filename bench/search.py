"""Parallelism-planner benchmark: grid (Megatron-LM) vs aceso on Aceso's cases (EuroSys'24 §6).

Small cases (Aceso artifact README; ../shared/data/aceso/SOURCES.md): 4 × V100 (PCIe: the
miniset's p2p bandwidth is 7–11 GB/s), memory limit 12000 MB, GPT-3 1.3B and T5 770M at global
batch 512, Wide-ResNet 1B at 768; published samples/s Megatron / Aceso. For each case it prints
grid's and aceso's best predicted samples/s, aceso/grid next to the paper's Aceso/Megatron
ratio, and each search's time and evaluations. aceso starts from its balanced seeds plus
grid's best plan (a cache hit on the shared Oracle), so it never reports less than grid. `--profile` costs ops from Aceso's measured V100
profiles (profiled-time-miniset, -eurosys for --large) instead of the roofline; `--large` adds
the 32-GPU cases (4 × 8 V100-SXM2-32GB, 28000 MB) with the paper's ratios from results/ref;
`--roofline-error` prints how far the roofline's V100 op times are from Aceso's measurements.

Usage: ``python bench/search.py [--budget-s 5] [--profile] [--large] [--roofline-error]
[--json]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "aceso"

SMALL = [  # (label, zoo model, global batch, published Megatron samples/s, published Aceso)
    ("GPT-3 1.3B", "aceso-gpt-1.3b", 512, 6.98, 8.68),   # Aceso artifact README
    ("T5 770M", "t5-770m", 512, 9.94, 15.14),             # Aceso artifact README
    ("Wide-ResNet 1B", "wresnet-1b", 768, 34.59, 41.52),  # Aceso artifact README
]
SMALL_CLUSTER, SMALL_LIMIT_MB = "4xV100-PCIe-32GB", 12000
LARGE_CLUSTER, LARGE_LIMIT_MB = "4x8xV100-SXM2-32GB", 28000
LARGE = {  # results/ref/e2e_norm_thpt_large_<family>.csv columns → zoo models, batch
    "gpt": ({"350M": "aceso-gpt-350m", "1_3B": "aceso-gpt-1.3b", "2_6B": "aceso-gpt-2.6b",
             "6_7B": "aceso-gpt-6.7b", "13B": "aceso-gpt-13b"}, 1024),
    "t5": ({"770M": "t5-770m", "3B": "t5-3b", "6B": "t5-6b", "11B": "t5-11b"}, 1024),
    "resnet": ({"500M": "wresnet-500m", "2B": "wresnet-2b", "4B": "wresnet-4b",
                "6_8B": "wresnet-6.8b", "13B": "wresnet-13b"}, 1536),
}


def paper_ratios(family: str) -> dict[str, float]:
    """Aceso/Megatron normalised throughput per size from the paper's figure data."""
    path = DATA / "results" / "ref" / f"e2e_norm_thpt_large_{family}.csv"
    if not path.is_file():
        return {}
    rows = list(csv.reader(path.open()))
    head = [h.strip() for h in rows[0]]
    out = {}
    for r in rows[1:]:
        if r[0].strip() == "aceso":
            for h, v in zip(head[1:], r[1:]):
                out[h] = float(v)
    return out


def run_case(model: str, cluster: str, batch: int, limit_mb: float, budget_s: float,
             profile: Path | None) -> dict:
    """Grid then aceso on one Oracle; returns their best samples/s, times and counts."""
    from trainsim.search.aceso import AcesoPlanner
    from trainsim.search.grid import GridPlanner
    from trainsim.search.oracle import Oracle
    from trainsim.search.planner import BYTES_PER_MB, SearchSpec, run_search

    oracle = Oracle(model, cluster)
    if profile is not None:
        from trainsim.search.aceso_profile import aceso_lowering_options
        oracle.options = aceso_lowering_options(profile, oracle.model)
    spec = SearchSpec(model=model, cluster=cluster, global_batch=batch,
                      memory_limit_bytes=limit_mb * BYTES_PER_MB, time_budget_s=600.0)
    grid = run_search(GridPlanner(), spec, oracle=oracle)
    aspec = SearchSpec(model=model, cluster=cluster, global_batch=batch,
                       memory_limit_bytes=limit_mb * BYTES_PER_MB, time_budget_s=budget_s)
    starts = (grid.best.plan,) if grid.best and grid.best.plan else ()
    aceso = run_search(AcesoPlanner(starts=starts), aspec, oracle=oracle)
    g = grid.best.summary.samples_per_s if grid.best else 0.0
    a = aceso.best.summary.samples_per_s if aceso.best else 0.0
    return {"grid_samples_per_s": g, "aceso_samples_per_s": a,
            "aceso_over_grid": a / g if g else None, "grid_s": grid.search_s,
            "aceso_s": aceso.search_s, "grid_evaluated": grid.evaluated,
            "aceso_evaluated": aceso.evaluated,
            "grid_best": grid.best.note if grid.best else None,
            "aceso_best": aceso.best.plan.to_dict() if aceso.best and aceso.best.plan else None}


def roofline_error_rows(folder: Path) -> list[dict]:
    """Median |error| and whole-model error of the roofline vs Aceso's tp=1 measurements."""
    from trainsim.hwmodels.gpus import get_gpu
    from trainsim.search.aceso_profile import load_aceso_profile, roofline_error
    from trainsim.workloads.zoo import get_model

    prof = load_aceso_profile(folder)
    gpu = get_gpu("V100-SXM2-32GB")
    out = []
    for label, model, *_ in SMALL:
        rows = roofline_error(prof, get_model(model), gpu)
        for mbs in sorted({r["mbs"] for r in rows}):
            sel = [r for r in rows if r["mbs"] == mbs]
            meas = sum(r["measured_s"] for r in sel)
            roof = sum(r["roofline_s"] for r in sel)
            out.append({"model": label, "mbs": mbs, "ops": len(sel),
                        "median_abs_op_error": statistics.median(abs(r["error"]) for r in sel),
                        "sum_error": roof / meas - 1.0})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=5.0, help="aceso time budget per case")
    ap.add_argument("--profile", action="store_true", help="use Aceso's measured op profiles")
    ap.add_argument("--large", action="store_true", help="add the 32-GPU cases")
    ap.add_argument("--roofline-error", action="store_true", help="roofline vs measured ops")
    ap.add_argument("--json", action="store_true", help="print JSON rows")
    args = ap.parse_args(argv)
    rows = []
    mini = DATA / "profiled-time-miniset" if args.profile else None
    for label, model, batch, meg, ace in SMALL:
        r = run_case(model, SMALL_CLUSTER, batch, SMALL_LIMIT_MB, args.budget_s, mini)
        rows.append({"case": f"{label} (4 GPUs, b={batch})", "paper_megatron": meg,
                     "paper_aceso": ace, "paper_ratio": ace / meg, **r})
    if args.large:
        euro = DATA / "profiled-time-eurosys" if args.profile else None
        for family, (sizes, batch) in LARGE.items():
            ratios = paper_ratios(family)
            for size, model in sizes.items():
                try:
                    r = run_case(model, LARGE_CLUSTER, batch, LARGE_LIMIT_MB, args.budget_s,
                                 euro)
                except Exception as exc:  # noqa: BLE001 - report, keep benchmarking
                    r = {"error": f"{type(exc).__name__}: {exc}"}
                rows.append({"case": f"{model} (32 GPUs, b={batch})", "paper_megatron": None,
                             "paper_aceso": None, "paper_ratio": ratios.get(size), **r})
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    else:
        cost = "Aceso measured V100 op profiles" if args.profile else "roofline"
        print(f"grid (Megatron-LM) vs aceso on trainsim's Oracle ({cost}); aceso budget "
              f"{args.budget_s:g} s")
        print(f"{'case':34} {'grid s/s':>9} {'aceso s/s':>9} {'aceso/grid':>10} "
              f"{'paper':>6} {'paper Meg/Aceso':>16} {'grid s':>7} {'aceso s':>8} {'evals':>6}")
        for r in rows:
            if "error" in r:
                print(f"{r['case']:34} error: {r['error']}")
                continue
            ratio = f"{r['aceso_over_grid']:.2f}x" if r["aceso_over_grid"] else "-"
            paper = f"{r['paper_ratio']:.2f}x" if r["paper_ratio"] else "-"
            pub = f"{r['paper_megatron']}/{r['paper_aceso']}" if r["paper_megatron"] else "-"
            print(f"{r['case']:34} {r['grid_samples_per_s']:9.2f} "
                  f"{r['aceso_samples_per_s']:9.2f} {ratio:>10} {paper:>6} {pub:>16} "
                  f"{r['grid_s']:7.1f} {r['aceso_s']:8.1f} {r['aceso_evaluated']:6d}")
    if args.roofline_error:
        print("\nroofline (V100-SXM2-32GB) vs Aceso's measured op times (miniset, tp=1, "
              "fwd+bwd):")
        print(f"{'model':16} {'mbs':>4} {'ops':>4} {'median |op err|':>16} {'sum err':>8}")
        for r in roofline_error_rows(DATA / "profiled-time-miniset"):
            print(f"{r['model']:16} {r['mbs']:4d} {r['ops']:4d} "
                  f"{r['median_abs_op_error']:16.1%} {r['sum_error']:8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
