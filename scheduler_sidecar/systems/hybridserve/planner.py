"""HybridServe's offline planner over a family built here: the cascades of its operating points (AP, EO and the
largest model alone), the replicas of each model within an instance budget (:func:`.placement.replicas`), and the
cost of a request: measured worker-seconds (energy follows, :mod:`.energy`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_sidecar.systems.hybridserve.cascade import Cascade, Outcome, evaluate
from scheduler_sidecar.systems.hybridserve.family import Family
from scheduler_sidecar.systems.hybridserve.placement import NEAREST, replicas
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
        curves = [family.models[family.names.index(m)].latency for m in self.cascade.models]
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


def operating_points(family: Family, *, skip: bool = False, config: SearchConfig = DEFAULT_SEARCH,
                     result: SearchResult | None = None) -> dict[str, OperatingPoint]:
    """AP and EO from Algorithm 1 on the search split (``result``, if already run), and the largest model alone."""
    search_split, test_split = family.predictions("search"), family.predictions("test")
    result = result or search(search_split, family.costs, skip=skip, config=config)
    points = {}
    for mode, point in (("ap", result.ap), ("eo", result.eo)):
        cascade = Cascade(tuple(family.names), point.thresholds, skip)
        points[mode] = OperatingPoint(mode, cascade, point,
                                      evaluate(test_split, np.array([point.thresholds]), family.costs, skip)[0])
    last = [len(family.models) - 1]
    largest = Cascade((family.names[-1],), ())
    empty = np.zeros((1, 0))
    points["largest"] = OperatingPoint("largest", largest,
                                       *(evaluate(s.subset(last), empty, family.costs[last])[0]
                                         for s in (search_split, test_split)))
    return points
