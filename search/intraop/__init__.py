"""Intra-operator sharding search (issue 17): CFP's ParallelBlocks against an Alpa-style ILP.

Both planners choose an SPMD strategy per op (workloads/sharding/) on a 1-D or 2-D device mesh
and hand the plan to the same Oracle — the whole iteration lowered to a Program
(`program.py`) and run by the numba engine:

* `blocks.py`   ParallelBlocks: ops inside which a sharding propagates with no collective;
* `costs.py`    prices: the engine's (`OraclePricing`) and Alpa's α-β model;
* `problem.py`  block option times and memory, inter-block resharding costs;
* `alpa.py`     Alpa's ILP (scipy.optimize.milp / HiGHS), with its MIP gap;
* `cfp.py`      CFP: Oracle runs per distinct block, DP over repeated segments, memory limit
                by Lagrangian bisection and an outer knapsack over layers;
* `megatron.py` Megatron-LM's hand tensor parallelism, the baseline;
* `planner.py`  the entry, `run_intraop(model, cluster, method="intraop" | "alpa" |
                "megatron")`, and what CFP does beyond the paper (gradient-overlap re-solve,
                engine polish of segment boundaries, per-block recompute).
* `pipeline.py` beyond CFP: pipeline stages (each a sub-mesh running CFP's plan for its
                layers) and micro-batches under 1F1B, lowered into one Program, the grid
                of (pp, micro-batches) searched on the engine (`run_intraop_pp`, method
                "intraop-pp").
"""
