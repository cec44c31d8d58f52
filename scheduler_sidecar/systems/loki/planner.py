"""Loki's controller (§3, §4.2): the demand estimate, the resource manager every period and on a demand change,
workers assigned to the plan's replicas, and the load balancer's tables.

Demand is the frames entering the pipeline: an exponentially weighted mean over the last ``ewma_window_s``
one-second counts (the artifact's pandas ``ewm(com=1.6)`` over 20 s; the paper says only "EWMA"), floored at
``min_demand_qps`` (the artifact's 50 q/s). The MILP runs every ``period_s`` (10 s, §4.2; the artifact's
simulator re-solves every 1 s) and, the paper's "significant change in the demand" being unspecified, when a
closed second leaves the estimate more than ``change_threshold`` (20%) away from the planned demand. A worker
keeps its variant when the new plan still wants it, so a plan moves few workers; a worker the plan does not
need holds nothing (hardware scaling: it is off).

Decision (issue 44): the controller plans ``headroom`` = 1.25 x the estimated demand. The paper plans exactly the
demand (beta = 1; milp.HEADROOM) and the artifact 1 or 1.05 (milp.ARTIFACT_HEADROOM): the MILP then fills the most
accurate replicas to their whole batch throughput, and under Poisson arrivals a queue at 100% load grows without
bound. Measured on the authors' traffic-analysis profile, 20 workers, 2 x l budgets, 30 s of Poisson frames at
150/s: 56.6% of frames violated at 1.0, 8.7% at 1.05, 0.1% at 1.25. Burstier arrivals need more (gamma, CV² 4:
17.8% at 1.25, 3.3% at 1.5, 0.2% at 2).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_sidecar.core.plan import Demand, Plan, Planner
from scheduler_sidecar.core.records import Query
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.systems.demand import SecondCounts, ewma
from scheduler_sidecar.systems.loki import milp
from scheduler_sidecar.systems.loki.pipeline import Pipeline
from scheduler_sidecar.systems.loki.routing import Replica, Routing, most_accurate_first

DEFAULT_HEADROOM = 1.25  # see the module notes


@dataclass(frozen=True)
class LokiConfig:
    period_s: float = 10.0  # §4.2
    ewma_com: float = 1.6  # the artifact's
    ewma_window_s: int = 20  # the artifact's
    min_demand_qps: float = 50.0  # the artifact's floor
    change_threshold: float = 0.2  # decision: re-solve when the estimate moves this much (the paper: "significant")
    batch_sizes: tuple[int, ...] = milp.BATCH_SIZES
    hop_ms: float = 0.0  # §4.2's communication latency per hop (the artifact: none)
    time_limit_s: float = milp.TIME_LIMIT_S
    top_only: bool = False  # InferLine: hardware scaling with the most accurate variants only
    headroom: float = DEFAULT_HEADROOM  # capacity planned per query of demand; routing loads a worker to 1/headroom

    def __post_init__(self) -> None:
        if not self.headroom >= 1:
            raise ValueError(f"loki: headroom must be >= 1, got {self.headroom!r}")
        for key in ("period_s", "time_limit_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"loki: {key} must be > 0, got {getattr(self, key)!r}")
        for key in ("ewma_com", "min_demand_qps", "change_threshold", "hop_ms"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"loki: {key} must be >= 0, got {getattr(self, key)!r}")
        if not (isinstance(self.ewma_window_s, int) and self.ewma_window_s >= 1):
            raise ValueError(f"loki: ewma_window_s must be a whole number >= 1, got {self.ewma_window_s!r}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"loki: batch_sizes must be positive, got {self.batch_sizes!r}")


DEFAULT_CONFIG = LokiConfig()


@dataclass(frozen=True)
class LokiPlan:
    """What the stage policies route by: the solution, its replicas and the load balancer's tables."""

    demand_qps: float
    solution: milp.Solution
    routing: Routing
    bls: dict | None = None  # live: the plan the pipeline's BLS model reads (:func:`.live.bls_plan`)
    # live, on several servers: engine worker -> its server's BLS plan (``bls`` is then None); see ``.servers``
    by_worker: Mapping[int, dict] | None = None

    def describe(self) -> str:
        """One line for the sidecar's log: a simulation of the run reports its plans alike (bench fidelity)."""
        s = self.solution
        return (f"demand {self.demand_qps:.2f} q/s, {s.step} step, {s.workers} workers, "
                f"variants {' '.join(sorted({a.variant for a in s.allocations}))}")


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """One plan, for reports: when, for what demand, which step, and how many workers it used."""

    at_us: int
    demand_qps: float
    step: str
    workers: int
    accuracy: float
    served: float
    solve_s: float


