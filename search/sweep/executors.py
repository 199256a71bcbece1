"""Where a sweep's scenarios run: local worker processes (the default) or a Ray cluster.

An executor takes a picklable module-level function and a list of batches (lists of
scenarios) and yields each batch's result as it finishes, in any order: the runner puts rows
back in the spec's order, so the table is the same whatever ran it and however the work was
split. Both executors run the same function on the same scenarios, and the simulator is
deterministic, so `--executor ray` writes the table local processes write, row for row.

* `LocalExecutor`: a ProcessPoolExecutor of `workers` processes (in this process when 1).
  Workers ignore SIGINT, so Ctrl-C reaches only the runner, which saves the finished rows and
  cancels the rest instead of every worker printing a traceback.
* `RayExecutor`: Ray imported only here (an optional extra: `pip install 'trainsim[ray]'`).
  Without `--address` it starts a local Ray instance in this process (`workers` CPUs); with
  `auto` it joins the cluster `ray start` made on this machine; with HOST:PORT (or
  ray://HOST:PORT) the cluster there, after a 3-second TCP probe, so an unreachable address is
  one line, not a hang. Every Ray node needs trainsim installed (the same version: the keys
  carry it). Ray's own C++ logging writes straight to file descriptor 2 while it connects (a
  warning a second while it retries), so `ray.init` runs with fd 2 captured: a failure is one
  line carrying Ray's last complaint, a success prints nothing. A cluster started with token
  authentication (Ray's default since 2.5x) needs `RAY_AUTH_MODE=token` here too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol, TypeVar

from trainsim.errors import SpecError

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "ray")
MAX_WORKERS = 1024
RAY_INSTALL = "`--executor ray` needs Ray: pip install 'trainsim[ray]'"
"""The one line a missing Ray gets."""
_ADDRESS = re.compile(r"^(?:ray://)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})$")
PROBE_TIMEOUT_S = 3.0
"""How long the TCP probe of a HOST:PORT address waits."""


class Executor(Protocol):
    """Runs `fn` on each batch; yields results as batches finish (any order)."""

    name: str

    def run(self, fn: Callable[[T], R], batches: Sequence[T]) -> Iterator[R]:
        ...  # pragma: no cover


def default_workers() -> int:
    """Worker processes when `--workers` is not given: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def check_workers(workers: int | None) -> int:
    """`workers`, or the default (None or 0: one per CPU, as `sim pareto` reads 0), checked:
    0 to MAX_WORKERS."""
    if workers is None or workers == 0 and not isinstance(workers, bool):
        return default_workers()
    if isinstance(workers, bool) or not isinstance(workers, int) \
            or not 1 <= workers <= MAX_WORKERS:
        raise SpecError(f"--workers {workers!r} must be 0 (one per CPU) to {MAX_WORKERS}")
    return workers


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class LocalExecutor:
    """Worker processes on this machine (ProcessPoolExecutor), or this process for 1 worker."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = check_workers(workers)

    def run(self, fn: Callable[[T], R], batches: Sequence[T]) -> Iterator[R]:
        if self.workers == 1 or len(batches) <= 1:
            for batch in batches:
                yield fn(batch)
            return
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(batches)),
                                   initializer=_ignore_sigint)
        try:
            pending: set[Future[R]] = {pool.submit(fn, b) for b in batches}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        finally:
            # Ctrl-C or an early stop: drop the batches not started; those running are short.
            pool.shutdown(wait=True, cancel_futures=True)


def import_ray() -> Any:
    """The `ray` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise SpecError(RAY_INSTALL) from None
    return ray


def check_address(address: str | None) -> str | None:
    """`address` checked: None (a local Ray instance), `auto`, HOST:PORT or ray://HOST:PORT —
    the last two answering on TCP within PROBE_TIMEOUT_S."""
    if address is None or address == "auto":
        return address
    m = _ADDRESS.match(address.strip())
    if m is None or not 1 <= int(m["port"]) <= 65535:
        raise SpecError(f"--address {address!r} must be auto or HOST:PORT (a Ray head, e.g. "
                        f"127.0.0.1:6379)")
    host = m["host"].strip("[]")
    try:
        with socket.create_connection((host, int(m["port"])), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SpecError(f"--address {address}: no Ray head answers there ({reason}); start "
                        f"one with `ray start --head --port {m['port']}`") from None
    return address.strip()


@contextlib.contextmanager
def _captured_fd2() -> Iterator[list[str]]:
    """Send file descriptor 2 to a temporary file while the block runs; the list it yields
    holds that output's lines afterwards."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines += sink.read().decode("utf-8", errors="replace").splitlines()


def _ray_complaint(lines: Sequence[str]) -> str:
    """The most useful line Ray logged while failing to connect (its C++ log prefix cut)."""
    for line in reversed(lines):
        text = re.sub(r"^\[[^\]]*\]\s*(\S+:\d+:\s*)?", "", line.strip())
        if text:
            hint = "; set RAY_AUTH_MODE=token to connect with the cluster's token" \
                if "Unauthenticated" in text else ""
            return f"; Ray: {text[:200]}{hint}"
    return ""


class RayExecutor:
    """Ray tasks, one per batch (1 CPU each), on a local instance or a cluster."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        self.ray = import_ray()
        self.address = check_address(address)
        self.workers = None if workers is None else check_workers(workers)

    def _connect(self) -> bool:
        """Join or start Ray; True when this call started it (and so shuts it down)."""
        ray = self.ray
        if ray.is_initialized():
            return False
        options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR,
                                   "log_to_driver": False, "configure_logging": True}
        if self.address is None:
            options["num_cpus"] = self.workers or default_workers()
        failure: Exception | None = None
        with _captured_fd2() as logged:
            try:
                # "local": a new instance, even where `ray start` left a cluster file behind
                ray.init(address=self.address or "local", **options)
            except Exception as exc:  # noqa: BLE001 -- Ray raises ConnectionError, RuntimeError...
                failure = exc
        if failure is not None:
            text = str(failure).strip()
            first = text.splitlines()[0] if text else type(failure).__name__
            where = "a local Ray instance" if self.address is None else \
                f"--address {self.address}"
            raise SpecError(f"{where}: Ray did not start ({first[:200]}){_ray_complaint(logged)}")
        return True

    def run(self, fn: Callable[[T], R], batches: Sequence[T]) -> Iterator[R]:
        ray = self.ray
        started = self._connect()
        remote = ray.remote(num_cpus=1, max_retries=1)(fn)
        pending = [remote.remote(b) for b in batches]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield ray.get(ref)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if started:
                ray.shutdown()


def make_executor(kind: str, *, address: str | None = None,
                  workers: int | None = None) -> LocalExecutor | RayExecutor:
    """The executor named `kind` (local or ray), its options checked before any work."""
    if kind not in EXECUTORS:
        raise SpecError(f"--executor {kind!r} must be local or ray")
    if kind == "local":
        if address is not None:
            raise SpecError("--address needs --executor ray")
        return LocalExecutor(workers)
    return RayExecutor(address, workers)


__all__ = ["EXECUTORS", "RAY_INSTALL", "Executor", "LocalExecutor", "RayExecutor",
           "check_address", "check_workers", "default_workers", "import_ray", "make_executor"]
