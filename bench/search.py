"""Parallelism-planner benchmark: grid (Megatron-LM) vs aceso on Aceso's cases (EuroSys'24 §6).

Small cases (Aceso artifact README; ../shared/data/aceso/SOURCES.md): 4 × V100 (PCIe: the
miniset's p2p bandwidth is 7–11 GB/s), memory limit 12000 MB, GPT-3 1.3B and T5 770M at global
batch 512, Wide-ResNet 1B at 768; published samples/s Megatron / Aceso. For each case it prints
grid's and aceso's best predicted samples/s, aceso/grid next to the paper's Aceso/Megatron
ratio, and each search's time and evaluations. aceso starts from its balanced seeds plus
grid's best plan (a cache hit on the shared Oracle), so it never reports less than grid. The
grid planner skips the candidates its proven lower bound rules out (``pruned``, search/grid.py);
its best plan is the exhaustive grid's (tests/search/test_grid.py), so the space it stands for
is the whole grid.

`--large` adds the 32-GPU experiment (Fig. 7): V100-SXM2-32GB nodes of 8, 28000 MB, batch 1024
(GPT, T5) / 1536 (Wide-ResNet), each model size on the GPU count of Aceso's scripts
(scripts/aceso_{gpt,t5,resnet}_search.sh "large": the smallest size on 1 GPU, then 4, 8, 16
and 32 GPUs — 1 node of 1/4/8, 2 and 4 nodes of 8), with the paper's ratios from results/ref.
T5 22B (not in the zoo) comes from bench/data/aceso_t5_22b.yaml.

`--layers` runs the 1K-layer experiment (Fig. 9): Aceso's "scale-layer" GPT (hidden 512,
bench/data/aceso_gpt_scale_layer.yaml) with 8…1024 layers on 1 node of 8 V100-SXM2-32GB (as
Aceso's scripts: 1 node × 8 GPUs), batch 1024, 28000 MB; it prints aceso's search time and
evaluations per depth (aceso from its own seeds only, not grid's best) and the log-log
slopes of search time, time to the best plan and time per evaluation against layers.

Each row also prints evaluations per second of both searches (Oracle answers per wall-clock
second, cache hits included; bench/oracle.py measures the Oracle alone, old vs new).

`--profile` costs ops from Aceso's measured V100 profiles (profiled-time-miniset for the small
cases, -eurosys for --large and --layers) instead of the roofline; `--roofline-error` prints how
far the roofline's V100 op times are from Aceso's measurements.

`--prune` lets aceso skip evaluating last-hop moves whose compute-only lower bound
(search/bound.py) cannot beat the plan it is improving on (small cases).

Usage: ``python bench/search.py [--budget-s 5] [--profile] [--large] [--layers]
[--skip-small] [--roofline-error] [--prune] [--json]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "aceso"

SMALL = [  # (label, zoo model, global batch, published Megatron samples/s, published Aceso)
    ("GPT-3 1.3B", "aceso-gpt-1.3b", 512, 6.98, 8.68),   # Aceso artifact README
    ("T5 770M", "t5-770m", 512, 9.94, 15.14),             # Aceso artifact README
    ("Wide-ResNet 1B", "wresnet-1b", 768, 34.59, 41.52),  # Aceso artifact README
]
SMALL_CLUSTER, SMALL_LIMIT_MB = "4xV100-PCIe-32GB", 12000
BENCH_DATA = Path(__file__).resolve().parent / "data"
LARGE_GPU, LARGE_LIMIT_MB = "V100-SXM2-32GB", 28000
LARGE = {  # results/ref column → (model, nodes, GPUs per node) as in Aceso's scripts; batch
    "gpt": ({"350M": ("aceso-gpt-350m", 1, 1), "1_3B": ("aceso-gpt-1.3b", 1, 4),
             "2_6B": ("aceso-gpt-2.6b", 1, 8), "6_7B": ("aceso-gpt-6.7b", 2, 8),
             "13B": ("aceso-gpt-13b", 4, 8)}, 1024),
    "t5": ({"770M": ("t5-770m", 1, 1), "3B": ("t5-3b", 1, 4), "6B": ("t5-6b", 1, 8),
            "11B": ("t5-11b", 2, 8), "22B": (str(BENCH_DATA / "aceso_t5_22b.yaml"), 4, 8)},
           1024),
    "resnet": ({"500M": ("wresnet-500m", 1, 1), "2B": ("wresnet-2b", 1, 4),
                "4B": ("wresnet-4b", 1, 8), "6_8B": ("wresnet-6.8b", 2, 8),
                "13B": ("wresnet-13b", 4, 8)}, 1536),
}
LAYERS_MODEL = BENCH_DATA / "aceso_gpt_scale_layer.yaml"
LAYERS = (8, 16, 32, 64, 128, 256, 512, 1024)
LAYERS_CLUSTER, LAYERS_BATCH = f"1x8x{LARGE_GPU}", 1024


def ref_rows(name: str) -> dict[str, dict[str, float]]:
    """results/ref/<name>.csv as {row label: {column: value}} ({} when the file is absent)."""
    path = DATA / "results" / "ref" / f"{name}.csv"
    if not path.is_file():
        return {}
    rows = list(csv.reader(path.open()))
    head = [h.strip() for h in rows[0]]
    return {r[0].strip(): {h: float(v) for h, v in zip(head[1:], r[1:]) if v.strip()}
            for r in rows[1:] if r}


def paper_ratios(family: str) -> dict[str, float]:
    """Aceso/Megatron normalised throughput per size from the paper's figure data."""
    return ref_rows(f"e2e_norm_thpt_large_{family}").get("aceso", {})


