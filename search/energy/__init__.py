"""GPU frequency planning on the iteration time–energy frontier (Perseus, SOSP'24).

The entry is `planner.py`: the instruction DAG from a Perseus profile CSV or a model + cluster +
plan (`load_dag`), the frontier with its baselines and intrinsic saving (`run_frontier`), the
straggler pick, the lowered plans, and the JSON summaries and output files. The algorithm
modules beneath it:

* `profile.py`: per-instruction (time, energy) options per SM clock (`EnergyProfile`);
* `dag.py`: the 1F1B instruction DAG with options per node (`InstructionDag`);
* `point.py`: one frequency plan evaluated on the DAG (`FrontierPoint`);
* `frontier.py` + `kernels.py`: the frontier by min-cut crashing (numba kernels);
* `baselines.py`: all-max, ZeusGlobal, ZeusPerStage, EnvPipe;
* `straggler.py`: intrinsic saving and straggler-aware plan choice;
* `replay.py`, `lowered.py`: plans replayed through the engine, and through `lower()`;
* `plot.py`: the plotly frontier and timeline.
"""
