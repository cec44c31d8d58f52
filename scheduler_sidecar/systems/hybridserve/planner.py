"""HybridServe's offline planner over a family built here: the cascades of its operating points (AP, EO and the
largest model alone; AP and EO on the whole family, or on the models Algorithm 2 keeps), the replicas of each model
within an instance budget (:func:`.placement.replicas`), and the cost of a request: measured worker-seconds (energy
follows, :mod:`.energy`). The live planner that deploys them is :class:`.live.HybridServePlanner`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_sidecar.systems.hybridserve.cascade import Cascade, Outcome, evaluate, forwarded
from scheduler_sidecar.systems.hybridserve.family import Family
from scheduler_sidecar.systems.hybridserve.placement import NEAREST, replicas
from scheduler_sidecar.systems.hybridserve.pruning import Pruned
from scheduler_sidecar.systems.hybridserve.search import DEFAULT_SEARCH, SearchConfig, SearchResult, search

MODES = ("ap", "eo", "largest")


@dataclass(frozen=True)
class OperatingPoint:
    mode: str
    cascade: Cascade
    validation: Outcome  # on the search split, with the family's indices of the cascade's models
    test: Outcome

    def service_s(self, family: Family, batch: int | None = None) -> np.ndarray:
        """Each model's time per request it runs when the cascade takes batches of ``batch``: model i runs
        ⌈ρ_i batch⌉ rows of each (§V-C, "each model processed ρ_i b"), at its profiled latency for that many."""
        batch = batch or family.cost_batch
        rows = [max(1, int(np.ceil(rho * batch - 1e-9))) for rho in self.validation.reach]
        curves = [family.models[i].latency for i in self._index(family)]
        return np.array([c.p50_at(k) / 1000 / k for c, k in zip(curves, rows)])

    def batched_cost(self, family: Family, batch: int | None = None) -> float:
        """Worker-seconds per request at batches of ``batch`` (default: the family's cost batch): Σ ρ_i l_i with l_i
        from :meth:`service_s`; with full batches everywhere it would be Algorithm 1's Σ ρ_i e_i."""
        return float(np.dot(self.validation.reach, self.service_s(family, batch)))

    def replicas(self, family: Family, budget: int, batch: int | None = None,
                 rounding: str = NEAREST) -> tuple[int, ...]:
        """Instances per model of the cascade: R_i ∝ ρ_i l_i (§V-C), l_i from :meth:`service_s`, rounded as
        :func:`.placement.replicas` says."""
        return replicas(self.validation.reach, self.service_s(family, batch), budget, rounding)

    def capacity_rps(self, family: Family, replicas: tuple[int, ...], batch: int | None = None) -> float:
        """Requests per second the cascade keeps up with on ``replicas`` instances per model, each model's work per
        request ρ_i l_i as in :meth:`batched_cost`: the busiest model's R_i / (ρ_i l_i), the bottleneck. With
        replicas in exact proportion to the work every model is as busy, and it is Σ R_i / :meth:`batched_cost`."""
        work = self.validation.reach * self.service_s(family, batch)
        reached = work > 0
        return float(np.min(np.asarray(replicas)[reached] / work[reached]))

    def flow(self, family: Family) -> np.ndarray:
        """flow[i, j]: the share of requests model i forwards to model j, on the search split (the placement
        program's edges, :func:`.placement.place`)."""
        return forwarded(family.predictions("search").subset(self._index(family)), np.array(self.cascade.thresholds),
                         self.cascade.skip)

    def _index(self, family: Family) -> list[int]:
        return [family.names.index(m) for m in self.cascade.models]


def operating_points(family: Family, *, skip: bool = False, config: SearchConfig = DEFAULT_SEARCH,
                     result: SearchResult | None = None) -> dict[str, OperatingPoint]:
    """AP and EO from Algorithm 1 on the search split (``result``, if already run), and the largest model alone."""
    result = result or search(family.predictions("search"), family.costs, skip=skip, config=config)
    every = list(range(len(family.models)))
    return {"ap": _point(family, "ap", every, result.ap.thresholds, skip),
            "eo": _point(family, "eo", every, result.eo.thresholds, skip),
            "largest": _point(family, "largest", every[-1:], (), False)}


def pruned_point(family: Family, pruned: Pruned, mode: str) -> OperatingPoint:
    """``mode``'s cascade after Algorithm 2 (``pruned``: :func:`.pruning.prune` of the search split for ``mode``): the
    models it kept, with skip connections where they pay (:meth:`.pruning.Pruned.deployed`)."""
    outcome, skip = pruned.deployed(mode)
    return _point(family, mode, list(pruned.kept), outcome.thresholds, skip)


def _point(family: Family, mode: str, index: list[int], thresholds: tuple[float, ...], skip: bool) -> OperatingPoint:
    """The cascade of the family's models ``index`` at ``thresholds``, evaluated on the search and the test split."""
    cascade = Cascade(tuple(family.names[i] for i in index), tuple(thresholds), skip)
    t = np.array([thresholds], dtype=np.float64).reshape(1, len(index) - 1)
    validation, test = (evaluate(family.predictions(split).subset(index), t, family.costs[index], skip)[0]
                        for split in ("search", "test"))
    return OperatingPoint(mode, cascade, validation, test)