def run_case(model: Any, cluster: str, batch: int, limit_mb: float, budget_s: float,
             profile: Path | None, profile_size: str | None = None,
             grid_start: bool = True, prune: bool = False) -> dict:
    """Grid then aceso on one Oracle; returns their best samples/s, times and counts.

    aceso's `search_s` is its own wall time (with `grid_start`, grid's best is a start it gets
    for free from the shared cache); `aceso_best_s` is when it found its best plan.
    """
    from trainsim.api import load_cluster, load_model
    from trainsim.search.aceso.planner import AcesoPlanner
    from trainsim.search.grid import GridPlanner
    from trainsim.search.oracle import Oracle
    from trainsim.search.planner import BYTES_PER_MB, SearchSpec, run_search

    oracle = Oracle(load_model(model), load_cluster(cluster))
    if profile is not None:
        from trainsim.search.aceso.profile import aceso_lowering_options
        extra = {"size": profile_size} if profile_size else {}
        oracle.options = aceso_lowering_options(profile, oracle.model, **extra)
    spec = SearchSpec(model=oracle.model, cluster=oracle.cluster, global_batch=batch,
                      memory_limit_bytes=limit_mb * BYTES_PER_MB, time_budget_s=600.0)
    grid = run_search(GridPlanner(), spec, oracle=oracle)
    aspec = SearchSpec(model=oracle.model, cluster=oracle.cluster, global_batch=batch,
                       memory_limit_bytes=limit_mb * BYTES_PER_MB, time_budget_s=budget_s)
    starts = (grid.best.plan,) if grid_start and grid.best and grid.best.plan else ()
    aceso = run_search(AcesoPlanner(starts=starts, prune=prune), aspec, oracle=oracle)
    g = grid.best.summary.samples_per_s if grid.best else 0.0
    a = aceso.best.summary.samples_per_s if aceso.best else 0.0
    return {"grid_samples_per_s": g, "aceso_samples_per_s": a,
            "aceso_over_grid": a / g if g else None, "grid_s": grid.search_s,
            "aceso_s": aceso.search_s, "grid_evaluated": grid.evaluated,
            "grid_pruned": grid.pruned,
            "aceso_evaluated": aceso.evaluated,
            "grid_evals_per_s": grid.evaluated / grid.search_s if grid.search_s else None,
            "aceso_evals_per_s": aceso.evaluated / aceso.search_s if aceso.search_s else None,
            "aceso_best_s": aceso.best.elapsed_s if aceso.best else None,
            "aceso_hit_budget": aceso.search_s >= budget_s,
            "grid_best": grid.best.note if grid.best else None,
            "aceso_best_note": aceso.best.note if aceso.best else None,
            "aceso_best": aceso.best.plan.to_dict() if aceso.best and aceso.best.plan else None}


