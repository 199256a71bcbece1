"""`sim calibrate ops` on real measurements: Aceso's V100 op profiles (issue 13, item 7b).

Aceso's profile database (../shared/data/aceso/profiled-time-eurosys, measured on V100-32GB
nodes) times every op of its GPT models at several micro-batch sizes. This script turns the
tp = 1 files into a `sim profile`-style database -- one row per (op, pass) whose Aceso op maps
to exactly one trainsim op, with trainsim's FLOPs and bytes for it -- fits the roofline's
per-class factors and launch overhead (validate/roofline_fit.py), and prints the op-time error
with the catalog's coefficients and with the fitted ones:

* in sample (all rows),
* two-fold held out (alternate rows by size within each kind),
* leave one model size out (fit without GPT-X, error on GPT-X): does the fit transfer?

Usage: ``python bench/op_calibration.py [--gpu V100-SXM2-32GB]``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

from trainsim.hwmodels.gpus import get_gpu
from trainsim.hwmodels.opcost import RooflineCostModel
from trainsim.search.aceso.profile import (
    AcesoCostModel,
    layer_op_map,
    load_aceso_profile,
)
from trainsim.validate.profile_db import ProfileDB, ProfileRow
from trainsim.validate.roofline_fit import fit_op_efficiency
from trainsim.workloads.model import build_graph
from trainsim.workloads.zoo import get_model

ACESO = (Path(os.environ.get("TRAINSIM_SHARED_DATA") or
              Path(__file__).resolve().parents[2] / "shared" / "data")
         / "aceso" / "profiled-time-eurosys")
MODELS = ("aceso-gpt-350m", "aceso-gpt-1.3b", "aceso-gpt-2.6b", "aceso-gpt-6.7b",
          "aceso-gpt-13b")


def aceso_rows(folder: Path, model_name: str) -> list[ProfileRow]:
    """Aceso's measured tp = 1 op times of one model as profile rows (one zoo op each)."""
    model = get_model(model_name)
    cost = AcesoCostModel(load_aceso_profile(folder), model)
    rows: list[ProfileRow] = []
    for mbs in sorted(cost.times.get(1, {})):
        graph = build_graph(model, mbs)
        seen: set[str] = set()
        for i, layer in enumerate(graph.layers):
            ops = {op.name: op for op in layer.sharded_ops(1, False, 1)}
            for names, zoo in layer_op_map(model, layer, i):
                key = f"{layer.kind}:{'+'.join(names)}"
                if len(zoo) != 1 or zoo[0] not in ops or key in seen:
                    continue
                seen.add(key)
                measured = cost._measured(tuple(names), mbs, 1)
                if measured is None:
                    continue
                op = ops[zoo[0]]
                for pass_, t, flops, moved in (("fwd", measured[0], op.fwd_flops, op.fwd_bytes),
                                               ("bwd", measured[1], op.bwd_flops, op.bwd_bytes)):
                    if t > 0 and (flops > 0 or moved > 0):
                        rows.append(ProfileRow(kind=op.kind, shape=op.shape or (), pass_=pass_,
                                               flops=flops, bytes_moved=moved, time_s=t))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="V100-SXM2-32GB")
    args = parser.parse_args()
    if not ACESO.is_dir():
        print(f"no Aceso profiles at {ACESO} (set TRAINSIM_SHARED_DATA)", file=sys.stderr)
        return 2
    gpu = get_gpu(args.gpu)
    per_model = {name: aceso_rows(ACESO, name) for name in MODELS}
    everything = [r for rows in per_model.values() for r in rows]
    fit = fit_op_efficiency(ProfileDB(rows=tuple(everything)), gpu, "fp16")
    print(f"sim calibrate ops on Aceso's V100 op times ({fit.rows} rows from "
          f"{len(MODELS)} GPT sizes, tp = 1, fwd and bwd)\n")
    print(f"{'class':<14}{'rows':>6}{'factor':>9}{'MAPE catalog':>14}{'MAPE fitted':>13}")
    for c in fit.classes:
        print(f"{c.cls:<14}{c.rows:>6}{c.factor:>9.3f}{c.mape_before:>14.1%}"
              f"{c.mape_after:>13.1%}")
    print(f"{'memory bw':<14}{'':>6}{fit.efficiency.memory_scale:>9.3f}")
    print(f"{'overhead':<14}{'':>6}{(fit.efficiency.launch_overhead_s or 0) * 1e6:>7.2f}us")
    print(f"{'all':<14}{fit.rows:>6}{'':>9}{fit.mape_before:>14.1%}{fit.mape_after:>13.1%}")
    print(f"two-fold held-out MAPE: {fit.holdout_mape:.1%}\n")
    print("leave one model size out (fit on the others, error on this one)")
    print(f"{'model':<18}{'rows':>6}{'MAPE catalog':>14}{'MAPE held out':>15}")
    for name, rows in per_model.items():
        rest = [r for other, rs in per_model.items() if other != name for r in rs]
        held = fit_op_efficiency(ProfileDB(rows=tuple(rest)), gpu, "fp16")
        base, fitted = RooflineCostModel(), RooflineCostModel(
            op_efficiency={gpu.name: held.efficiency})
        err = {label: float(np.mean([abs(m.estimate(r.kind, r.flops, r.bytes_moved, gpu)
                                         .time_s / r.time_s - 1) for r in rows]))
               if rows else math.nan for label, m in (("base", base), ("fit", fitted))}
        print(f"{name:<18}{len(rows):>6}{err['base']:>14.1%}{err['fit']:>15.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
