"""Time an Oracle on recorded plan streams, in a process of its own (bench/oracle.py's baseline).

bench/oracle.py runs this with ``PYTHONPATH`` pointing at an export of an older trainsim commit
(the code as it was when issue 15 was filed), so the same plans are timed by the Oracle of that
day. Only APIs that commit already had are used: `trainsim.api.load_model` / `load_cluster`,
`Oracle(model, cluster).evaluate_many`, `ParallelPlan.from_dict`.

Usage: ``python bench/oracle_baseline.py STREAMS.json [--keep-freed-memory]`` where the file holds
``{"streams": [{"name", "model", "cluster", "plans": [plan dicts]}]}``; prints one JSON object:
``{"trainsim": path imported, "streams": [{"name", "plans", "cpu_s", "errors"}]}``.
Each stream gets a fresh Oracle, after one untimed evaluation of its first plan on another
(numba's compiled kernels load then), with the garbage collector off while timed.
``--keep-freed-memory`` first applies `sim`'s malloc thresholds (simulator/malloc_tuning.py,
which the issue-day code does not have): bench/oracle.py times this tree that way too.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path


def main() -> None:
    import trainsim
    from trainsim.api import load_cluster, load_model
    from trainsim.search.oracle import Oracle
    from trainsim.workloads.plan import ParallelPlan

    if "--keep-freed-memory" in sys.argv[2:]:
        from trainsim.simulator.malloc_tuning import keep_freed_memory

        keep_freed_memory()
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    out = []
    for stream in spec["streams"]:
        model, cluster = load_model(stream["model"]), load_cluster(stream["cluster"])
        plans = [ParallelPlan.from_dict(p) for p in stream["plans"]]
        Oracle(model, cluster).evaluate_many(plans[:1])
        oracle = Oracle(model, cluster)
        gc.collect()
        gc.disable()
        t0 = time.process_time()
        summaries = oracle.evaluate_many(plans)
        seconds = time.process_time() - t0
        gc.enable()
        out.append({"name": stream["name"], "plans": len(plans), "cpu_s": seconds,
                    "errors": sum(1 for s in summaries if s.error)})
    print(json.dumps({"trainsim": trainsim.__file__, "streams": out}))


if __name__ == "__main__":
    main()
