"""Loki's data path in the engine (§5): one policy per task, sharing a :class:`Router` per pipeline.

A frame is a query of the root task; a batch's result creates the queries of the child tasks (the
simulator's fan-out, or the live pipeline's crops). Each arrival goes to one worker's queue (the engine keeps
the queues): a frame by the frontend's MostAccurateFirst table, a follow-up by the table of the worker that
served its parent (§5.1). A free worker runs min(queue, y) of its queue in deadline order at once, y being its
planned batch size (the artifact's "fixed_size" batching; the paper says only that workers form batches up to
y, digest A14). A worker the plan no longer gives the task, or that fails, hands its queue to the task's
other workers.

Decision (``balance``, on by default): the table picks the worker, hence the variant; the query then joins
the queue of that variant's replica with the least work waiting. The paper samples a worker and keeps it;
replicas of one variant are interchangeable, and independent random splits queue each replica like its own
M/D/1 server (measured in ``accscale reproduce loki``).

Early dropping (§5.2), ``drop``: the rule is :mod:`python_backend.loki_routing`'s, which the pipeline's BLS
model applies live.
- ``none``: every query is served, late or not.
- ``last-task``: a query of a leaf task whose remaining end-to-end budget is below its worker's batch
  latency at the planned batch size is dropped before it runs (digest A11).
- ``per-task``: a query that spent longer at its task (queueing and processing) than the task's latency
  budget is dropped on completion: its children are not sent on (the paper's check point; digest A10).
- ``rerouting`` (Loki's default): such a query's child goes instead to the most accurate worker of the
  backup table that fits (see the rule), while its leftover capacity lasts; with none, it is dropped.
  Candidates are taken in the backup table's order (most accurate, then worker id): the paper breaks ties at
  random, which would make runs differ for no gain.

A task's latency budget (``budget``, digest A9) is its variant's batch latency l at the planned batch size
times a factor: ``paper`` 1 (§4.2: "the execution time of a model variant with the configured batch size"),
``artifact`` 2 (the artifact's 2 x l, matching the halved SLO; the default, see DEFAULT_BUDGET), or
``proportional`` (our variant): SLO / (the largest sum of l along a planned path through the task), so the budgets
along the tightest path add up to the SLO. With the paper's factor nearly every query that waited at all overruns;
with the artifact's, one that waited longer than a batch has (measured in ``accscale reproduce loki``'s Figs. 5
and 7).

A dropped query's frame is an SLO violation (§6.1).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from python_backend.loki_routing import (
    DEQUEUES,
    Allowance,
    Choice,
    drops_at_dequeue,
    expiring,
    hopeless,
    next_hop,
    too_late,
)
from scheduler_sidecar.core.plan import Plan
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import DROP, Decision, Dispatch, Drop, Query, QueryRecord, WorkerState
from scheduler_sidecar.systems.loki.pipeline import Pipeline
from scheduler_sidecar.systems.loki.planner import LokiPlan
from scheduler_sidecar.systems.loki.routing import FRONTEND, Replica, Routing

BUDGETS = ("paper", "artifact", "proportional")
# Decision (issue 44): every Loki, simulated or live, runs the artifact's 2 x l unless told otherwise; the paper's
# 1 x l stays named. Under 1 x l a query that waits at all, even one batch behind a running one, has overrun: on
# the authors' traffic-analysis profile, 20 workers, headroom 1.25, Poisson frames at a constant rate, Loki met
# the 1% violation bar only up to 10 frames/s (5.1% at 20, 17% at 30), InferLine up to 150; under 2 x l every rate
# of 10-1,000 frames/s came out between 0 and 6.6% (most under 1%). The commit that made 1 x l the default
# (2fca08e) took the effective capacity from 2.0x InferLine's to 0.067x. The proportional rule (ours) gives
# 2 x l's results within a point on the same sweep (to 300 frames/s) and is kept for comparison.
DEFAULT_BUDGET = "artifact"
# Decision (issue 44): what per-task dropping and rerouting also check before a batch runs.
# - ``none``, the paper's text: a query is checked only once it has run at its task, so a backlog built in a
#   burst is served to its end, nearly every query of it already late.
# - ``hopeless`` (ours, the default): a query that can no longer meet its frame's SLO, even if it ran now and every
#   task after it that its variant sends queries to ran its fastest variant at batch 1 with no wait, is dropped
#   before it runs. It is a violation whatever Loki does; dropping it frees the worker for queries that can still
#   make it, the aim the paper gives early dropping (§5.2). The one query it can drop that could have made it is
#   one that would have created no query downstream (a frame with no objects), which no check can know before it
#   runs. Live, the pipeline's BLS model makes the same check before each stage batch (:func:`hopeless`, shared);
#   the sidecar also drops a frame before the BLS with the pipeline's slowest path (the decision and its
#   measurements: :class:`~scheduler_sidecar.systems.loki.live.LokiPipeline`).
# - ``artifact``, the artifact's pop_while_first_expires: a query at the head of the queue that would end past its
#   task's budget (waited + l > budget) is dropped, unless (rerouting) a faster backup downstream can absorb the
#   overrun.
# Measured (traffic analysis, 20 workers, headroom 1.25, 2 x l): on 14 s of 100 -> 200 -> 100 frames/s (the
# regression pin) none 42.8% of frames violated, hopeless 21.3%, artifact 26.9% (22-35% in the quiet seconds);
# gamma CV² 4 at 150 frames/s (the README's trace) 17.8%, 14.4%, 23.2%; Poisson 150 frames/s 0.1%, 0.1%, 7.7%.
DEFAULT_DEQUEUE = "hopeless"
MAX_HOPS = 1 << 20  # hops kept for children still to come; far above what a queue holds


class DropMode(str, enum.Enum):
    NONE = "none"
    LAST_TASK = "last-task"
    PER_TASK = "per-task"
    REROUTING = "rerouting"


@dataclass(frozen=True, slots=True)
class Hop:
    """Where a query ran: its worker, when it reached its task, and that task's budget."""

    worker_id: int
    reached_us: int
    budget_us: int
    rerouted: bool = False