def large_rows(budget_s: float, profile: bool) -> list[dict]:
    """The 32-GPU experiment, each size on its GPU count from Aceso's scripts."""
    rows = []
    euro = DATA / "profiled-time-eurosys" if profile else None
    for family, (sizes, batch) in LARGE.items():
        ratios = paper_ratios(family)
        for size, (model, nodes, gpn) in sizes.items():
            gpus = nodes * gpn
            label = f"{family} {size} ({gpus} GPU{'s' if gpus > 1 else ''}, b={batch})"
            try:
                r = run_case(model, f"{nodes}x{gpn}x{LARGE_GPU}", batch, LARGE_LIMIT_MB,
                             budget_s, euro)
            except Exception as exc:  # noqa: BLE001 - report, keep benchmarking
                r = {"error": f"{type(exc).__name__}: {str(exc)[:140]}"}
            rows.append({"case": label, "paper_megatron": None, "paper_aceso": None,
                         "paper_ratio": ratios.get(size), **r})
            print(f"  done {label}", file=sys.stderr, flush=True)
    return rows


def layer_rows(budget_s: float, profile: bool, layers: tuple[int, ...] = LAYERS
               ) -> list[dict]:
    """The 1K-layer experiment: grid and aceso per depth on 1 node of 8 GPUs. aceso starts
    from its own balanced seeds only (as Aceso's `--initial-point balance`), so its time to
    its best plan measures the search alone."""
    import dataclasses

    from trainsim.workloads.zoo import get_model

    base = get_model(str(LAYERS_MODEL))
    thpt = ref_rows("e2e_thpt_scale_scale-layer")
    cost = ref_rows("search_cost_scale_scale-layer").get("aceso", {})
    euro = DATA / "profiled-time-eurosys" if profile else None
    rows = []
    for n in layers:
        model = dataclasses.replace(base, num_layers=n, name=f"{base.name}-{n}")
        col = f"{n}layers"
        meg, ace = thpt.get("megatron", {}).get(col), thpt.get("aceso", {}).get(col)
        try:
            r = run_case(model, LAYERS_CLUSTER, LAYERS_BATCH, LARGE_LIMIT_MB, budget_s, euro,
                         profile_size="scale-layer", grid_start=False)
        except Exception as exc:  # noqa: BLE001 - report, keep benchmarking
            r = {"error": f"{type(exc).__name__}: {str(exc)[:140]}"}
        rows.append({"case": f"{n} layers (8 GPUs, b={LAYERS_BATCH})", "layers": n,
                     "paper_megatron": meg, "paper_aceso": ace,
                     "paper_ratio": ace / meg if meg and ace else None,
                     "paper_aceso_search_s": cost.get(col), **r})
        print(f"  done {n} layers", file=sys.stderr, flush=True)
    return rows


def growth_exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x (1 = linear growth); None with < 2 points."""
    import math

    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else None


def roofline_error_rows(folder: Path) -> list[dict]:
    """Median |error| and whole-model error of the roofline vs Aceso's tp=1 measurements."""
    from trainsim.hwmodels.gpus import get_gpu
    from trainsim.search.aceso.profile import load_aceso_profile, roofline_error
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