class LokiPlanner(Planner):
    """See the module notes. ``workers`` are the worker ids of the cluster (S)."""

    def __init__(self, pipeline: Pipeline, workers: Sequence[int], config: LokiConfig = DEFAULT_CONFIG, *,
                 initial_demand_qps: float = 0.0) -> None:
        if len(workers) < len(pipeline.tasks):
            raise ConfigError(f"loki: {len(workers)} workers cannot hold one replica of each of the pipeline's "
                              f"{len(pipeline.tasks)} tasks: give it at least {len(pipeline.tasks)}")
        self.pipeline, self.config = pipeline, config
        self.workers = list(workers)
        self.healthy = set(self.workers)
        self.initial_demand_qps = initial_demand_qps
        self.period_us = round(config.period_s * 1e6)
        self.hosting: dict[int, str | None] = dict.fromkeys(self.workers)  # worker -> its variant
        self.history: list[PlanRecord] = []
        self._counts = SecondCounts(config.ewma_window_s)
        self._lock = threading.Lock()  # live, plan() runs in a thread while arrivals are counted
        self._planned_qps: float | None = None

    def observe_arrival(self, now_us: int, query: Query) -> bool:
        if query.stage != 0:
            return False
        with self._lock:
            closed = self._counts.advance(now_us, ("",))
            self._counts.current[""] += 1
            if not closed or self._planned_qps is None:
                return False
        estimate = self.demand(now_us)
        return abs(estimate - self._planned_qps) > self.config.change_threshold * self._planned_qps

    def demand(self, now_us: int) -> float:
        with self._lock:
            self._counts.advance(now_us, ("",))
            counts = list(self._counts.history.get("", ()))
        estimate = ewma(counts, self.config.ewma_com) if counts else self.initial_demand_qps
        return max(estimate, self.config.min_demand_qps)

    def plan(self, now_us: int, demand: Demand) -> Plan:
        if demand.workers:
            self.healthy = {w.id for w in demand.workers if w.healthy}
            for w in demand.workers:
                self.hosting.setdefault(w.id, None)
        estimate = self.demand(now_us)
        workers = sorted(self.healthy)
        solution = milp.plan(self.pipeline, estimate, len(workers), batch_sizes=self.config.batch_sizes,
                             hop_ms=self.config.hop_ms, top_only=self.config.top_only, headroom=self.config.headroom,
                             time_limit_s=self.config.time_limit_s)
        replicas = self._place(solution, workers)
        routing = most_accurate_first(self.pipeline, replicas, estimate * solution.served,
                                      utilisation=1 / self.config.headroom)
        with self._lock:
            self._planned_qps = estimate
        self.history.append(PlanRecord(now_us, estimate, solution.step, solution.workers, solution.accuracy,
                                       solution.served, solution.solve_s))
        placement = {w: frozenset({v}) if v is not None else frozenset() for w, v in self.hosting.items()}
        return Plan(now_us, placement, LokiPlan(estimate, solution, routing))

    def _place(self, solution: milp.Solution, workers: list[int]) -> list[Replica]:
        """Workers for the solution's replicas: one keeps its variant if the plan still wants it."""
        wanted = {a.variant: a.replicas for a in solution.allocations}
        given: dict[str, list[int]] = {a.variant: [] for a in solution.allocations}
        free = []
        for w in workers:
            v = self.hosting.get(w)
            if v is not None and wanted.get(v, 0) > 0:
                wanted[v] -= 1
                given[v].append(w)
            else:
                free.append(w)
        for v, n in wanted.items():
            given[v].extend(free[:n])
            free = free[n:]
        for w in self.hosting:
            self.hosting[w] = None
        replicas = []
        for a in solution.allocations:
            for w in given[a.variant]:
                self.hosting[w] = a.variant
                replicas.append(Replica(w, a.task, a.variant, a.batch, a.batch_ms, a.capacity_qps, a.accuracy))
        return replicas

    @property
    def plans(self) -> int:
        return len(self.history)


__all__ = ["LokiConfig", "LokiPlan", "LokiPlanner", "PlanRecord"]
