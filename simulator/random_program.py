"""Seeded random Programs for property tests and engine benchmarks.

`random_program(seed, num_ranks, num_tasks)` builds a valid program that always finishes: every
dependency points to an earlier task, and stream order is task order, so every edge of the
dep + stream-order graph goes forward and there is no cycle (program.py: deadlock-free exactly
when that graph is acyclic). It mixes local compute on powered streams, collectives and
point-to-point transfers across random rank subsets on communication streams, links shared by
many transfers, and memory: allocations freed later by a task on the same rank that depends on
them, and temporary buffers freed by the task that allocated them, so memory never falls below
the static base. `deadlock=True` then adds one edge that closes a cycle.

Python's `random.Random(seed)` drives everything, so a seed gives the same program on every run.
"""

from __future__ import annotations

import random
from dataclasses import replace

from trainsim.errors import SimulationError
from trainsim.simulator.program import Program, ProgramInfo
from trainsim.simulator.task import Task

_STREAMS = ("compute", "tp", "pp", "dp", "aux")
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
_LOCAL = ("forward", "backward", "backward_input", "backward_weight", "recompute", "optimizer")


def random_program(
    seed: int,
    num_ranks: int,
    num_tasks: int,
    *,
    num_streams: int = 3,
    num_links: int = 3,
    comm_fraction: float = 0.3,
    max_deps: int = 3,
    dep_window: int = 20,
    memory_capacity_bytes: float | None = None,
    deadlock: bool = False,
) -> Program:
    """Return a random program (deterministic in `seed`).

    Args:
        seed: seed of the generator.
        num_ranks: program ranks (>= 1).
        num_tasks: tasks to generate (>= 0; >= 2 with `deadlock`).
        num_streams: streams per rank to draw from (1..5): "compute" then "tp", "pp", "dp", "aux".
        num_links: links to share (>= 1), bandwidths 1e3..1e4 bytes/s.
        comm_fraction: share of tasks that are collectives / transfers (needs >= 2 streams).
        max_deps: most deps per task, drawn from the `dep_window` previous tasks.
        memory_capacity_bytes: per-rank capacity (None = unlimited).
        deadlock: close one cycle so the program can never finish.
    """
    if num_ranks < 1 or num_tasks < 0 or not 1 <= num_streams <= len(_STREAMS) or num_links < 1:
        raise SimulationError(
            f"random_program: need num_ranks>=1, num_tasks>=0, 1<=num_streams<={len(_STREAMS)}, "
            f"num_links>=1; got {num_ranks}, {num_tasks}, {num_streams}, {num_links}"
        )
    if deadlock and num_tasks < 2:
        raise SimulationError(f"random_program: deadlock needs num_tasks>=2, got {num_tasks}")
    rng = random.Random(seed)
    streams = _STREAMS[:num_streams]
    comm_streams = streams[1:] or streams
    links = {f"link{i}": float(rng.choice((1e3, 2e3, 5e3, 1e4))) for i in range(num_links)}
    link_ids = sorted(links)
    outstanding: list[list[tuple[int, float]]] = [[] for _ in range(num_ranks)]
    tasks: list[Task] = []
    for tid in range(num_tasks):
        deps = set()
        if tid:
            for _ in range(rng.randint(0, max_deps)):
                deps.add(rng.randrange(max(0, tid - dep_window), tid))
        is_comm = num_ranks >= 1 and rng.random() < comm_fraction
        if is_comm:
            size = rng.randint(2, min(num_ranks, 4)) if num_ranks >= 2 else 1
            ranks = tuple(sorted(rng.sample(range(num_ranks), size)))
            kind = "p2p" if size == 2 and rng.random() < 0.5 else rng.choice(_COLLECTIVES)
            temp = float(rng.choice((0, 0, 64, 256)))
            task = Task(
                name=f"{kind}{tid}",
                kind=kind,
                ranks=ranks,
                stream=rng.choice(comm_streams),
                duration_s=rng.choice((0.0, 0.001, 0.01)),
                comm_bytes=float(rng.choice((0, 10, 100, 1000))),
                links=tuple(sorted(rng.sample(link_ids, rng.randint(1, min(2, len(link_ids)))))),
                deps=tuple(sorted(deps)),
                mem_alloc_bytes=temp,
                mem_free_bytes=temp,
                power_w=float(rng.choice((100, 200))),
            )
        else:
            rank = rng.randrange(num_ranks)
            alloc = free = 0.0
            if rng.random() < 0.4:
                alloc = float(rng.choice((100, 1000, 5000)))
            if outstanding[rank] and rng.random() < 0.5:
                src, free = outstanding[rank].pop(rng.randrange(len(outstanding[rank])))
                deps.add(src)
            kind = rng.choice(_LOCAL)
            task = Task(
                name=f"{kind}{tid}",
                kind=kind,
                ranks=(rank,),
                stream=rng.choice(streams) if rng.random() < 0.2 else streams[0],
                duration_s=rng.choice((0.0, 0.01, 0.05, 0.1, 0.2)),
                deps=tuple(sorted(deps)),
                mem_alloc_bytes=alloc,
                mem_free_bytes=free,
                power_w=float(rng.choice((150, 250, 300))),
                freq_mhz=float(rng.choice((1200, 1410))),
                micro_batch=rng.randrange(4),
                stage=rank,
                first_layer=0,
                last_layer=rng.randrange(1, 4),
            )
            if alloc:
                outstanding[rank].append((tid, alloc))
        tasks.append(task)
    if deadlock:
        tasks = _close_cycle(tasks, rng)
    return Program(
        num_ranks=num_ranks,
        tasks=tasks,
        link_bandwidth_bytes_per_s=links,
        static_memory_bytes=[float(rng.choice((0, 1000))) for _ in range(num_ranks)],
        memory_capacity_bytes=(
            [] if memory_capacity_bytes is None else [memory_capacity_bytes] * num_ranks
        ),
        idle_power_w=[float(rng.choice((30, 60))) for _ in range(num_ranks)],
        info=ProgramInfo(generator="random_program", seed=seed),
    )


def _close_cycle(tasks: list[Task], rng: random.Random) -> list[Task]:
    """Make an earlier task wait for a later one on its own stream (or, failing that, a dep loop)."""
    queues: dict[tuple[int, str], list[int]] = {}
    for tid, task in enumerate(tasks):
        for rank in task.ranks:
            queues.setdefault((rank, task.stream), []).append(tid)
    long_queues = [q for _, q in sorted(queues.items()) if len(q) >= 2]
    if long_queues:
        queue = rng.choice(long_queues)
        first, later = sorted(rng.sample(queue, 2))
    else:  # every stream holds one task: a dep loop between two tasks
        first, later = 0, len(tasks) - 1
        tasks[later] = replace(tasks[later], deps=tuple(sorted({*tasks[later].deps, first})))
    tasks[first] = replace(tasks[first], deps=tuple(sorted({*tasks[first].deps, later})))
    return tasks
