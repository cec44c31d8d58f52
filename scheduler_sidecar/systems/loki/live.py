"""Loki live: the sidecar in front of the pipeline's BLS model (:mod:`python_backend.loki_bls`).

The BLS runs the stages inside Triton; the sidecar holds the queue of frames, the resource manager and the load
balancer. :class:`LivePlanner` is Loki's controller over an instance budget S (the replicas the MILP may
place), and :func:`bls_plan` turns its tables into the plan the BLS reads: tables per variant (Triton routes a
request to a model, not to one of its instances; the workers of a variant are summed by the traffic they
carry), each variant's latency budget and execution time, and the backups of each task. :class:`LokiPipeline`
is the policy of the pipeline's logical model: it sends each free Triton a batch of frames, earliest deadline
first, with that plan and the time its first frame has left as request parameters.

Each variant's replicas become its Triton instance count (a reload with a config override; Triton serves the
old instances until the new ones are ready); a variant the plan leaves out keeps one instance, so the BLS can
still reroute to it. Routing is per variant, not per instance: Triton spreads a model's requests over its
instances itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

from scheduler_sidecar.core.plan import Demand, Plan
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.systems.bls import BlsPolicy
from scheduler_sidecar.systems.loki.pipeline import Pipeline
from scheduler_sidecar.systems.loki.planner import DEFAULT_CONFIG, LokiConfig, LokiPlan, LokiPlanner
from scheduler_sidecar.systems.loki.policy import BUDGETS, DropMode, budget_factors
from scheduler_sidecar.systems.loki.routing import FRONTEND, Routing


def bls_plan(pipeline: Pipeline, routing: Routing, *, drop: DropMode | str = DropMode.REROUTING,
             budget: str = "proportional", version: int = 0) -> dict:
    """The BLS model's plan (its module notes give the format) for the load balancer's ``routing``."""
    variant = {w: r.variant for w, r in routing.replicas.items()}

    def by_variant(entries: Sequence[tuple[int, float]], weight: float = 1.0, into: dict | None = None) -> dict:
        out = into if into is not None else {}
        for w, p in entries:
            out[variant[w]] = out.get(variant[w], 0.0) + p * weight
        return out

    tables: dict[str, dict[str, list]] = {"frontend": {}}
    root = pipeline.root.name
    tables["frontend"][root] = sorted(by_variant(routing.tables.get((FRONTEND, root), ())).items())
    for task in pipeline.tasks:
        for child in task.children:
            for r in routing.workers_of(task.name):
                table = routing.tables.get((r.worker_id, child), ())
                mix = tables.setdefault(r.variant, {}).setdefault(child, {})
                by_variant(table, max(routing.incoming.get(r.worker_id, 0.0), 1e-9), into=mix)
    for v, children in tables.items():
        if v != "frontend":
            for child, mix in children.items():
                total = sum(mix.values())
                children[child] = sorted((m, p / total) for m, p in mix.items())
    factors = budget_factors(pipeline, routing, budget)
    exec_ms = {r.variant: r.batch_ms for r in routing.replicas.values()}
    backups: dict[str, dict[str, float]] = {}
    for task, entries in routing.backups.items():
        for w, spare in entries:
            backups.setdefault(task, {})
            backups[task][variant[w]] = backups[task].get(variant[w], 0.0) + spare
    return {"version": version, "drop": DropMode(drop).value, "tables": tables, "exec_ms": exec_ms,
            "budget_ms": {v: ms * factors[pipeline.task_of(v).name] for v, ms in exec_ms.items()},
            "accuracy": {r.variant: r.accuracy for r in routing.replicas.values()},
            "backups": {t: sorted(b.items(), key=lambda kv: -pipeline.variant(kv[0]).accuracy)
                        for t, b in backups.items()}}


class LivePlanner(LokiPlanner):
    """Loki's controller over ``instances`` replica slots: no worker of the engine moves (the BLS's Triton holds
    every stage model); each plan carries the BLS plan in ``detail.bls`` and the instance counts."""

    def __init__(self, pipeline: Pipeline, instances: int, config: LokiConfig = DEFAULT_CONFIG, *,
                 drop: DropMode | str = DropMode.REROUTING, budget: str = "proportional") -> None:
        super().__init__(pipeline, range(instances), config)
        if budget not in BUDGETS:
            raise ValueError(f"loki: budget must be one of {BUDGETS}, got {budget!r}")
        self.drop, self.budget = DropMode(drop), budget

    def plan(self, now_us: int, demand: Demand) -> Plan:
        plan = super().plan(now_us, Demand(demand.since_us, demand.until_us, demand.arrivals))
        detail: LokiPlan = plan.detail
        bls = bls_plan(self.pipeline, detail.routing, drop=self.drop, budget=self.budget, version=self.plans)
        replicas = {a.variant: a.replicas for a in detail.solution.allocations}
        # a variant the plan does not use keeps one instance: the BLS may still reroute to it
        instances = {v.id: replicas.get(v.id, 1) for t in self.pipeline.tasks for v in t.variants}
        return Plan(now_us, {}, replace(detail, bls=bls), instances)


class LokiPipeline(BlsPolicy):
    """The sidecar's policy for a Loki pipeline model. Options: ``max_batch`` (frames per request to the BLS,
    default 8)."""

    name = "loki"
    time_left_param = "slo_ms"

    def __init__(self, profile: Profile, *, max_batch: int = 8, **options) -> None:
        super().__init__(profile, max_batch=max_batch, **options)  # until the first plan: the BLS's deployed plan

    def observe_plan(self, now_us: int, plan: Plan) -> None:
        if isinstance(plan.detail, LokiPlan) and plan.detail.bls is not None:
            self.params = (("loki_plan", json.dumps(plan.detail.bls)),)
