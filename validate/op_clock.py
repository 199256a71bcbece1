"""Seconds per op kind of a real training iteration, read with clocks instead of the profiler.

`sim trace` used to take its per-op-kind breakdown from one iteration under torch.profiler.
That iteration is not the iterations it explains: on the CI machine kind (2026-11-27) the
profiled iteration of the tensor-parallel tiny-gpt trace took 185 ms against a 133 ms median
unprofiled, every record the profiler keeps costs 1.2-1.4 µs inside the op holding it
(~4,000 records an iteration), and one iteration alone can hold a time slice lost to another
process (a layer norm total of 6.05 ms in one run, 1.84 ms in the next).

An `OpClock` reads `time.perf_counter` instead, in a few extra iterations (median per kind):

* **forwards:** around each zoo op (validate/torch_model.py `op_range`), by its kind;
* **backwards:** autograd runs them, so every node of the iteration's graph gets a pre-hook and
  a hook (`hook_backward`) that time it, by the kind its name maps to (the Kineto folding's
  table, validate/trace_import.py ``BACKWARD_KINDS``);
* **communication:** every collective, receive and send wait of the validation model runs
  inside `comm` (validate/torch_ops.py, validate/torch_parallel.py), counted as ``comm``
  and taken out of the op or node it happens in (the vocab-parallel embedding's all-reduce,
  the cross entropy's all-gather, the tensor-parallel autograd nodes).

Two clock reads and, backward, two Python hooks per op: about a microsecond each, against the
profiler's records, allocation events and trace export.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from trainsim.validate.trace_import import BACKWARD_KINDS


class OpClock:
    """Seconds per op kind while it runs (module docstring)."""

    def __init__(self) -> None:
        self.fwd_s: dict[str, float] = {}
        """Seconds per kind of op forwards, net of their communication, and ``comm``."""
        self.bwd_s: dict[str, float] = {}
        """Seconds per kind of backward nodes, net of their communication."""
        self.comm_s = 0.0
        """Communication seconds so far (ops and nodes subtract what falls inside them)."""
        self._handles: list[Any] = []
        self._started: dict[int, tuple[float, float]] = {}

    def add(self, kind: str, seconds: float, *, backward: bool = False) -> None:
        into = self.bwd_s if backward else self.fwd_s
        into[kind] = into.get(kind, 0.0) + max(seconds, 0.0)

    @property
    def kind_s(self) -> dict[str, float]:
        """Seconds per kind, forwards and backwards together."""
        out = dict(self.fwd_s)
        for k, v in self.bwd_s.items():
            out[k] = out.get(k, 0.0) + v
        return out

    def hook_backward(self, root: Any) -> None:
        """Time every node of `root`'s autograd graph when the backward runs it (leaf
        accumulation nodes excepted: they outlive the iteration, and add gradients only)."""
        stack = [root.grad_fn] if root.grad_fn is not None else []
        seen = {id(n) for n in stack}
        while stack:
            node = stack.pop()
            name = node.name()
            if name != "torch::autograd::AccumulateGrad":
                kind = BACKWARD_KINDS.get(name, "other")
                self._handles.append(node.register_prehook(self._pre(node)))
                self._handles.append(node.register_hook(self._post(node, kind)))
            for nxt, _ in node.next_functions:
                if nxt is not None and id(nxt) not in seen:
                    seen.add(id(nxt))
                    stack.append(nxt)

    def _pre(self, node: Any) -> Any:
        def pre(grad_outputs: Any) -> None:
            self._started[id(node)] = (time.perf_counter(), self.comm_s)
        return pre

    def _post(self, node: Any, kind: str) -> Any:
        def post(grad_inputs: Any, grad_outputs: Any) -> None:
            start = self._started.pop(id(node), None)
            if start is not None:
                self.add(kind, time.perf_counter() - start[0] - (self.comm_s - start[1]),
                         backward=True)
        return post

    def finish(self) -> None:
        """Remove the hooks (they hold the graph's nodes)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


_CLOCK: list[OpClock | None] = [None]


@contextlib.contextmanager
def running() -> Iterator[OpClock]:
    """A fresh `OpClock` timing ops, nodes and communication inside the block; on leaving it
    stops and its backward hooks are removed (`OpClock.finish`)."""
    clock = OpClock()
    _CLOCK[0] = clock
    try:
        yield clock
    finally:
        _CLOCK[0] = None
        clock.finish()


def current() -> OpClock | None:
    """The running clock, or None."""
    return _CLOCK[0]


@contextlib.contextmanager
def timed_op(kind: str, clock: OpClock) -> Iterator[None]:
    """An op's forward on `clock`, net of the communication inside it."""
    t0, c0 = time.perf_counter(), clock.comm_s
    yield
    clock.add(kind, time.perf_counter() - t0 - (clock.comm_s - c0))


@contextlib.contextmanager
def comm() -> Iterator[None]:
    """A collective, receive or send wait: ``comm`` on the running clock (if any)."""
    clock = _CLOCK[0]
    if clock is None:
        yield
        return
    t0 = time.perf_counter()
    yield
    dt = time.perf_counter() - t0
    clock.comm_s += dt
    clock.add("comm", dt)
