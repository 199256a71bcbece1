"""Dynamic micro-batching (DynaPipe): to come.

This package will hold the planner that splits a batch of variable-length samples into
micro-batches of different shapes (dynamic programming over the sorted lengths) and schedules
them memory-aware, costing candidates on the Oracle.

Every planner package has the same shape: `planner.py` is the entry (a `search.planner.Planner`
or a function returning ranked plans), the algorithm lives in its own modules beside it, and
plotting / export modules turn results into HTML and files a runtime consumes.
"""
