"""Proteus' data path for one query type (§3, §5): a router over the plan's replicas, batching per worker.

Every arrival goes to one worker's queue (the engine keeps the queues) by smooth weighted round-robin over
the plan's shares (the query assignment y[d,q]; the paper leaves the mechanism open, and a deterministic
split keeps each worker's arrivals as even as its share allows). A free worker's queue is batched by the
configured strategy (:mod:`.batching`). On a new plan, queries queued on workers that no longer serve the
type move to the new replicas, so a plan change drops nothing; the same happens to the queue of a worker
that fails or no longer holds the type's variants (one loading one of them keeps its queue). Before the
first plan, and for a type the plan gives no replica, queries go round-robin to whichever workers hold one
of the type's variants; while none of the plan's replicas can serve yet, so do they, and keep their queues
until the next plan.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_sidecar.core.plan import Plan
from scheduler_sidecar.core.policy import LateQueries, Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import Decision, Dispatch, Query, QueryRecord, WorkerState
from scheduler_sidecar.systems.proteus.batching import Batching, make_batching
from scheduler_sidecar.systems.proteus.routing import Route, Routing


class Proteus(Policy):
    """Options: ``query_type`` (the name the planner's routes use; default the profile's name), ``batching``
    (a :data:`~.batching.STRATEGIES` name) and ``guard_us``, a fixed margin (the timer's lateness) on top of
    the guard a waiting worker keeps before its last safe moment: the profile's p99 over p50 of the batch it
    waits to run, on its device kind, so that a batch slower than its median still makes the deadline. A
    profile whose p99 is its p50 (the authors' Proteus profile, a simulation without latency noise) has no
    tail: the worker waits until the last moment, as the paper's adaptive batching does."""

    name = "proteus"
    routes = True

    def __init__(self, profile: Profile, *, query_type: str | None = None, batching: str = "proteus",
                 guard_us: int = 0, **options) -> None:
        super().__init__(profile, **options)
        if guard_us < 0:
            raise ValueError(f"guard_us must be >= 0, got {guard_us}")
        self.query_type = query_type or profile.name
        self.batching = batching
        make_batching(batching)  # fail early on a bad name
        self.guard_us = guard_us
        self.max_batch = profile.variants[0].latency[self.device].batch_sizes[-1]
        self.models = {v.actuation.model: v.id for v in profile.variants}
        self.replicas: tuple[Route, ...] = ()  # the plan's routes of this type
        self._credit: list[float] = []
        # workers whose queues a plan change leaves where they are: the plan's replicas, and workers this
        # policy fell back to since; None before any plan
        self._placed: set[int] | None = None
        self._strategy: dict[int, Batching] = {}  # worker id -> its batching state
        self._last_batch: dict[int, frozenset[int]] = {}  # worker id -> the query ids of its latest batch
        self._next = 0

    # ------------------------------------------------------------------ routing
    def observe_plan(self, now_us: int, plan: Plan) -> None:
        if not isinstance(plan.detail, Routing):
            return
        self.replicas = plan.detail.routes.get(self.query_type, ())
        self._credit = [0.0] * len(self.replicas)
        self._placed = {r.worker_id for r in self.replicas}

    def keeps(self, worker: WorkerState) -> bool:
        serves = self._holds_ours(worker) or worker.staging_model in self.models
        return worker.healthy and serves and (self._placed is None or worker.id in self._placed)

    def route(self, now_us: int, query: Query, queue: QueueView, workers: Sequence[WorkerState]) -> int | None:
        # the plan's replicas that can serve now (one whose model still loads gets its share once it is in);
        # with none of them ready, whichever workers still hold one of our variants; with none, the plan's
        known = [w.id for w in workers if w.healthy and self._holds_ours(w)]
        ready = [i for i, r in enumerate(self.replicas) if r.worker_id in known]
        if not ready and known:
            self._next = (self._next + 1) % len(known)
            if self._placed is not None:
                self._placed.add(known[self._next])
            return known[self._next]
        if self.replicas:  # smooth weighted round-robin (nginx): the largest credit wins and pays the total
            ready = ready or list(range(len(self.replicas)))
            best, total = ready[0], 0.0
            for i in ready:
                self._credit[i] += self.replicas[i].share
                total += self.replicas[i].share
                if self._credit[i] > self._credit[best]:
                    best = i
            self._credit[best] -= total
            return self.replicas[best].worker_id
        return None

    # ------------------------------------------------------------------ batching
    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        variant_on = {r.worker_id: r for r in self.replicas}
        dispatches, dropped, wakeups = [], [], []
        for w in workers:
            mine = queue.at(w.id)
            if not mine or not w.is_free:
                continue
            variant = self._variant(w, variant_on.get(w.id))
            if variant is None:
                continue  # its model is still loading
            route = variant_on.get(w.id)
            max_batch = route.max_batch if route is not None and route.variant == variant else 1

            def latency(k: int, variant=variant, device=w.device) -> int:
                return self.latency.us(variant, k, device) + self.overhead_us

            def guard(k: int, variant=variant, device=w.device) -> int:
                return self.latency.tail_us(variant, k, device) + self.guard_us

            action = self._strategy_of(w.id).decide(now_us, mine, latency, max(1, min(max_batch, self.max_batch)),
                                                    self.late_queries is LateQueries.DROP, guard)
            if action.drop:
                dropped.extend(q.id for q in mine.head(action.drop))
            elif action.dispatch:
                ids = tuple(q.id for q in mine.head(action.dispatch))
                self._last_batch[w.id] = frozenset(ids)
                dispatches.append(Dispatch(w.id, variant, ids))
            elif action.wakeup_us is not None:
                wakeups.append(action.wakeup_us)
        return Decision(tuple(dispatches), tuple(dropped), min(wakeups) if wakeups else None)

    def observe_completion(self, now_us: int, records: Sequence[QueryRecord]) -> None:
        if not records:
            return
        first = records[0].query_id
        wid = next((w for w, ids in self._last_batch.items() if first in ids), None)
        if wid is not None:
            self._strategy_of(wid).completed(any(r.finish_us > r.deadline_us for r in records))

    def _holds_ours(self, w: WorkerState) -> bool:
        return w.resident is None or any(m in w.resident for m in self.models)

    def _variant(self, w: WorkerState, route: Route | None) -> str | None:
        """The variant to run on ``w``: the plan's if it is resident, else the most accurate of ours it holds
        (while the plan's loads beside it)."""
        if route is not None and w.holds(self.profile.variant(route.variant).actuation.model):
            return route.variant
        return next((v.id for v in reversed(self.profile.variants) if w.holds(v.actuation.model)), None)

    def _strategy_of(self, wid: int) -> Batching:
        strategy = self._strategy.get(wid)
        if strategy is None:
            strategy = self._strategy[wid] = make_batching(self.batching, self.max_batch)
        return strategy
