"""Planners that query the simulator as their cost oracle (DESIGN.md §4).

The shared planner frame sits at this level: `planner.py` (SearchSpec, the Planner protocol,
`run_search`), `oracle.py` (lower + fast engine + cache), `grid.py` (Megatron-LM's uniform
grid, the baseline), `exports.py` (a plan as Aceso config or Megatron-LM flags, the files a
search writes) and `methods.py` (the planners by name). Each published method is a
subpackage with the same shape — `planner.py` as its entry, its algorithm modules beside it,
plotting and export: `aceso/`, `energy/`, and, to come, `hetero/`, `microbatch/`, `intraop/`.

Planners take resolved objects (ModelSpec, Cluster); names and files are resolved above them,
in `trainsim.api`. Planner packages import the frame, never the other way round.
"""
