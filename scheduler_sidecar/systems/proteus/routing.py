"""What a Proteus plan tells the routers (:attr:`~scheduler_sidecar.core.plan.Plan.detail`); no solver import,
so the serving path loads none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    worker_id: int
    variant: str
    share: float  # of the type's queries
    max_batch: int  # B_max: the largest batch of this variant on this worker's kind within SLO/2


@dataclass(frozen=True)
class Routing:
    """What a plan tells the routers (:attr:`Plan.detail` of a Proteus plan)."""

    routes: Mapping[str, tuple[Route, ...]]  # query type -> its replicas
    demand: Mapping[str, float]  # the measured demand the plan was made for, q/s
    solution: object = None  # the planner's record of how it decided (a milp.Solution for the MILP)
