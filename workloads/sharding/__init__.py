"""SPMD sharding algebra on the zoo's op graphs (issue 17).

`mesh` lays 1-D/2-D logical axes over physical ranks; `spec` is the per-axis tensor layout
(R / T / F / E / P) and resharding as collectives; `graph` turns a model's op lists into a
data-flow graph with residual and side edges; `strategies` lists each op's legal roles per
axis; `plan` holds one strategy per op with its memory and edges. Lowering a plan to a Program
lives in search/intraop/program.py (above the simulator in the layering).
"""
