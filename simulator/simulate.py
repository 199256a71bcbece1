"""`simulate()`: the one API call behind `sim simulate` — resolve inputs, lower, run.

Accepts names as a user types them (a zoo model name or a model file, a cluster spec or YAML
file) or the objects themselves, so notebooks and the CLI share one path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainsim.errors import TrainsimError, unknown_name

if TYPE_CHECKING:
    from trainsim.hwmodels.cluster import Cluster
    from trainsim.simulator.result import SimResult
    from trainsim.workloads.lowering import LoweringOptions
    from trainsim.workloads.model import ModelSpec
    from trainsim.workloads.plan import ParallelPlan

ENGINES = ("numba", "simpy")
"""Engines `simulate` can run: the compiled twin (default) and the SimPy reference."""


def resolve_model(model: str | ModelSpec) -> ModelSpec:
    """A ModelSpec from a zoo name, a YAML/config.json path, or a ModelSpec."""
    if isinstance(model, str):
        from trainsim.errors import UnknownNameError
        from trainsim.workloads.zoo import get_model
        try:
            return get_model(model)
        except UnknownNameError:
            # The small models validation runs for real (tiny-gpt, ...) live beside it.
            from trainsim.validate.small_models import get_validation_model, list_validation_models
            if model.lower() in list_validation_models():
                return get_validation_model(model)
            raise
    return model


def resolve_cluster(cluster: str | Cluster) -> Cluster:
    """A Cluster from a short spec, a YAML path, or a Cluster."""
    if isinstance(cluster, str):
        from trainsim.hwmodels.cluster import parse_cluster
        return parse_cluster(cluster)
    return cluster


def simulate(model: str | ModelSpec, cluster: str | Cluster, plan: ParallelPlan | dict[str, Any],
             *, engine: str = "numba", options: LoweringOptions | None = None) -> SimResult:
    """Simulate one training iteration of `model` on `cluster` under `plan`.

    Args:
        model: Zoo name, model file path, or ModelSpec.
        cluster: Cluster spec (e.g. "4xV100-SXM2-32GB"), YAML path, or Cluster.
        plan: A ParallelPlan or a dict of its fields (checked against model and cluster).
        engine: "numba" (fast, default) or "simpy" (the readable reference).
        options: Lowering options (folding, what-if switches, cost model).

    Returns:
        The SimResult of the iteration.
    """
    from trainsim.workloads.lowering import lower
    from trainsim.workloads.plan import ParallelPlan

    spec = resolve_model(model)
    hw = resolve_cluster(cluster)
    if isinstance(plan, dict):
        plan = ParallelPlan.build(spec, hw, **plan)
    else:
        plan.check(spec, hw)
    program = lower(spec, hw, plan, options)
    return run_program(program, engine=engine)


def run_program(program: Any, *, engine: str = "numba",
                on_progress: Callable[[int, int], None] | None = None) -> SimResult:
    """Run a lowered Program on the named engine ("numba" by default, or "simpy").

    `on_progress(tasks_done, total)` is called now and then, for progress bars.
    """
    if engine == "numba":
        from trainsim.simulator.engine_numba import run_numba
        return run_numba(program, on_progress=on_progress)
    if engine == "simpy":
        from trainsim.simulator.engine_simpy import run_simpy
        return run_simpy(program, on_progress=on_progress)
    raise TrainsimError(str(unknown_name("engine", engine, ENGINES)))
