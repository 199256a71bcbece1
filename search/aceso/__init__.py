"""Aceso (EuroSys'24): iterative bottleneck alleviation over non-uniform parallel plans.

The entry is `planner.py` (`AcesoPlanner`, a `search.planner.Planner`: seeds, bottleneck-driven
multi-hop moves and restarts on the Oracle). `moves.py` holds the plan encoding (`AcesoConfig`)
and the moves that relieve a bottleneck stage; `profile.py` reads Aceso's op-profile database
into an op cost model (`aceso_lowering_options`), so searches can run on measured V100 op times.
"""