def print_table(rows: list[dict]) -> None:
    """One line per case: both searches' best, the ratio next to the paper's, times, counts."""
    print(f"{'case':34} {'grid s/s':>9} {'aceso s/s':>9} {'aceso/grid':>10} {'paper':>6} "
          f"{'paper Meg/Aceso':>16} {'grid s':>7} {'evals':>5} {'pruned':>6} {'aceso s':>8} "
          f"{'best@s':>7} {'evals':>6} {'grid ev/s':>9} {'aceso ev/s':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:34} error: {r['error']}")
            continue
        ratio = f"{r['aceso_over_grid']:.2f}x" if r["aceso_over_grid"] else "-"
        paper = f"{r['paper_ratio']:.2f}x" if r["paper_ratio"] else "-"
        pub = f"{r['paper_megatron']}/{r['paper_aceso']}" if r["paper_megatron"] else "-"
        best = f"{r['aceso_best_s']:7.1f}" if r["aceso_best_s"] is not None else "      -"
        print(f"{r['case']:34} {r['grid_samples_per_s']:9.2f} "
              f"{r['aceso_samples_per_s']:9.2f} {ratio:>10} {paper:>6} {pub:>16} "
              f"{r['grid_s']:7.1f} {r['grid_evaluated']:5d} {r['grid_pruned']:6d} "
              f"{r['aceso_s']:8.1f} {best} "
              f"{r['aceso_evaluated']:6d} {r['grid_evals_per_s'] or 0:9.1f} "
              f"{r['aceso_evals_per_s'] or 0:10.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=5.0, help="aceso time budget per case")
    ap.add_argument("--layers-budget-s", type=float, default=10.0,
                    help="aceso time budget per depth of the 1K-layer experiment")
    ap.add_argument("--profile", action="store_true", help="use Aceso's measured op profiles")
    ap.add_argument("--large", action="store_true", help="add the 32-GPU experiment")
    ap.add_argument("--layers", action="store_true", help="add the 1K-layer experiment")
    ap.add_argument("--skip-small", action="store_true", help="leave out the 4-GPU cases")
    ap.add_argument("--roofline-error", action="store_true", help="roofline vs measured ops")
    ap.add_argument("--json", action="store_true", help="print JSON rows")
    ap.add_argument("--prune", action="store_true",
                    help="aceso skips last-hop moves its lower bound rules out (search/bound.py)")
    args = ap.parse_args(argv)
    small: list[dict] = []
    mini = DATA / "profiled-time-miniset" if args.profile else None
    for label, model, batch, meg, ace in ([] if args.skip_small else SMALL):
        r = run_case(model, SMALL_CLUSTER, batch, SMALL_LIMIT_MB, args.budget_s, mini,
                     prune=args.prune)
        small.append({"case": f"{label} (4 GPUs, b={batch})", "paper_megatron": meg,
                      "paper_aceso": ace, "paper_ratio": ace / meg, **r})
    large = large_rows(args.budget_s, args.profile) if args.large else []
    deep = layer_rows(args.layers_budget_s, args.profile) if args.layers else []
    ok = [r for r in deep if "error" not in r]
    xs = [r["layers"] for r in ok]
    slope = {"search_s": growth_exponent(xs, [r["aceso_s"] for r in ok]),
             "best_at_s": growth_exponent(xs, [r["aceso_best_s"] for r in ok]),
             "s_per_evaluation": growth_exponent(
                 xs, [r["aceso_s"] / max(r["aceso_evaluated"], 1) for r in ok])}
    if args.json:
        print(json.dumps({"small": small, "large": large, "layers": deep,
                          "layers_growth_exponents": slope}, indent=2, sort_keys=True))
        return 0
    cost = "Aceso measured V100 op profiles" if args.profile else "roofline"
    print(f"grid (Megatron-LM) vs aceso on trainsim's Oracle ({cost}); aceso budget "
          f"{args.budget_s:g} s; best@s: when aceso found its best")
    if small or large:
        print_table(small + large)
    if deep:
        print(f"\n1K-layer experiment: GPT hidden 512 on {LAYERS_CLUSTER}, batch "
              f"{LAYERS_BATCH}, 28000 MB; aceso budget {args.layers_budget_s:g} s")
        print_table(deep)
        print(f"{'layers':>6} {'aceso s':>8} {'evals':>6} {'s/eval':>7} {'budget hit':>10} "
              f"{'paper Aceso s':>13}")
        for r in ok:
            paper = f"{r['paper_aceso_search_s']:.1f}" if r["paper_aceso_search_s"] else "-"
            print(f"{r['layers']:6d} {r['aceso_s']:8.2f} {r['aceso_evaluated']:6d} "
                  f"{r['aceso_s'] / max(r['aceso_evaluated'], 1):7.3f} "
                  f"{'yes' if r['aceso_hit_budget'] else 'no':>10} {paper:>13}")
        exps = ", ".join(f"{k} ~ layers^{v:.2f}" if v is not None else f"{k}: -"
                         for k, v in slope.items())
        print(f"growth (log-log least squares over {len(ok)} depths): {exps}; search_s is "
              f"bounded by the budget where it was hit, best_at_s is when the best was found")
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
