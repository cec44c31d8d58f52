"""Proteus' data path for one query type (§3, §5): a router over the plan's replicas and a queue per worker.

Every arrival goes to one worker's queue by smooth weighted round-robin over the plan's shares
(the query assignment y[d,q]; the paper leaves the mechanism open, and a deterministic split
keeps each worker's arrivals as even as its share allows). A free worker's queue is batched by
the configured strategy (:mod:`.batching`). On a new plan, queries queued on workers that no
longer serve the type move to the new replicas, so a plan change drops nothing; the same
happens to the queue of a worker that fails. Before the first plan, and for a type the plan
gives no replica, queries go round-robin to whichever workers hold one of the type's variants.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence

from scheduler_sidecar.core.plan import Plan
from scheduler_sidecar.core.policy import LateQueries, Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import EMPTY, Decision, Dispatch, Query, QueryRecord, WorkerState
from scheduler_sidecar.systems.proteus.batching import Batching, make_batching
from scheduler_sidecar.systems.proteus.routing import Route, Routing


class Proteus(Policy):
    """Options: ``query_type`` (the name the planner's routes use; default the profile's name), ``batching``
    (a :data:`~.batching.STRATEGIES` name) and ``guard_us``, how long before its last safe moment a waiting
    worker starts a batch (0 in simulation, where batches take their profiled latency; live, the tail over
    the median latency plus the timer's lateness)."""

    name = "proteus"

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
        self.routes: tuple[Route, ...] = ()
        self._credit: list[float] = []
        self.queues: dict[int, deque[Query]] = {}  # worker id -> its queue, earliest deadline first
        self._where: dict[int, int] = {}  # query id -> worker id
        self._strategy: dict[int, Batching] = {}  # worker id -> its batching state
        self._last_batch: dict[int, frozenset[int]] = {}  # worker id -> the query ids of its latest batch
        self._unrouted: deque[Query] = deque()  # arrivals before any worker is known
        self._known: list[int] = []  # healthy workers holding one of our variants, by id: they can serve now
        self._next = 0

    # ------------------------------------------------------------------ routing
    def observe_plan(self, now_us: int, plan: Plan) -> None:
        if not isinstance(plan.detail, Routing):
            return
        self.routes = plan.detail.routes.get(self.query_type, ())
        self._credit = [0.0] * len(self.routes)
        served = {r.worker_id for r in self.routes}
        for wid in [w for w in self.queues if w not in served]:
            self._reroute(wid)

    def observe_arrival(self, now_us: int, query: Query) -> None:
        wid = self._pick()
        if wid is None:
            self._unrouted.append(query)
        else:
            self._enqueue(wid, query)

    def _pick(self) -> int | None:
        # the plan's replicas that can serve now (one whose model still loads gets its share once it is in);
        # with none of them ready, whichever workers still hold one of our variants; with none, the plan's
        ready = [i for i, r in enumerate(self.routes) if r.worker_id in self._known]
        if not ready and self._known:
            self._next = (self._next + 1) % len(self._known)
            return self._known[self._next]
        if self.routes:  # smooth weighted round-robin (nginx): the largest credit wins and pays the total
            ready = ready or list(range(len(self.routes)))
            best, total = ready[0], 0.0
            for i in ready:
                self._credit[i] += self.routes[i].share
                total += self.routes[i].share
                if self._credit[i] > self._credit[best]:
                    best = i
            self._credit[best] -= total
            return self.routes[best].worker_id
        return None

    def _enqueue(self, wid: int, query: Query) -> None:
        wq = self.queues.setdefault(wid, deque())
        if not wq or wq[-1] < query:
            wq.append(query)
        else:  # a moved query, or a client's shorter SLO: keep the queue in deadline order
            bisect.insort(wq, query)
        self._where[query.id] = wid

    def _reroute(self, wid: int) -> None:
        for q in self.queues.pop(wid, deque()):
            del self._where[q.id]
            self.observe_arrival(0, q)

    def _reconcile(self, queue: QueueView) -> None:
        """Match the engine's queue: forget queries that left it without us, route ones we never saw (a retry)."""
        present = {q.id: q for q in queue.scan()}
        for wid, wq in list(self.queues.items()):
            kept = deque(q for q in wq if q.id in present)
            if len(kept) != len(wq):
                for q in wq:
                    if q.id not in present:
                        del self._where[q.id]
                self.queues[wid] = kept
        self._unrouted = deque(q for q in self._unrouted if q.id in present)
        waiting = {q.id for q in self._unrouted}
        for qid, q in sorted(present.items(), key=lambda kv: kv[1]):
            if qid not in self._where and qid not in waiting:
                self.observe_arrival(0, q)

    # ------------------------------------------------------------------ batching
    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        self._refresh(workers)
        if len(queue) != len(self._where) + len(self._unrouted):
            self._reconcile(queue)
        if not queue:
            return EMPTY
        variant_on = {r.worker_id: r for r in self.routes}
        dispatches, dropped, wakeups = [], [], []
        for w in workers:
            wq = self.queues.get(w.id)
            if not wq or not w.is_free:
                continue
            variant = self._variant(w, variant_on.get(w.id))
            if variant is None:
                continue  # its model is still loading
            route = variant_on.get(w.id)
            max_batch = route.max_batch if route is not None and route.variant == variant else 1

            def latency(k: int, variant=variant, device=w.device) -> int:
                return self.latency.us(variant, k, device) + self.overhead_us

            action = self._strategy_of(w.id).decide(now_us, wq, latency, max(1, min(max_batch, self.max_batch)),
                                                    self.late_queries is LateQueries.DROP)
            if action.drop:
                dropped.extend(self._take(w.id, action.drop, queue))
            elif action.dispatch:
                ids = tuple(self._take(w.id, action.dispatch, queue))
                if ids:
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

    def _refresh(self, workers: Sequence[WorkerState]) -> None:
        """Track which workers can serve us now; move the queue of a worker that failed or left us (one that is
        loading one of our variants keeps its queue)."""
        known = [w.id for w in workers if w.healthy and self._holds_ours(w)]
        self._known = known
        stranded = [wid for wid, wq in self.queues.items() if wq and wid not in known] if self.queues else ()
        if stranded:
            coming = {w.id for w in workers if w.healthy and w.staging_model in self.models}
            for wid in stranded:
                if wid not in coming:
                    self._reroute(wid)
        if known and self._unrouted:
            for q in list(self._unrouted):
                self._unrouted.popleft()
                self.observe_arrival(0, q)

    def _holds_ours(self, w: WorkerState) -> bool:
        return w.resident is None or any(m in w.resident for m in self.models)

    def _variant(self, w: WorkerState, route: Route | None) -> str | None:
        """The variant to run on ``w``: the plan's if it is resident, else the most accurate of ours it holds
        (while the plan's loads beside it)."""
        if route is not None and w.holds(self.profile.variant(route.variant).actuation.model):
            return route.variant
        return next((v.id for v in reversed(self.profile.variants) if w.holds(v.actuation.model)), None)

    def _take(self, wid: int, n: int, queue: QueueView) -> list[int]:
        """The ids of the ``n`` head queries of a worker's queue; one that left the engine's queue without us (a
        client cancelled it and a retry kept the count equal) is forgotten, not handed back."""
        wq = self.queues[wid]
        ids = [wq.popleft().id for _ in range(min(n, len(wq)))]
        for qid in ids:
            del self._where[qid]
        return [qid for qid in ids if qid in queue]

    def _strategy_of(self, wid: int) -> Batching:
        strategy = self._strategy.get(wid)
        if strategy is None:
            strategy = self._strategy[wid] = make_batching(self.batching, self.guard_us, self.max_batch)
        return strategy
