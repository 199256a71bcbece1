"""Communication tasks for lowering: collectives and transfers as Program tasks on real links.

`CommLowering` turns "collective `kind` of S bytes over physical ranks G" into Program tasks:
it plans the collective on the cluster (simulator/collectives.py), merges consecutive phases
that load the same links into one task (their latencies and bytes add, so a lone task takes
exactly the planned time), and names the links each task crosses so that the engine's fluid
model shares them with every other transfer running at the same time.

**Folding.** A folded program rank stands for several identical GPUs, so one folded task stands
for N concurrent copies of a collective (e.g. the data-parallel all-reduces of the eight
tensor-parallel ranks of a stage). Where n of those copies cross one physical link ``l``, the
folded task crosses the virtual link ``l/n`` with bandwidth ``bw(l)/n``: alone it then takes
exactly as long as the n copies sharing ``l`` would (Program semantics: equal sharing).
Copies of *different* folded tasks that meet on a link are shared through the representative
copies' links only, which is exact when each representative's links carry the same mix of
traffic as every other copy's (true for the symmetric layouts lowering builds on one
homogeneous node group) and an approximation otherwise (see `LoweringOptions.fold`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from trainsim.simulator.collectives import CommPhase, plan_collective

Need = tuple[str, float]
"""(collective kind, size in bytes as `plan_collective` takes it)."""


class CommLowering:
    """Plans collectives on a cluster and emits them as tasks through `add_task`.

    Args:
        cluster: the Cluster (paths, links).
        algorithm: all-reduce algorithm ("auto", "ring", "tree", "hierarchical").
        add_task: callback ``(fields) -> task id`` creating one task; fields are those of
            `trainsim.simulator.program.Task` (deps as a list).
    """

    def __init__(self, cluster: Any, algorithm: str,
                 add_task: Callable[[dict[str, Any]], int]) -> None:
        self.cluster = cluster
        self.algorithm = algorithm
        self.add_task = add_task
        self.links: dict[str, float] = {}
        """Bandwidth of every (possibly virtual ``l/n``) link a task crosses."""
        self._phase_cache: dict[tuple[str, tuple[int, ...], float], tuple[CommPhase, ...]] = {}
        self._load_cache: dict[tuple, dict[str, int]] = {}
        self._template_cache: dict[tuple, list[tuple[float, float, tuple[str, ...]]]] = {}

    def phases(self, kind: str, group: tuple[int, ...], size: float) -> tuple[CommPhase, ...]:
        """The planned phases of one collective on physical ranks `group` (cached)."""
        key = (kind, group, size)
        if key not in self._phase_cache:
            algorithm = self.algorithm if kind == "all_reduce" else "auto"
            self._phase_cache[key] = tuple(
                plan_collective(kind, group, size, self.cluster, algorithm))
        return self._phase_cache[key]

    def link_load(self, needs: Sequence[Need], copies: Sequence[tuple[int, ...]]
                  ) -> dict[str, int]:
        """How many of the concurrent `copies` cross each link (a copy counts once per link)."""
        key = (tuple(needs), tuple(copies))
        if key not in self._load_cache:
            load: Counter[str] = Counter()
            for group in copies:
                used: set[str] = set()
                for kind, size in needs:
                    for phase in self.phases(kind, group, size):
                        used.update(phase.links)
                load.update(used)
            self._load_cache[key] = dict(load)
        return self._load_cache[key]

    def tasks(self, needs: Sequence[Need], *, name: str, kind: str, stream: str,
              prog_ranks: tuple[int, ...], copies: Sequence[tuple[int, ...]],
              deps: Sequence[int], meta: dict[str, Any]) -> list[int]:
        """Tasks running `needs` one after another over `copies[0]`; returns their ids in order.

        `copies` lists every physical group running the same collectives at the same time
        (several when folded, else just the one). Returns [] when nothing moves (a group of one
        rank, or no needs).
        """
        ids: list[int] = []
        prev = list(deps)
        for latency_s, nbytes, links in self._template(tuple(needs), tuple(copies)):
            tid = self.add_task({"name": name, "kind": kind, "ranks": prog_ranks,
                                 "stream": stream, "duration_s": latency_s,
                                 "comm_bytes": nbytes, "links": links, "deps": prev, **meta})
            prev = [tid]
            ids.append(tid)
        return ids

    def _template(self, needs: tuple[Need, ...], copies: tuple[tuple[int, ...], ...]
                  ) -> list[tuple[float, float, tuple[str, ...]]]:
        """(latency, bytes per link, link ids) of each task `tasks` creates, cached: lowering
        asks for the same collective on the same groups once per micro-batch."""
        key = (needs, copies)
        cached = self._template_cache.get(key)
        if cached is not None:
            return cached
        out: list[tuple[float, float, tuple[str, ...]]] = []
        group = copies[0]
        phases = [ph for k, size in needs if size > 0 for ph in self.phases(k, group, size)] \
            if len(group) >= 2 else []
        load = self.link_load(needs, copies) if len(copies) > 1 and phases else {}
        for merged in merge_phases(phases):
            links: list[str] = []
            for link in merged.links if merged.bytes_per_link > 0 else ():
                n = load.get(link, 1)
                lid = link if n <= 1 else f"{link}/{n}"
                self.links.setdefault(lid, self.cluster.link(link).bandwidth_bytes_per_s / n)
                links.append(lid)
            out.append((merged.latency_s, merged.bytes_per_link if links else 0.0, tuple(links)))
        self._template_cache[key] = out
        return out


def merge_phases(phases: Sequence[CommPhase]) -> list[CommPhase]:
    """Merge consecutive phases over the same links into one (same time alone, fewer tasks):
    latencies and bytes add."""
    out: list[CommPhase] = []
    for ph in phases:
        if out and out[-1].links == ph.links:
            prev = out[-1]
            out[-1] = CommPhase(name=prev.name, ranks=prev.ranks,
                                latency_s=prev.latency_s + ph.latency_s,
                                bytes_per_link=prev.bytes_per_link + ph.bytes_per_link,
                                links=prev.links)
        else:
            out.append(ph)
    return out


def kind_of(needs: Sequence[Need]) -> str:
    """Task kind for a run of collectives: the collective's name if they are all one kind."""
    kinds = {k for k, _ in needs}
    return kinds.pop() if len(kinds) == 1 else "tp_comm"


__all__ = ["CommLowering", "Need", "kind_of", "merge_phases"]
