"""Money and deadlines: what a plan's iteration time means for a whole training run.

A plan on a given cluster uses every GPU, so on one cluster the fastest plan is also the
cheapest; budgets and deadlines choose between *clusters* (compositions, sim pareto) and say
whether a run is possible at all. Prices are per GPU-hour (hwmodels/data/prices.json),
overridable per run with `with_prices`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from trainsim.errors import SpecError, unknown_name
from trainsim.hwmodels.cluster import Cluster

SECONDS_PER_DAY = 86_400.0
MAX_PRICE = 1e6
"""USD per GPU-hour above which a price is a typo (a cluster's total must stay finite)."""


def with_prices(cluster: Cluster, prices: Mapping[str, float]) -> Cluster:
    """`cluster` with the GPU types named in `prices` at those USD per GPU-hour."""
    names = {g.gpu.name for g in cluster.node_groups}
    for name, usd in prices.items():
        if name not in names:
            raise SpecError(str(unknown_name("GPU in --price", name, sorted(names))))
        if not (isinstance(usd, int | float) and 0 <= usd <= MAX_PRICE):
            raise SpecError(f"--price {name}={usd!r} must be 0 to {MAX_PRICE:g} USD per "
                            f"GPU-hour")
    if not prices:
        return cluster
    groups = tuple(dataclasses.replace(g, price_per_gpu_hour_usd=float(prices[g.gpu.name]))
                   if g.gpu.name in prices else g for g in cluster.node_groups)
    return dataclasses.replace(cluster, node_groups=groups)


def parse_prices(items: list[str] | None) -> dict[str, float]:
    """`GPU=USD` strings (USD per GPU-hour) as a dict; one clear line on a bad item."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = math.nan
        if not sep or not name or not 0 <= usd <= MAX_PRICE:
            raise SpecError(f"--price {item!r} must be GPU=USD_PER_GPU_HOUR (0 to "
                            f"{MAX_PRICE:g}), e.g. A10=2.036")
        out[name.strip()] = usd
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class RunTotals:
    """A training run of `tokens` tokens at a plan's speed and price."""

    tokens: float
    days: float
    usd: float

    def describe(self) -> str:
        return f"{self.tokens:.3g} tokens in {self.days:.2f} days for ${self.usd:,.0f}"


def run_totals(tokens: float, tokens_per_s: float, usd_per_hour: float) -> RunTotals:
    """Days and dollars to train on `tokens` tokens."""
    seconds = tokens / tokens_per_s if tokens_per_s > 0 else math.inf
    return RunTotals(tokens=tokens, days=seconds / SECONDS_PER_DAY,
                     usd=seconds / 3600 * usd_per_hour)


def check_limits(tokens: float | None, budget_usd: float | None,
                 deadline_days: float | None) -> None:
    """Budgets and deadlines need a token count, and all must be positive and finite."""
    for name, value in (("--tokens", tokens), ("--budget-usd", budget_usd),
                        ("--deadline-days", deadline_days)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise SpecError(f"{name}={value!r} must be a positive number")
    if (budget_usd is not None or deadline_days is not None) and tokens is None:
        raise SpecError("--budget-usd and --deadline-days need --tokens (how many tokens the "
                        "run trains on, e.g. --tokens 300e9)")


def limit_miss(totals: RunTotals, budget_usd: float | None, deadline_days: float | None
               ) -> str | None:
    """Why a run misses the budget or the deadline (and by how much), or None."""
    if budget_usd is not None and totals.usd > budget_usd:
        return (f"costs ${totals.usd:,.0f}, {totals.usd / budget_usd:.3g}x the budget of "
                f"${budget_usd:,.2f}")
    if deadline_days is not None and totals.days > deadline_days:
        return (f"takes {totals.days:.2f} days, {totals.days / deadline_days:.3g}x the "
                f"deadline of {deadline_days:g} days")
    return None


__all__ = ["RunTotals", "check_limits", "limit_miss", "parse_prices", "run_totals",
           "with_prices"]
