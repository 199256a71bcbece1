"""trainsim: simulate distributed deep-learning training on a CPU before renting GPUs.

`trainsim.simulate(model, cluster, plan)` is the one-call API (see simulator/simulate.py); it is
imported lazily so `import trainsim` and `sim --help` stay fast.
"""

from __future__ import annotations

from typing import Any

from trainsim.errors import TrainsimError

__all__ = ["TrainsimError", "__version__", "simulate"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "simulate":
        from trainsim.simulator.simulate import simulate
        return simulate
    raise AttributeError(f"module 'trainsim' has no attribute {name!r}")
