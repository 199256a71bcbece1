"""Folded against unfolded lowering (workloads/lowering/lower.py, "Folding"): how far apart.

Folding lowers each (pipeline stage, replica class) as one program rank and plans a folded
collective on its first group's links. On nodes wired alike (NVSwitch, PCIe) that is exact; on
nodes that are not (`node_symmetric` false: the DGX-1 hybrid cube-mesh, bridged A40 pairs) the
groups of one class can sit on links of different widths. This prints, for every dp × tp × pp
of a model on the given clusters, folded and unfolded iteration time and energy and their
difference (unfolded is the exact answer).

Usage: ``python bench/folding.py [--model gpt3-1.3b] [--cluster 8xV100-SXM2-32GB ...]
[--json]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

DEFAULT_CLUSTERS = ("4xV100-SXM2-32GB", "8xV100-SXM2-32GB", "2x8xV100-SXM2-32GB",
                    "8xA100-SXM4-80GB")


def compare(model: str, cluster: str) -> list[dict[str, Any]]:
    """One row per dp × tp × pp plan of `model` on `cluster` (micro-batch 1, 4 per replica)."""
    from trainsim import api
    from trainsim.errors import TrainsimError

    hw = api.load_cluster(cluster)
    n = hw.num_gpus
    rows = []
    for tp, pp in itertools.product([1, 2, 4, 8], [1, 2, 4]):
        if n % (tp * pp) or tp * pp == 1 and n == 1:
            continue
        dp = n // (tp * pp)
        fields = {"dp": dp, "tp": tp, "pp": pp, "micro_batch_size": 1, "global_batch": dp * 4}
        try:
            folded = api.simulate(model, hw, fields)
            unfolded = api.simulate(model, hw, fields, unfold=True)
        except TrainsimError as exc:
            rows.append({"cluster": cluster, "dp": dp, "tp": tp, "pp": pp, "error": str(exc)})
            continue
        t_f, t_u = folded.iteration_time_s, unfolded.iteration_time_s
        e_f, e_u = folded.energy_j, unfolded.energy_j
        rows.append({"cluster": cluster, "dp": dp, "tp": tp, "pp": pp,
                     "folded_s": t_f, "unfolded_s": t_u, "time_diff": t_f / t_u - 1,
                     "folded_j": e_f, "unfolded_j": e_u, "energy_diff": e_f / e_u - 1})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt3-1.3b")
    parser.add_argument("--cluster", nargs="+", default=list(DEFAULT_CLUSTERS))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    rows = [r for c in args.cluster for r in compare(args.model, c)]
    if args.json:
        print(json.dumps({"model": args.model, "rows": rows}, indent=2))
        return
    print(f"{args.model}: folded vs unfolded (difference = folded / unfolded - 1)")
    print(f"{'cluster':22s} {'dp':>3s} {'tp':>3s} {'pp':>3s} {'folded s':>10s} "
          f"{'unfolded s':>10s} {'time':>8s} {'energy':>8s}")
    for r in rows:
        head = f"{r['cluster']:22s} {r['dp']:3d} {r['tp']:3d} {r['pp']:3d}"
        if "error" in r:
            print(f"{head} refused: {r['error']}")
            continue
        print(f"{head} {r['folded_s']:10.4f} {r['unfolded_s']:10.4f} "
              f"{100 * r['time_diff']:+7.3f}% {100 * r['energy_diff']:+7.3f}%")
    done = [r for r in rows if "error" not in r]
    equal = sum(r["time_diff"] == 0 for r in done)
    print(f"equal time on {equal} of {len(done)} plans; time {100 * min(r['time_diff'] for r in done):+.3f}"
          f" % to {100 * max(r['time_diff'] for r in done):+.3f} %, energy up to "
          f"{100 * max(abs(r['energy_diff']) for r in done):.3f} % apart")


if __name__ == "__main__":
    main()
