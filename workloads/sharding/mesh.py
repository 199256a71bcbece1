"""A logical device mesh: 1-D or 2-D axes laid over the cluster's physical ranks.

Alpa (Zheng et al., OSDI'22 §4) and GSPMD view a group of GPUs as a logical mesh whose axes
have their own bandwidths: on two 4-GPU nodes, a 2 × 4 mesh puts axis 0 across the nodes (the
NIC) and axis 1 inside a node (NVLink/NVSwitch). Physical rank = row-major coordinates, axis 0
outermost, so axis 1 of a 2 × 4 mesh on 2 × 4 GPUs is the node and a 4 × 2 mesh pairs
neighbouring GPUs on axis 1. The mesh itself holds no costs: collectives along an axis are
priced on the real links of its groups by the planners and the lowering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsim.errors import SpecError


@dataclass(frozen=True, slots=True)
class DeviceMesh:
    """Axes sizes; devices are physical ranks 0 .. prod(shape) - 1 in row-major order."""

    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.shape) <= 2 or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.shape):
            raise SpecError(f"mesh shape {self.shape!r} must be 1 or 2 integers >= 1, "
                            f"e.g. 8 or 2x4")

    @property
    def size(self) -> int:
        """Number of devices."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self.shape)

    def coords(self, rank: int) -> tuple[int, ...]:
        """Mesh coordinates of device `rank` (row-major, axis 0 outermost)."""
        out = []
        for n in reversed(self.shape):
            out.append(rank % n)
            rank //= n
        return tuple(reversed(out))

    def rank(self, coords: tuple[int, ...]) -> int:
        """The device at `coords`."""
        r = 0
        for c, n in zip(coords, self.shape, strict=True):
            r = r * n + c
        return r

    def groups(self, axis: int) -> list[tuple[int, ...]]:
        """The device groups along `axis`: every group varies `axis` and fixes the others;
        all of them run an axis' collective at once."""
        seen: dict[tuple[int, ...], list[int]] = {}
        for r in range(self.size):
            c = list(self.coords(r))
            c[axis] = 0
            seen.setdefault(tuple(c), []).append(r)
        return [tuple(g) for g in seen.values()]

    def describe(self) -> str:
        """`8` or `2x4`."""
        return "x".join(str(n) for n in self.shape)


def parse_mesh(text: str | int | tuple[int, ...], num_gpus: int) -> DeviceMesh:
    """A mesh from "8", "2x4" or a tuple; it must cover at most `num_gpus` devices."""
    if isinstance(text, int):
        shape: tuple[int, ...] = (text,)
    elif isinstance(text, tuple):
        shape = text
    else:
        try:
            shape = tuple(int(p) for p in str(text).lower().replace("×", "x").split("x"))
        except ValueError:
            raise SpecError(f"mesh {text!r} is not N or AxB (e.g. 8 or 2x4)") from None
    mesh = DeviceMesh(shape)
    if mesh.size > num_gpus:
        raise SpecError(f"mesh {mesh.describe()} needs {mesh.size} GPUs; the cluster has "
                        f"{num_gpus}")
    return mesh


__all__ = ["DeviceMesh", "parse_mesh"]
