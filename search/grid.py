"""grid: Megatron-LM's uniform baseline — every dp × tp × pp × micro-batch × recompute point.

Megatron-LM's users (and the baselines of Aceso, EuroSys'24 §6, and Alpa, OSDI'22 §8) sweep
uniform plans: tp × pp × dp = the GPU count, layers split evenly over the pp stages, one
micro-batch size, full activation recompute on or off. `GridPlanner` enumerates that space in a
fixed order, asks the Oracle about every point, and reports the ones that do not build
(PlanError: e.g. tp not dividing the head count) or do not fit memory as infeasible records —
nothing is silently skipped: a dp the global batch does not divide over (global batch 6 on 4
GPUs: dp 4), or a given micro-batch size that does not divide a replica's samples, is one
infeasible record whose note says "skipped" and why.

**Pruning** (on by default, `prune`): once `top_k` fitting plans are known, a candidate whose
proven lower bound on its iteration time (search/bound.py, compute alone) is no faster than the
k-th best is skipped before it is lowered. It provably could not enter the ranked list, so the
result's ranked plans are those of the unpruned search; only the log is shorter, and the
result counts the skipped candidates (`SearchResult.pruned`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trainsim.search.planner import SearchRecord, SearchState


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, kw_only=True, slots=True)
class GridPlanner:
    """Megatron-LM's uniform grid."""

    name: str = "grid"
    """Planner name in results."""
    recompute: tuple[str, ...] = ("none", "full")
    """Recompute policies to try."""
    micro_batch_sizes: tuple[int, ...] | None = None
    """Micro-batch sizes to try; powers of two dividing global_batch / dp when None."""
    max_micro_batch_size: int = 64
    """Largest micro-batch size the default list holds."""
    schedule: str = "1f1b"
    """Pipeline schedule (Megatron's default, PipeDream-flush)."""
    prune: bool = True
    """Skip candidates whose lower bound cannot beat the k-th best plan found (module doc)."""

    def candidates(self, state: SearchState) -> Iterator[tuple[dict[str, Any], str]]:
        """Plan fields and a note for every grid point, in a fixed order (tp, pp, mbs, rc)."""
        n = state.cluster.num_gpus
        batch = state.spec.global_batch
        for tp in _divisors(n):
            for pp in _divisors(n // tp):
                dp = n // (tp * pp)
                if batch % dp:
                    # no micro-batch size fits: one point that does not build, so the log
                    # (and the result's infeasible count) says why this dp was left out
                    why = f"global batch {batch} does not divide over dp={dp}"
                    yield (self._point(dp, tp, pp, 1, batch),
                           f"grid dp={dp} tp={tp} pp={pp} skipped: {why}")
                    continue
                sizes = self.micro_batch_sizes or tuple(
                    2**k for k in range(31) if 2**k <= self.max_micro_batch_size
                    and (batch // dp) % 2**k == 0)
                for mbs in sizes:
                    if (batch // dp) % mbs:
                        why = (f"{batch // dp} samples per replica do not divide into "
                               f"micro-batches of {mbs}")
                        yield (self._point(dp, tp, pp, mbs, batch),
                               f"grid dp={dp} tp={tp} pp={pp} mbs={mbs} skipped: {why}")
                        continue
                    for rc in self.recompute:
                        fields = {"dp": dp, "tp": tp, "pp": pp, "micro_batch_size": mbs,
                                  "global_batch": batch, "recompute": rc,
                                  "schedule": self.schedule}
                        yield fields, f"grid dp={dp} tp={tp} pp={pp} mbs={mbs} rc={rc}"

    def _point(self, dp: int, tp: int, pp: int, mbs: int, batch: int) -> dict[str, Any]:
        """Plan fields of a skipped point (the first recompute policy): it does not build, and
        its PlanError is what the log reports."""
        return {"dp": dp, "tp": tp, "pp": pp, "micro_batch_size": mbs, "global_batch": batch,
                "recompute": self.recompute[0], "schedule": self.schedule}

    def steps(self, state: SearchState) -> Iterator[SearchRecord]:
        """Evaluate every grid point (but the pruned ones) until done or out of time."""
        top_k = state.spec.top_k
        todo = self.candidates(state)
        for fields, note in todo:
            if state.out_of_time():
                state.capped += 1 + sum(1 for _ in todo)
                return
            if self.prune:
                ranked = state.ranked()
                if len(ranked) >= top_k and state.cannot_improve(
                        fields, state.key(ranked[top_k - 1].summary)):
                    state.pruned += 1
                    continue
            yield state.evaluate(fields, note)


__all__ = ["GridPlanner"]