def fastest_rest_ms(pipeline: Pipeline, variant: str) -> float:
    """The least time a query of ``variant`` still needs once it has run, if it creates queries downstream: every
    task after it that it (then they) send queries to, at that task's fastest variant, batch 1, no wait; the slowest
    such branch (the ``hopeless`` check's lower bound)."""
    def rest(v) -> float:
        return max((min(c.batch_ms(1) + rest(c) for c in pipeline.task(child).variants)
                    for child, mean in v.fanout.items() if mean > 0), default=0.0)
    return rest(pipeline.variant(variant))


def budget_factors(pipeline: Pipeline, routing: Routing, budget: str) -> dict[str, float]:
    """Task -> its latency budget over its batch latency under ``routing`` (see the module notes)."""
    tasks = [t.name for t in pipeline.tasks]
    if budget != "proportional":
        return dict.fromkeys(tasks, 1.0 if budget == "paper" else 2.0)
    slowest = {t: max((r.batch_ms for r in routing.workers_of(t)), default=0.0) for t in tasks}
    path_ms = {leaf.name: sum(slowest[t.name] for t in pipeline.chain(leaf.name)) for leaf in pipeline.leaves}
    out = {}
    for t in tasks:
        through = [ms for leaf, ms in path_ms.items() if t in {c.name for c in pipeline.chain(leaf)}]
        out[t] = pipeline.slo_ms / max(through) if through and max(through) > 0 else 2.0
    return out


