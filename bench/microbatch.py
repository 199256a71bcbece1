"""Dynamic micro-batching (issue 16): DynaPipe and ours against packing, replayed on the engine.

Settings from DynaPipe's evaluation (Jiang et al., EuroSys'24 §7: up to 4 x 8 A100-40GB,
16K-64K tokens per global batch, GPT-6.7B-class and T5-11B-width models): gpt3-6.7b and
t5-11b on 8 and 32 A100-SXM4-40GB, on the length distributions of
workloads/data/length_mixtures.yaml (`flan`, built to FLAN v2's public statistics;
`flan-zsopt`, its zero-shot part, the data DynaPipe's artifact trains on; `uniform-long`, a
contrast). Every method runs eager attention, as DynaPipe's artifact ran Megatron-LM (no
--use-flash-attn; `PUBLISHED`); the `-flash` rows run packing and ours with FlashAttention.
For every setting and method it prints real tokens/s (padding excluded) and the ratio to
packing, padding efficiency, recompute and schedule used, then a `gains:` line splitting ours'
gain into micro-batching (padding, attention over packed rows, recompute: `ours-1f1b` vs
`packing`) and schedule (`ours` vs `ours-1f1b`). Then the planning time per iteration at 64K
tokens: the median over 100 batches of forming the micro-batches (no replay).

``--published``: DynaPipe's own 8-GPU settings (max length 512-8192 at 64K tokens, 2048 at
16K-128K), each framework at the configuration its grid search chose (`PUBLISHED`).

Usage: ``python bench/microbatch.py [--quick] [--full] [--iterations K] [--planning]
[--published [MODEL ...]]`` (--quick: one setting per model, first distribution; --full: all
2 x 2 x 3 x 3 settings per distribution; --planning: planning times only).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import time
from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

from trainsim import api
from trainsim.search.microbatch.planner import MethodResult, MicroBatchPlanner
from trainsim.simulator.schedules import get_schedule
from trainsim.workloads.lengths import LengthDataset, fit_max_len, iteration_batches
from trainsim.workloads.model import ModelSpec

MODELS = {  # model -> {GPUs: (dp, tp, pp)}: model states fit A100-40GB with room for activations
    "gpt3-6.7b": {8: (2, 2, 2), 32: (8, 2, 2)},
    "t5-11b": {8: (1, 2, 4), 32: (4, 2, 4)},
}
CLUSTERS = {8: "1x8xA100-SXM4-40GB", 32: "4x8xA100-SXM4-40GB"}
METHODS = ("packing", "fixed", "token-budget", "dynapipe", "ours-1f1b", "ours")


def run_setting(console: Console, dist: str, model: str, gpus: int, tokens: int, max_len: int,
                iterations: int) -> dict[str, float]:
    """Every method with eager attention (as DynaPipe's artifact ran Megatron-LM: no
    --use-flash-attn, `PUBLISHED`), then packing and ours with FlashAttention everywhere; the
    last line splits ours' gain into micro-batching and schedule."""
    dp, tp, pp = MODELS[model][gpus]
    dataset = api.length_dataset(synthetic=dist, samples=20_000, seed=0)
    max_target = min(max_len // 4, 512) if model.startswith("t5") else None
    spec = api.load_model(model)
    t0 = time.perf_counter()
    runs = []
    for attention, methods in (("eager", METHODS), ("flash", ("packing", "ours"))):
        found, _ = api.microbatch(dataclasses.replace(spec, attention=attention),
                                  CLUSTERS[gpus], dataset, dp=dp, tp=tp, pp=pp,
                                  tokens_per_batch=tokens, iterations=iterations,
                                  max_len=max_len, max_target_len=max_target, methods=methods,
                                  packing_attention=attention)
        for r in found:
            r.method += "-flash" if attention == "flash" else ""
        runs += found
    wall = time.perf_counter() - t0
    by = {r.method: r for r in runs}
    table = Table(title=f"{dist}: {model} on {gpus} x A100-40GB (dp={dp} tp={tp} pp={pp}), "
                        f"{tokens // 1024}K tokens/batch, max length {max_len}"
                        + (f" (targets {max_target})" if max_target else "")
                        + f", {iterations} iterations ({wall:.0f} s); eager attention, "
                          f"-flash rows: FlashAttention for every method")
    for col in ("method", "real tok/s", "vs packing", "padding eff.", "peak GiB", "recompute",
                "schedule", "micro-batches/iter", "error"):
        table.add_column(col, justify="left" if col in ("method", "recompute", "schedule",
                                                         "error") else "right")
    out = {}
    for r in runs:
        if not r.iterations:
            table.add_row(r.method, "-", "-", "-", "-", "-", "-", "-", r.error or "")
            continue
        base = by["packing-flash" if r.method.endswith("-flash") else "packing"].tokens_per_s
        ratio = r.tokens_per_s / base if base else float("nan")
        out[r.method] = ratio
        table.add_row(r.method, f"{r.tokens_per_s:,.0f}", f"{ratio:.2f}x",
                      f"{r.padding_efficiency:.3f}", f"{r.peak_bytes / 2**30:.1f}",
                      ",".join(f"{k}x{v}" for k, v in r.counts("recompute").items()),
                      ",".join(f"{k}x{v}" for k, v in r.counts("schedule").items()),
                      f"{sum(i.micro_batches for i in r.iterations) / len(r.iterations):.0f}",
                      r.error or "")
    console.print(table)
    console.print(gains(by))
    return out


def gains(by: dict[str, MethodResult]) -> str:
    """Where ours' gain over packing comes from: micro-batching (ours-1f1b vs packing: padding,
    attention over packed rows, recompute, all on 1F1B) times schedule (ours vs ours-1f1b)."""
    pack, one, ours = (by.get(k) for k in ("packing", "ours-1f1b", "ours"))
    if not (pack and one and ours and pack.iterations and one.iterations and ours.iterations):
        return "gains: a method did not run"

    def rc(r: MethodResult) -> str:
        return ",".join(r.counts("recompute"))

    split = one.tokens_per_s / pack.tokens_per_s
    sched = ours.tokens_per_s / one.tokens_per_s
    return (f"gains: ours {split * sched:.2f}x = micro-batching {split:.2f}x (padding "
            f"efficiency {pack.padding_efficiency:.2f} -> {one.padding_efficiency:.2f}, "
            f"recompute {rc(pack)} -> {rc(one)}) x schedule {sched:.2f}x "
            f"({','.join(ours.counts('schedule'))})")


def plan_once(planner: MicroBatchPlanner, method: str, inputs: np.ndarray,
              targets: np.ndarray) -> None:
    """What an iteration plans: the micro-batches, then the cyclic orders it may replay."""
    options, rc, _ = planner.form(method, inputs, targets)
    for option in options:
        for name in planner.cyclic_schedules(("cyclic",), option, rc):
            for m in {len(ms) for ms in option.replicas}:
                get_schedule(name)(planner.pp, m)


def planning_times(console: Console, dist: str) -> None:
    """Median time to plan one 64K-token batch, over 100 batches, as each iteration does it:
    forming the micro-batches (recompute fallback included; ours forms its exact and thinned
    split) and building the cyclic orders the iteration may replay (memory cap included);
    the one-off cost grid is built before timing. Wall-clock and this process's CPU time (the
    machine is shared: CPU time is what planning costs when it has a core to itself)."""
    table = Table(title=f"{dist}: planning time per iteration, 64K tokens/batch, median of 100")
    for col in ("model", "samples/batch", "dynapipe ms", "dynapipe CPU ms", "ours ms",
                "ours CPU ms"):
        table.add_column(col, justify="left" if col == "model" else "right")
    dataset = api.length_dataset(synthetic=dist, samples=20_000, seed=1)
    for model, degrees in MODELS.items():
        dp, tp, pp = degrees[8]
        spec = api.load_model(model)
        max_target = 512 if spec.family == "t5" else 0
        planner = MicroBatchPlanner(spec, api.load_cluster(CLUSTERS[8]), dp=dp, tp=tp, pp=pp,
                                    max_len=2048, max_target_len=max_target)
        fitted = fit_max_len(dataset, 2048, max_target_len=max_target or None)
        batches = iteration_batches(fitted, 65_536, iterations=101, seed=1)

        times: dict[str, list[tuple[float, float]]] = {"dynapipe": [], "ours": []}
        for k, (batch, method) in enumerate(itertools.product(batches, times)):
            inputs = np.array([s.input_len for s in batch], float)
            targets = np.array([s.target_len for s in batch], float)
            wall, cpu = time.perf_counter(), time.process_time()
            plan_once(planner, method, inputs, targets)
            if k >= len(times):  # the first batch builds the cost grids: not timed
                times[method].append((time.perf_counter() - wall, time.process_time() - cpu))
        table.add_row(model, f"{statistics.median(len(b) for b in batches[1:]):.0f}",
                      *(f"{statistics.median(t[i] for t in times[m]) * 1e3:.1f}"
                        for m in times for i in (0, 1)))
    console.print(table)


# DynaPipe's artifact (chenyu-jiang/Megatron-LM, branch dynapipe, experiment_configs/
# best_configs/{gpt_6.7b_32l,t5_11b_24l}_{baseline,dynapipe}_mid.jsonl): the 8-GPU ("mid",
# cluster_configs/mid.json: 1 node x 8 GPUs) settings of the paper's Fig. 13 (64K tokens, max
# length 512-8192) and Fig. 14 (max length 2048, 16K-128K tokens), each framework at the
# (tp, pp, ZeRO stage) its grid search found best. Both ran Megatron-LM without
# --use-flash-attn (run_experiment.py, finetune_*.template), the baseline with --pack-dataset:
# samples (GPT: input + target as one sequence) concatenated into rows of the max length and
# trained with the plain causal mask (no --reset-attention-mask), so attention spans the row.
# T5 targets may be as long as the inputs (decoder_seq_length = seq_length).
PUBLISHED: dict[str, list[tuple[int, int, tuple[int, int, int], tuple[int, int, int]]]] = {
    # model: [(max length, tokens per batch, baseline (tp, pp, zero), dynapipe (tp, pp, zero))]
    "gpt3-6.7b": [(512, 65_536, (1, 4, 1), (1, 4, 1)), (1024, 65_536, (1, 4, 1), (1, 4, 1)),
                  (2048, 16_384, (4, 2, 1), (1, 4, 1)), (2048, 32_768, (4, 2, 1), (1, 4, 1)),
                  (2048, 65_536, (1, 4, 1), (1, 4, 1)), (2048, 131_072, (1, 4, 1), (1, 4, 1)),
                  (4096, 65_536, (4, 1, 2), (1, 4, 1)), (8192, 65_536, (4, 1, 2), (4, 2, 1))],
    "t5-11b": [(512, 65_536, (4, 1, 2), (8, 1, 1)), (1024, 65_536, (4, 1, 2), (8, 1, 1)),
               (2048, 16_384, (4, 1, 2), (8, 1, 1)), (2048, 32_768, (8, 1, 2), (8, 1, 1)),
               (2048, 65_536, (4, 1, 2), (8, 1, 1)), (2048, 131_072, (4, 1, 2), (8, 1, 1)),
               (4096, 65_536, (8, 1, 2), (8, 1, 1))],
}


def _run(model: ModelSpec, dataset: LengthDataset, cfg: tuple[int, int, int], max_len: int,
         tokens: int, iterations: int, methods: tuple[str, ...], attention: str
         ) -> list[MethodResult]:
    """`methods` on 8 A100-40GB with (tp, pp, zero) = cfg, every method on `attention`."""
    tp, pp, zero = cfg
    spec = dataclasses.replace(model, attention=attention,
                               max_position_embeddings=max(max_len, model.max_seq_len))
    target = max_len if spec.family == "t5" else None
    results, _ = api.microbatch(spec, CLUSTERS[8], dataset, dp=8 // (tp * pp), tp=tp, pp=pp,
                                tokens_per_batch=tokens, iterations=iterations,
                                max_len=max_len, max_target_len=target, methods=methods,
                                packing_attention=attention, zero=zero)
    return results


def published(console: Console, dist: str, iterations: int, models: Sequence[str]) -> None:
    """Each framework at its own published configuration (`PUBLISHED`), as the paper compares
    them: packing at the baseline's, DynaPipe and ours at DynaPipe's; `packing (c)` is the
    paper's control, packing at DynaPipe's configuration. Eager attention everywhere (as the
    artifact ran); the last column repeats packing vs ours with FlashAttention everywhere."""
    dataset = api.length_dataset(synthetic=dist, samples=20_000, seed=0)
    for model in models:
        spec = api.load_model(model)
        table = Table(title=f"{dist}: {model} on 8 x A100-40GB, DynaPipe's published settings "
                            f"(each at its own tp/pp/ZeRO), {iterations} iterations")
        for col in ("max len", "tokens", "packing tok/s", "packing cfg", "packing (c)",
                    "dynapipe tok/s", "dynapipe cfg", "dynapipe", "ours", "ours-1f1b",
                    "flash: ours / packing"):
            table.add_column(col, justify="right")
        for max_len, tokens, base_cfg, dyn_cfg in PUBLISHED[model]:
            def rate(results: list[MethodResult], method: str) -> float:
                r = next(x for x in results if x.method == method)
                return r.tokens_per_s if r.iterations else float("nan")

            base = _run(spec, dataset, base_cfg, max_len, tokens, iterations, ("packing",),
                        "eager")
            ctrl = _run(spec, dataset, dyn_cfg, max_len, tokens, iterations, ("packing",),
                        "eager") if dyn_cfg != base_cfg else base
            dyn = _run(spec, dataset, dyn_cfg, max_len, tokens, iterations,
                       ("dynapipe", "ours-1f1b", "ours"), "eager")
            fb = _run(spec, dataset, base_cfg, max_len, tokens, iterations, ("packing",),
                      "flash")
            fo = _run(spec, dataset, dyn_cfg, max_len, tokens, iterations, ("ours",), "flash")
            p = rate(base, "packing")
            packed, dynapipe = base[0], dyn[0]

            def cfg(c: tuple[int, int, int], r: MethodResult) -> str:
                return (f"tp{c[0]} pp{c[1]} z{c[2]} "
                        + ",".join(r.counts("recompute")) + " "
                        + ",".join(r.counts("schedule")))

            table.add_row(
                str(max_len), f"{tokens // 1024}K",
                f"{p:,.0f}" if packed.iterations else (packed.error or "-")[:40],
                cfg(base_cfg, packed), f"{rate(ctrl, 'packing') / p:.2f}x",
                f"{rate(dyn, 'dynapipe'):,.0f}", cfg(dyn_cfg, dynapipe),
                f"{rate(dyn, 'dynapipe') / p:.2f}x", f"{rate(dyn, 'ours') / p:.2f}x",
                f"{rate(dyn, 'ours-1f1b') / p:.2f}x",
                f"{rate(fo, 'ours') / rate(fb, 'packing'):.2f}x")
        console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--published", nargs="*", metavar="MODEL",
                        help="only DynaPipe's published 8-GPU settings (PUBLISHED), each "
                             "framework at its own configuration (default: both models)")
    parser.add_argument("--planning", action="store_true",
                        help="only the planning time per iteration (median of 100)")
    args = parser.parse_args()
    console = Console(width=200)
    dists = api.list_length_mixtures()
    if args.published is not None:
        for dist in ("flan-zsopt", "flan"):  # the artifact's data (zero-shot part), all FLAN
            published(console, dist, args.iterations, args.published or list(PUBLISHED))
        return
    if args.planning:
        for dist in dists:
            planning_times(console, dist)
        return
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
