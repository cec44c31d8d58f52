"""Loki live: the sidecar in front of the pipeline's BLS model (:mod:`python_backend.loki_bls`).

The BLS runs the stages inside Triton; the sidecar holds the queue of frames, the resource manager and the load
balancer. :class:`LivePlanner` is Loki's controller over an instance budget S (the replicas the MILP may
place), and :func:`bls_plan` turns its tables into the plan the BLS reads: tables per variant (Triton routes a
request to a model, not to one of its instances; the workers of a variant are summed by the traffic they
carry), each variant's latency budget, planned batch size, execution time at that size and instances, and the
backups of each task. :class:`LokiPipeline` is the policy of the pipeline's logical model: it sends each free
Triton a batch of frames, earliest deadline first, with the newest plan whose variants that Triton has loaded
and, per frame, how long it has waited in the sidecar and how long it has left.

Hardware scaling (decision): a variant's replicas become its Triton instance count (``Plan.instances``: a reload
with a config override; Triton serves the old instances until the new ones are ready), and a variant the plan
leaves out is unloaded (``Plan.placement``: each worker, a Triton holding the BLS model, holds the BLS model and
the plan's variants). Triton cannot run 0 instances of a loaded model, and one instance kept of every variant
would exceed the budget (8 variants in the demo) for nothing: the backups are planned replicas with spare
capacity, so the BLS never reroutes to a variant the plan leaves out. The engine loads what a worker lacks
before it unloads what the plan no longer wants (make before break), and the policy sends a worker only a plan
whose variants it has loaded, so the BLS never calls a model that is not there. On several Triton servers the
budget is each server's, the MILP plans them all, and each serving server holds its own counts and is sent its own
BLS plan (:mod:`.servers`): a BLS calls only its own server's models.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from python_backend.loki_routing import BLS_DEQUEUES
from scheduler_sidecar.core.plan import Demand, Plan
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import Decision, Query, WorkerState
from scheduler_sidecar.systems.bls import BlsPolicy
from scheduler_sidecar.systems.loki.pipeline import Pipeline
from scheduler_sidecar.systems.loki.planner import DEFAULT_CONFIG, LokiConfig, LokiPlan, LokiPlanner
from scheduler_sidecar.systems.loki.policy import (
    BUDGETS,
    DEFAULT_BUDGET,
    DEFAULT_DEQUEUE,
    DropMode,
    budget_factors,
    fastest_rest_ms,
)
from scheduler_sidecar.systems.loki.routing import FRONTEND, Routing
from scheduler_sidecar.systems.loki.servers import deal, routings


def bls_plan(pipeline: Pipeline, routing: Routing, *, drop: DropMode | str = DropMode.REROUTING,
             budget: str = DEFAULT_BUDGET, dequeue: str = DEFAULT_DEQUEUE, version: int = 0) -> dict:
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
    exec_ms = {r.variant: r.batch_ms for r in routing.replicas.values()}  # a variant's replicas share its batch
    backups: dict[str, dict[str, float]] = {}
    for task, entries in routing.backups.items():
        for w, spare in entries:
            backups.setdefault(task, {})
            backups[task][variant[w]] = backups[task].get(variant[w], 0.0) + spare
    return {"version": version, "drop": DropMode(drop).value, "dequeue": dequeue, "tables": tables, "exec_ms": exec_ms,
            # each variant's fastest rest of its path (the hopeless check's lower bound, as the simulator's)
            "rest_ms": {v: fastest_rest_ms(pipeline, v) for v in exec_ms},
            "batch": {r.variant: r.batch for r in routing.replicas.values()},
            "budget_ms": {v: ms * factors[pipeline.task_of(v).name] for v, ms in exec_ms.items()},
            "accuracy": {r.variant: r.accuracy for r in routing.replicas.values()},
            "instances": dict(Counter(r.variant for r in routing.replicas.values())),
            "backups": {t: sorted(b.items(), key=lambda kv: -pipeline.variant(kv[0]).accuracy)
                        for t, b in backups.items()}}


class LivePlanner(LokiPlanner):
    """Loki's controller over ``instances`` replica slots (the budget S) of each Triton server: each plan carries
    the BLS plan in ``detail.bls``, the planned variants' instance counts, and a placement that unloads the others
    (see the module notes). On several servers (``server`` names an engine worker's), S is each one's and the MILP
    plans them all (:mod:`.servers`): each serving server gets its own counts (``Plan.server_instances``) and its
    own BLS plan (``detail.by_worker``), and a server the plan leaves out holds no variant."""

    def __init__(self, pipeline: Pipeline, instances: int, config: LokiConfig = DEFAULT_CONFIG, *,
                 drop: DropMode | str = DropMode.REROUTING, budget: str = DEFAULT_BUDGET,
                 dequeue: str = DEFAULT_DEQUEUE, server: Callable[[int], str] = lambda worker_id: "") -> None:
        super().__init__(pipeline, range(instances), config)
        if budget not in BUDGETS:
            raise ValueError(f"loki: budget must be one of {BUDGETS}, got {budget!r}")
        if dequeue not in BLS_DEQUEUES:
            raise ValueError(f"loki: the BLS model checks {BLS_DEQUEUES} before a batch, not {dequeue!r}")
        self.drop, self.budget, self.dequeue = DropMode(drop), budget, dequeue
        self.instances, self.server = instances, server
        self.variants = frozenset(v.id for t in pipeline.tasks for v in t.variants)

    def plan(self, now_us: int, demand: Demand) -> Plan:
        # each worker's server, read once (a server that left while this plan is made has no name: not planned for)
        where = {}
        for w in demand.workers:
            try:
                where[w.id] = self.server(w.id)
            except KeyError:
                pass
        servers = sorted({where[w.id] for w in demand.workers if w.healthy and w.id in where})
        self.healthy = set(range(self.instances * max(1, len(servers))))  # the cluster: every server's slots
        for slot in self.healthy:
            self.hosting.setdefault(slot, None)
        if len(set(where.values())) > 1 and servers:  # several servers, even with one of them down
            return self._plan_servers(now_us, demand, servers, where)
        # the replica slots are the planner's own (range(instances)), not the engine's workers
        plan = super().plan(now_us, Demand(demand.since_us, demand.until_us, demand.arrivals))
        detail: LokiPlan = plan.detail
        bls = bls_plan(self.pipeline, detail.routing, drop=self.drop, budget=self.budget, dequeue=self.dequeue,
                       version=self.plans)
        # a worker that says nothing of what it holds (every model) is left alone: "every other model" is the BLS
        placement = {w.id: w.resident - self.variants | set(bls["instances"])
                     for w in demand.workers if w.resident is not None}
        return Plan(now_us, placement, replace(detail, bls=bls), bls["instances"])

    def _plan_servers(self, now_us: int, demand: Demand, servers: list[str], where: dict[int, str]) -> Plan:
        """The plan over ``servers`` (the healthy ones); a worker of a server that is down keeps what it has."""
        plan = super().plan(now_us, Demand(demand.since_us, demand.until_us, demand.arrivals))
        detail: LokiPlan = plan.detail
        allocations = detail.solution.allocations
        dealt = deal(allocations, servers, self.instances)
        tables = routings(self.pipeline, allocations, dealt, detail.demand_qps * detail.solution.served,
                          utilisation=1 / self.config.headroom)
        bls = {s: bls_plan(self.pipeline, r, drop=self.drop, budget=self.budget, dequeue=self.dequeue,
                           version=self.plans)
               for s, r in tables.items()}
        healthy = [w for w in demand.workers if w.healthy and w.id in where]
        placement = {w.id: w.resident - self.variants | set(dealt.get(where[w.id], ()))
                     for w in healthy if w.resident is not None}
        own = {w.id: dealt[where[w.id]] for w in healthy if where[w.id] in dealt}
        by_worker = {w.id: bls[where[w.id]] for w in healthy if where[w.id] in bls}
        return Plan(now_us, placement, replace(detail, by_worker=by_worker), server_instances=own)


# plans kept for workers that have not loaded the newest one's variants yet (a load takes a second or two; a
# plan comes every period): a worker with none of them loaded waits for the newest
MAX_PLANS = 4


class LokiPipeline(BlsPolicy):
    """The sidecar's policy for a Loki pipeline model. Options: ``max_batch`` (frames per request to the BLS,
    default 4).

    Decision (``max_batch``): the BLS answers a request when its last frame's crops are labelled, so a frame is held
    for the others of its request; in requests of up to 4 frames over twice the BLS instances (the demo's 8), live
    was within 3.37 points of simulated at 1x where up to 8 frames over 4 instances was 14.67 off (medians of 3).

    Decision (the drop before the BLS): a frame is dropped here when its slack is below the pipeline's slowest path
    at batch 1 (the profile: BlsPolicy's rule), and the BLS then makes the simulator's ``hopeless`` check before
    each stage batch (the plan's ``dequeue``). The simulator's own bound, the plan's fastest detector and the fastest
    rest after it, is far lower (tens of ms against half the SLO). Measured (``bench fidelity --system loki``, SLO
    2 s, 10x slower device, gap in points at 1x / 1.3x, medians of 3): before the BLS checked, -5.19 / -6.13; with the
    BLS's check and this floor, -0.29 / -2.11; with the BLS's check and the simulator's bound here, -3.46 / -9.73, as
    the frames sent with little time left held BLS instances until the BLS dropped them, and the frames behind
    them waited longer in this queue (p99 up to 1.7 s). The BLS's instances are a limit the simulator's per-task
    queues do not have; this floor keeps them for the frames that can still make it."""

    name = "loki"

    def __init__(self, profile: Profile, *, max_batch: int = 4, **options) -> None:
        super().__init__(profile, max_batch=max_batch, **options)
        # the plans seen, newest first, back to the newest one every worker has loaded: each is worker id (None:
        # every worker) -> (its variants, its JSON); none until the first plan: the BLS's deployed plan
        self.plans: list[dict[int | None, tuple[frozenset[str], str]]] = []

    def observe_plan(self, now_us: int, plan: Plan) -> None:
        detail = plan.detail
        if not isinstance(detail, LokiPlan) or (detail.bls is None and not detail.by_worker):
            return  # a plan that places nothing (no solution) leaves the plans in force
        chosen = {None: detail.bls} if detail.bls is not None else detail.by_worker
        texts = {id(b): (frozenset(b["instances"]), json.dumps(b)) for b in chosen.values()}  # one per server
        self.plans.insert(0, {w: texts[id(b)] for w, b in chosen.items()})
        del self.plans[MAX_PLANS:]  # decide() prunes only while frames are queued: an idle sidecar keeps few

    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        loaded = [all(w.holds(m) for w in workers if w.healthy for m in self._entry(plan, w)[0])
                  for plan in self.plans]
        if True in loaded:
            del self.plans[loaded.index(True) + 1:]
        return super().decide(now_us, queue, workers)

    def serves(self, worker: WorkerState) -> bool:
        return super().serves(worker) and (not self.plans or self._plan_for(worker) is not None)

    def batch_params(self, now_us: int, batch: Sequence[Query], worker: WorkerState) -> tuple[tuple[str, object], ...]:
        """The newest plan ``worker`` has loaded and, per frame, the ms it has waited since its arrival and the ms
        it has left (``python_backend.loki_bls``'s parameters)."""
        frames = (("waited_ms", json.dumps([(now_us - q.arrival_us) / 1000 for q in batch])),
                  ("left_ms", json.dumps([self.slack_us(now_us, q) / 1000 for q in batch])))
        plan = self._plan_for(worker)
        return frames if plan is None else (("loki_plan", plan), *frames)

    @staticmethod
    def _entry(plan: dict[int | None, tuple[frozenset[str], str]], worker: WorkerState) -> tuple[frozenset[str], str]:
        """A plan's part for ``worker``: none (no variants, no JSON) for a server the plan leaves out."""
        return plan.get(worker.id) or plan.get(None) or (frozenset(), "")

    def _plan_for(self, worker: WorkerState) -> str | None:
        for plan in self.plans:
            models, text = self._entry(plan, worker)
            if text and all(worker.holds(m) for m in models):
                return text
        return None