class Router:
    """What the task policies of one pipeline share: the plan's tables, where each query ran, backup allowances."""

    def __init__(self, pipeline: Pipeline, drop: DropMode | str = DropMode.REROUTING, *,
                 budget: str = DEFAULT_BUDGET, dequeue: str = DEFAULT_DEQUEUE, seed: int = 0) -> None:
        if budget not in BUDGETS:
            raise ValueError(f"loki: budget must be one of {BUDGETS}, got {budget!r}")
        if dequeue not in DEQUEUES:
            raise ValueError(f"loki: dequeue must be one of {DEQUEUES}, got {dequeue!r}")
        self.pipeline, self.drop, self.budget, self.dequeue = pipeline, DropMode(drop), budget, dequeue
        self.routing: Routing | None = None
        self._factor: dict[str, float] = {}  # task -> budget / batch latency under the plan in force
        self.hops: dict[int, Hop] = {}
        self.rerouted = 0
        self._retiring: list[int] = []
        self._rng = np.random.default_rng(seed)
        self._allowance = Allowance({})
        self._cdf: dict[tuple, np.ndarray] = {}  # a table's cumulative shares, per table of the plan in force

    def observe_plan(self, plan: Plan) -> None:
        if isinstance(plan.detail, LokiPlan) and plan.detail.routing is not self.routing:
            self.routing = plan.detail.routing
            self._cdf = {}
            self._allowance = Allowance({w: left for backups in self.routing.backups.values() for w, left in backups})
            self._factor = budget_factors(self.pipeline, self.routing, self.budget)

    def target(self, source: int | None, task: str) -> int | None:
        """Sample the worker for a query from ``source`` (FRONTEND or a worker) to ``task``."""
        routing = self.routing
        if routing is None:
            return None
        table = routing.tables.get((source, task)) if source is not None else None
        if table is None:  # no source, or one the plan no longer has: the task's workers by capacity
            workers = routing.workers_of(task)
            if not workers:
                return None
            table = tuple((r.worker_id, r.capacity_qps) for r in workers)
        if len(table) == 1:
            return table[0][0]
        cdf = self._cdf.get(table)
        if cdf is None:  # numpy's choice(p=...) draws as below: its numbers, without its checks on every query
            weights = np.array([p for _, p in table], dtype=float)
            cdf = self._cdf[table] = np.cumsum(weights / weights.sum())
            cdf /= cdf[-1]
        return table[int(cdf.searchsorted(self._rng.random(), side="right"))][0]

    def next_hop(self, task: str, now_us: int, overrun_us: int, routed: Replica | None,
                 wait_ms: Callable[[int], float], healthy: set[int]) -> tuple[Choice, int | None]:
        """The shared rule for a child of a query that overran its budget by ``overrun_us`` (see the module notes);
        ``wait_ms(worker)``: the work queued there; backups are the ``healthy`` ones."""
        routing = self.routing
        backups = () if routing is None else ((w, routing.replicas[w].batch_ms + wait_ms(w))
                                              for w, _ in routing.backups.get(task, ()) if w in healthy)
        second = now_us // 1_000_000
        return next_hop(self.drop.value, overrun_us / 1000, routed.batch_ms if routed is not None else None, backups,
                        lambda w: self._allowance.take(w, second))

    def batch_ms(self, worker_id: int, variant: str) -> float:
        """l: the variant's batch latency at the worker's planned batch size (batch 1 off the plan)."""
        replica = self.routing.replicas.get(worker_id) if self.routing is not None else None
        return replica.batch_ms if replica is not None and replica.variant == variant else \
            self.pipeline.variant(variant).batch_ms(1)

    def budget_us(self, worker_id: int, variant: str) -> int:
        """The task's latency budget on this worker: its factor (see the module notes) times l."""
        factor = self._factor.get(self.pipeline.task_of(variant).name, 2.0)
        return round(factor * self.batch_ms(worker_id, variant) * 1000)

    @property
    def drops_at_dequeue(self) -> bool:
        return drops_at_dequeue(self.drop.value, self.dequeue)

    def absorbs(self, worker_id: int, task: str, overrun_us: int) -> bool:
        """Rerouting at dequeue: some child task of ``task`` has a backup that runs faster than where the worker's
        table sends that child's queries, by at least ``overrun_us`` (the rule :func:`next_hop` applies when the
        query has run, without the queues, which it then counts)."""
        routing = self.routing
        if routing is None or self.drop is not DropMode.REROUTING:
            return False
        for child in self.pipeline.task(task).children:
            table = routing.tables.get((worker_id, child), ())
            routed = max((routing.replicas[w].batch_ms for w, _ in table), default=None)
            if routed is not None and any(routing.replicas[w].batch_ms <= routed - overrun_us / 1000
                                          for w, _ in routing.backups.get(child, ())):
                return True
        return False

    def ran(self, query: Query, worker_id: int, variant: str) -> None:
        self.hops[query.id] = Hop(worker_id, query.arrival_us, self.budget_us(worker_id, variant))
        if len(self.hops) > MAX_HOPS:  # a batch that failed is never completed: its hops go oldest first
            del self.hops[next(iter(self.hops))]

    def completed(self, records: Sequence[QueryRecord]) -> None:
        """A batch ended: its queries' hops are kept until the children this batch creates have arrived (they
        arrive before the engine's next event), then forgotten."""
        for qid in self._retiring:
            self.hops.pop(qid, None)
        self._retiring = [r.query_id for r in records]


