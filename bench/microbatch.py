"""Dynamic micro-batching (issue 16): DynaPipe and ours against packing, replayed on the engine.

Settings from DynaPipe's evaluation (Jiang et al., EuroSys'24 §7: up to 4 x 8 A100-40GB,
16K-64K tokens per global batch, max length 512-2048, GPT-6.7B-class and T5-11B-width models):
gpt3-6.7b and t5-11b on 8 and 32 A100-SXM4-40GB, on two length distributions (the `flan`
mixture, built to FLAN's public statistics, and a contrasting one). For every setting and
method it prints real tokens/s (padding excluded) and the ratio to packing, padding
efficiency, recompute and schedule used -- the columns that say where a gain comes from:
padding (padding efficiency), attention over packed rows (`packing` vs `packing-flash`, the
same rows with FlashAttention), recompute (the policy each needed to fit) and the schedule
(`ours-1f1b` vs `ours`). Then the planning time per iteration at 64K tokens: the median over
100 batches of forming the micro-batches (no replay), faithful DynaPipe and ours.

Usage: ``python bench/microbatch.py [--quick] [--full] [--iterations K]``
(--quick: one setting per model; --full: all 2 x 2 x 3 x 3 settings per distribution).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from trainsim import api
from trainsim.search.microbatch.planner import MicroBatchPlanner

MODELS = {  # model -> {GPUs: (dp, tp, pp)}: model states fit A100-40GB with room for activations
    "gpt3-6.7b": {8: (2, 2, 2), 32: (8, 2, 2)},
    "t5-11b": {8: (1, 2, 4), 32: (4, 2, 4)},
}
CLUSTERS = {8: "1x8xA100-SXM4-40GB", 32: "4x8xA100-SXM4-40GB"}
METHODS = ("packing", "fixed", "token-budget", "dynapipe", "ours-1f1b", "ours")


def run_setting(console: Console, dist: str, model: str, gpus: int, tokens: int, max_len: int,
                iterations: int) -> dict[str, float]:
    dp, tp, pp = MODELS[model][gpus]
    dataset = api.length_dataset(synthetic=dist, samples=20_000, seed=0)
    max_target = min(max_len // 4, 512) if model.startswith("t5") else None
    t0 = time.perf_counter()
    results, _ = api.microbatch(model, CLUSTERS[gpus], dataset, dp=dp, tp=tp, pp=pp,
                                tokens_per_batch=tokens, iterations=iterations,
                                max_len=max_len, max_target_len=max_target, methods=METHODS)
    flash, _ = api.microbatch(model, CLUSTERS[gpus], dataset, dp=dp, tp=tp, pp=pp,
                              tokens_per_batch=tokens, iterations=iterations, max_len=max_len,
                              max_target_len=max_target, methods=("packing",),
                              packing_attention="flash")
    wall = time.perf_counter() - t0
    flash[0].method = "packing-flash"
    base = results[0].tokens_per_s
    table = Table(title=f"{dist}: {model} on {gpus} x A100-40GB (dp={dp} tp={tp} pp={pp}), "
                        f"{tokens // 1024}K tokens/batch, max length {max_len}"
                        + (f" (targets {max_target})" if max_target else "")
                        + f", {iterations} iterations ({wall:.0f} s)")
    for col in ("method", "real tok/s", "vs packing", "padding eff.", "peak GiB", "recompute",
                "schedule", "micro-batches/iter", "error"):
        table.add_column(col, justify="left" if col in ("method", "recompute", "schedule",
                                                         "error") else "right")
    out = {}
    for r in [*results, *flash]:
        if not r.iterations:
            table.add_row(r.method, "-", "-", "-", "-", "-", "-", "-", r.error or "")
            continue
        ratio = r.tokens_per_s / base if base else float("nan")
        out[r.method] = ratio
        table.add_row(r.method, f"{r.tokens_per_s:,.0f}", f"{ratio:.2f}x",
                      f"{r.padding_efficiency:.3f}", f"{r.peak_bytes / 2**30:.1f}",
                      ",".join(f"{k}x{v}" for k, v in r.counts("recompute").items()),
                      ",".join(f"{k}x{v}" for k, v in r.counts("schedule").items()),
                      f"{sum(i.micro_batches for i in r.iterations) / len(r.iterations):.0f}",
                      r.error or "")
    console.print(table)
    return out


def planning_times(console: Console, dist: str) -> None:
    """Median time to form the micro-batches of a 64K-token batch, over 100 batches (as each
    iteration does it: recompute fallback included, ours forming its exact and thinned split;
    the one-off cost grid excluded)."""
    table = Table(title=f"{dist}: planning time per iteration, 64K tokens/batch, median of 100")
    for col in ("model", "samples/batch", "dynapipe ms", "ours ms"):
        table.add_column(col, justify="left" if col == "model" else "right")
    dataset = api.length_dataset(synthetic=dist, samples=20_000, seed=1)
    for model, degrees in MODELS.items():
        dp, tp, pp = degrees[8]
        spec = api.load_model(model)
        max_target = 512 if spec.family == "t5" else 0
        planner = MicroBatchPlanner(spec, api.load_cluster(CLUSTERS[8]), dp=dp, tp=tp, pp=pp,
                                    max_len=2048, max_target_len=max_target)
        from trainsim.workloads.lengths import fit_max_len, iteration_batches

        fitted = fit_max_len(dataset, 2048, max_target_len=max_target or None)
        batches = iteration_batches(fitted, 65_536, iterations=100, seed=1)
        times: dict[str, list[float]] = {"dynapipe": [], "ours": []}
        for batch, method in itertools.product(batches, times):
            inputs = np.array([s.input_len for s in batch], float)
            targets = np.array([s.target_len for s in batch], float)
            times[method].append(planner.form(method, inputs, targets)[2])
        table.add_row(model, f"{statistics.median(len(b) for b in batches):.0f}",
                      f"{statistics.median(times['dynapipe']) * 1e3:.1f}",
                      f"{statistics.median(times['ours']) * 1e3:.1f}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--iterations", type=int, default=4)
    args = parser.parse_args()
    console = Console(width=200)
    dists = api.list_length_mixtures()
    if args.quick:
        grid = [("gpt3-6.7b", 8, 65_536, 2048), ("t5-11b", 8, 65_536, 2048)]
        dists = dists[:1]
    elif args.full:
        grid = [(m, g, t, L) for m in MODELS for g in (8, 32)
                for t in (16_384, 32_768, 65_536) for L in (512, 1024, 2048)]
    else:
        grid = [(m, g, t, L) for m in MODELS for g, t, L in
                ((8, 16_384, 512), (8, 65_536, 2048), (32, 65_536, 1024), (32, 65_536, 2048))]
    for dist in dists:
        best: dict[str, tuple[float, str]] = {}
        for model, gpus, tokens, max_len in grid:
            ratios = run_setting(console, dist, model, gpus, tokens, max_len, args.iterations)
            for method in ("dynapipe", "ours"):
                if method in ratios and ratios[method] > best.get(f"{model} {method}",
                                                                  (0.0, ""))[0]:
                    best[f"{model} {method}"] = (ratios[method],
                                                 f"{gpus} GPUs, {tokens // 1024}K, {max_len}")
        for key, (ratio, where) in best.items():
            console.print(f"{dist}: best {key} vs packing: {ratio:.2f}x ({where})")
        planning_times(console, dist)


if __name__ == "__main__":
    main()
