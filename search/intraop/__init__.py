"""Intra-operator sharding search (CFP's ParallelBlocks vs an Alpa-style ILP): to come.

This package will hold the planner that chooses a sharding strategy per block of operators —
CFP's profiling of a few ParallelBlock segments, and an Alpa-style integer program over every
op as the reference — costing the chosen plans on the Oracle.

Every planner package has the same shape: `planner.py` is the entry (a `search.planner.Planner`
or a function returning ranked plans), the algorithm lives in its own modules beside it, and
plotting / export modules turn results into HTML and files a runtime consumes.
"""
