"""trainsim: simulate distributed deep-learning training on a CPU before renting GPUs."""

from trainsim.errors import TrainsimError

__all__ = ["TrainsimError", "__version__"]
__version__ = "0.1.0"
