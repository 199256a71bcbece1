"""Heterogeneous-cluster planning (FASOP / AMP): to come.

This package will hold the planner that picks GPU types per stage, the parallel degrees and the
layer partition on a cluster of several node groups, ranking plans by cost against time (a
Pareto front) on the Oracle.

Every planner package has the same shape: `planner.py` is the entry (a `search.planner.Planner`
or a function returning ranked plans), the algorithm lives in its own modules beside it, and
plotting / export modules turn results into HTML and files a runtime consumes.
"""
