"""trainsim: simulate distributed deep-learning training on a CPU before renting GPUs.

`trainsim.api` is the one way in (load a model, a cluster and a plan from any spec form,
simulate, plan); `trainsim.simulate(model, cluster, plan)` is its one-call shortcut. Both load
on first use, so `import trainsim` and `sim --help` stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainsim.errors import TrainsimError

__all__ = ["TrainsimError", "__version__", "api", "simulate"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("api", "simulate"):
        # Loaded on first use for start-up time: the api imports every layer.
        api = importlib.import_module("trainsim.api")
        return api if name == "api" else api.simulate
    raise AttributeError(f"module 'trainsim' has no attribute {name!r}")
