"""The engines a Program can run on, by name: the numba twin (default) and the SimPy reference.

Both are imported on first use: numba compiles at import, which would slow `sim --help`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from trainsim.errors import TrainsimError, unknown_name

if TYPE_CHECKING:
    from trainsim.simulator.program import Program
    from trainsim.simulator.result import SimResult

ENGINES = ("numba", "simpy")
"""Engine names: the compiled twin (default) and the SimPy reference."""


def check_engine(engine: str) -> str:
    """`engine` if it names an engine, else a TrainsimError listing the valid names."""
    if engine not in ENGINES:
        raise TrainsimError(str(unknown_name("engine", engine, ENGINES)))
    return engine


def run_program(program: Program, *, engine: str = "numba",
                on_progress: Callable[[int, int], None] | None = None) -> SimResult:
    """Run a lowered Program on the named engine ("numba" by default, or "simpy").

    `on_progress(tasks_done, total)` is called now and then, for progress bars.
    """
    if check_engine(engine) == "numba":
        from trainsim.simulator.engine_numba import run_numba  # deferred: start-up time (numba)
        return run_numba(program, on_progress=on_progress)
    from trainsim.simulator.engine_simpy import run_simpy  # deferred: start-up time (simpy)
    return run_simpy(program, on_progress=on_progress)