class LokiTask(Policy):
    """One task of a Loki pipeline; ``router`` is shared by all the pipeline's tasks."""

    name = "loki"
    routes = True

    def __init__(self, pipeline: Pipeline, task: str, router: Router, *, balance: bool = True, **options) -> None:
        super().__init__(pipeline.profile(task), **options)
        self.balance = balance
        self._siblings: dict[str, tuple[int, ...]] = {}  # variant -> the plan's replicas of it
        self._mine: frozenset[int] = frozenset()  # the plan's workers of this task
        self.pipeline, self.task, self.router = pipeline, pipeline.task(task), router
        self.leaf = not self.task.children
        self.variants = {v.id for v in self.task.variants}
        self.max_batch = max(b for v in self.task.variants for b in v.latency.batch_sizes)
        self._rest_us = {v.id: round(fastest_rest_ms(pipeline, v.id) * 1000) for v in self.task.variants}

    # ------------------------------------------------------------------ routing and early dropping
    def observe_plan(self, now_us: int, plan: Plan) -> None:
        self.router.observe_plan(plan)
        routing = self.router.routing
        if routing is None:
            return
        self._mine = frozenset(r.worker_id for r in routing.workers_of(self.task.name))
        self._siblings = {}
        for r in sorted(routing.workers_of(self.task.name), key=lambda r: r.worker_id):
            self._siblings[r.variant] = (*self._siblings.get(r.variant, ()), r.worker_id)

    def keeps(self, worker: WorkerState) -> bool:
        """A worker of the plan's for this task that is up and holds, or is getting, one of its variants."""
        return worker.healthy and worker.id in self._mine and self._serves(worker)

    def _serves(self, worker: WorkerState) -> bool:
        return worker.resident is None or not self.variants.isdisjoint(worker.resident) or \
            worker.staging_model in self.variants or worker.loading_model in self.variants

    def route(self, now_us: int, query: Query, queue: QueueView, workers: Sequence[WorkerState]) -> int | Drop | None:
        hop = self.router.hops.get(query.parent) if query.parent is not None else None
        target = self.router.target(hop.worker_id if hop is not None else FRONTEND, self.task.name)
        busy, healthy = self._states(workers)
        if hop is not None:
            choice, backup = self.router.next_hop(self.task.name, now_us, now_us - hop.reached_us - hop.budget_us,
                                                  self._replica(target), lambda w: self._wait_ms(w, queue, busy),
                                                  healthy)
            if choice is Choice.DROPPED:
                return DROP
            if choice is Choice.REROUTED:
                self.router.rerouted += 1
                target = backup
        return self._least_queued(target, queue, busy, healthy)

    def reroute(self, now_us: int, query: Query, queue: QueueView, workers: Sequence[WorkerState]) -> int | None:
        """A query whose worker left the plan or failed, or came before any plan: the task's tables again."""
        target = self.router.target(FRONTEND if query.stage == 0 else None, self.task.name)
        return self._least_queued(target, queue, *self._states(workers))

    def _states(self, workers: Sequence[WorkerState]) -> tuple[set[int], set[int]]:
        """(the workers running a batch or loading, the plan's workers of this task that can serve it)."""
        busy = {w.id for w in workers if not w.is_free}
        return busy, {w.id for w in workers if self.keeps(w)}

    def _wait_ms(self, worker_id: int, queue: QueueView, busy: set[int]) -> float:
        """How long a query joining the worker's queue waits: the batches ahead of it, and the running one."""
        replica = self._replica(worker_id)
        if replica is None:
            return 0.0
        return (len(queue.at(worker_id)) // replica.batch + (worker_id in busy)) * replica.batch_ms

    def _replica(self, worker_id: int | None) -> Replica | None:
        routing = self.router.routing
        return routing.replicas.get(worker_id) if routing is not None and worker_id is not None else None

    def _least_queued(self, worker_id: int | None, queue: QueueView, busy: set[int], healthy: set[int]) -> int | None:
        """The replica of ``worker_id``'s variant with the least work queued (the sampled one on a tie): the table
        decides the variant, and replicas of one variant are interchangeable. Decision: with none of them
        ``healthy`` (lost), the task's healthy worker with the least work queued (its variant may differ: served
        less accurately rather than waiting for the next plan); with none at all, held (None) until one is."""
        def work(w: int) -> tuple[int, bool]:
            return len(queue.at(w)) + (w in busy), w != worker_id

        replica = self._replica(worker_id)
        if replica is not None and (self.balance or worker_id not in healthy):
            siblings = [w for w in self._siblings.get(replica.variant, ()) if w in healthy]
            if not siblings or not self.balance:
                siblings = sorted(healthy)
            return min(siblings, key=work, default=None)
        if worker_id is None or worker_id in healthy:
            return worker_id
        return min(sorted(healthy), key=work, default=None)

    # ------------------------------------------------------------------ batching
    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        dispatches, dropped = [], []
        for w in workers:
            mine = queue.at(w.id)
            if not mine or not w.is_free:
                continue
            replica = self._replica(w.id)
            variant = replica.variant if replica is not None and w.holds(replica.variant) else \
                next((v.id for v in self.task.variants if w.holds(v.id)), None)
            if variant is None:
                continue  # its model is still loading
            planned = replica.batch if replica is not None and replica.variant == variant else 1
            late = 0
            if self.router.drops_at_dequeue:  # before the batch runs (DEFAULT_DEQUEUE)
                late = self._lost_before_running(now_us, mine, w.id, variant, planned)
            elif self.router.drop is DropMode.LAST_TASK and self.leaf:
                batch_us = round(self.pipeline.variant(variant).batch_ms(
                    replica.batch if replica is not None else 1) * 1000)
                for q in mine.scan():
                    if not too_late(q.deadline_us - now_us, batch_us):
                        break
                    late += 1
            dropped.extend(q.id for q in mine.head(late))
            size = min(len(mine) - late, planned)
            if not size:
                continue
            batch = mine.head(late + size)[late:]
            if not self.leaf:
                for q in batch:
                    self.router.ran(q, w.id, variant)
            dispatches.append(Dispatch(w.id, variant, tuple(q.id for q in batch)))
        return Decision(tuple(dispatches), tuple(dropped))

    def _lost_before_running(self, now_us: int, mine: QueueView, worker_id: int, variant: str, planned: int) -> int:
        """How many queries at the head of ``mine`` the check before a batch drops (see DEQUEUES): ``hopeless``, those
        that would end past their frame's deadline in the batch they would run in now and the fastest rest of their
        path; ``artifact``, those that would overrun their task's budget, unless a faster backup absorbs it."""
        late = 0
        if self.router.dequeue == "hopeless":
            latency = self.pipeline.variant(variant).latency
            for q in mine.scan():
                ms = latency.p50_at(min(len(mine) - late, planned))
                if not hopeless(q.deadline_us - now_us, round(ms * 1000), self._rest_us[variant]):
                    break
                late += 1
            return late
        batch_us = round(self.router.batch_ms(worker_id, variant) * 1000)
        budget_us = self.router.budget_us(worker_id, variant)
        for q in mine.scan():
            waited = now_us - q.arrival_us
            if not expiring(waited, batch_us, budget_us) or \
                    self.router.absorbs(worker_id, self.task.name, waited + batch_us - budget_us):
                break
            late += 1
        return late

    def observe_completion(self, now_us: int, records: Sequence[QueryRecord]) -> None:
        self.router.completed(records)
