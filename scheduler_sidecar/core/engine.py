"""The engine: one decide/apply loop over a shared worker pool, for the simulator and the live sidecar.

NOTE on the design. The engine owns everything both drivers used to do twice: admission, the EDF
queue of every query type (and, for a policy that routes, the queue of every worker), asking each
type's policy to decide, carrying out decisions (dispatches, drops, loads, unloads), wakeups, plans,
retries after a worker is lost, and the one record per query. A driver supplies a clock
(``clock() -> now_us``) and an :class:`Executor` that runs what the engine starts: in the simulator
a batch completes at now plus a profiled latency, live it is an RPC to Triton. The driver reports back
through the engine's event methods (:meth:`Engine.batch_done`, :meth:`Engine.load_done`, ...). An event
admits everything it brings (a batch's follow-ups, a lost worker's retries, a plan an inline planner
made meanwhile) and then runs :meth:`Engine.step` once; it never re-enters itself. Nothing here awaits
or sleeps, so a decision always sees a consistent state.

After every event, ``step`` asks the policy of every query type with queued queries to decide,
the type with the earliest head deadline first, and repeats while any decision did something and
a worker is still free (with none free there is nothing a policy could start). A worker is
shared: the first policy to dispatch to it makes it busy for the others, so no worker runs two
batches at once.

Routing. A query of a routing policy's type is in the type's queue and in one worker's queue
(or held unrouted), where ``policy.route`` sent it; the engine removes it from both at once
whatever ends it (a dispatch, a drop, a cancel, a failure). After any change of the workers
or the plan, the queue of a worker the policy no longer ``keeps`` is routed again, queries held
unrouted get another try, and a retried batch's queries are routed again: the policy never
holds a copy of what is queued.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from scheduler_sidecar.core.plan import Demand, Plan, Planner, Scope
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.queue import EdfQueue, QueueView, WorkerQueues
from scheduler_sidecar.core.records import (
    DROP,
    Batch,
    BatchResult,
    Decision,
    Load,
    Outcome,
    Query,
    QueryRecord,
    Unload,
    WorkerState,
)
from scheduler_sidecar.errors import (
    AccscaleError,
    DeadlineExceeded,
    InternalError,
    Overloaded,
    PolicyError,
    RequestError,
    SloInfeasible,
    Unavailable,
    UnknownModel,
    WorkerError,
    WorkerLost,
)

log = logging.getLogger(__name__)


class Executor(Protocol):
    """How a driver carries out what the engine starts; each call returns at once."""

    def run_batch(self, batch: Batch) -> None:
        """Run the batch; report with ``engine.batch_done`` or ``engine.batch_failed``."""

    def load(self, worker: WorkerState, model: str) -> int:
        """Start loading ``model``; return the expected load time in us; report with ``engine.load_done``."""

    def unload(self, worker: WorkerState, model: str) -> None:
        """Unload ``model`` (the engine no longer dispatches it to this worker)."""

    def wake_at(self, time_us: int) -> None:
        """Call ``engine.wakeup()`` at ``time_us`` (the engine asks once per distinct time)."""

    def plan(self, planner: Planner, now_us: int, demand: Demand) -> None:
        """Run ``planner.plan``, inline or off the event loop; hand the result to ``engine.apply_plan``."""

    def scale(self, model: str, instances: int, workers: Sequence[WorkerState]) -> None:
        """Run ``instances`` instances of ``model`` on the servers of ``workers`` (a plan's ``instances``, on its
        planner's workers: the pipeline models a BLS model calls are not a worker's placement)."""


# record, the driver's output for a served query, the error for one that was not served
EndHandler = Callable[[QueryRecord, object, AccscaleError | None], None]
# the query type whose queries a fault failed, the policy or planner that raised, and its exception
FaultHandler = Callable[[str, str, Exception], None]


@dataclass(frozen=True)
class TypeLimits:
    """What a query type refuses on arrival and how often it retries a query: the one home of these defaults, which
    a sidecar's config (``ModelSpec``), the live driver and the simulator (:data:`SIMULATED`) all read here."""

    queue_limit: int | None = 1024  # queued queries beyond this are refused; None: no limit
    max_attempts: int = 3  # dispatches per query when workers are lost
    # refuse an arrival that the queries queued ahead of it already make infeasible (see Engine._infeasible)
    admission: bool = True


# The simulator's: the papers' policies as published, with no queue limit and no admission, and a lost worker's
# queries retried until served (Ambiguity: the simulator retried without limit before the engine counted attempts;
# kept, where the live sidecar tries 3 times).
SIMULATED = TypeLimits(queue_limit=None, max_attempts=1 << 30, admission=False)


@dataclass
class QueryType:
    """One query type (a logical model) of the pool: its policy, its queue and its limits."""

    name: str
    policy: Policy
    limits: TypeLimits = TypeLimits()

    def __post_init__(self) -> None:
        self.queue = EdfQueue()
        self.latest_deadline_us = 0  # no queued query has a later deadline (it may be stale: then higher)
        self.use(self.policy)

    def use(self, policy: Policy) -> None:
        """Serve the type with ``policy`` from now on; a routing policy starts with no query routed."""
        self.policy = policy
        self.routes = WorkerQueues() if policy.routes else None
        self.view = QueueView(self.queue, self.routes)  # what the policy sees
        variants = policy.profile.variants
        self.models = {v.id: v.actuation.model for v in variants}  # variant id -> Triton model it runs on
        self.accuracy = {v.id: v.accuracy for v in variants}

    def remove(self, query_ids: Sequence[int]) -> list[Query]:
        """Take queued queries out of the type's queue and their workers' queues."""
        out = self.queue.remove(query_ids)
        if self.routes is not None:
            self.routes.remove(query_ids)
        return out


@dataclass
class _Planning:
    """One planner's state: the arrivals of its types since its last plan, its plan, and when it plans next."""

    planner: Planner
    since_us: int
    arrivals: dict[str, int] = field(default_factory=dict)  # query type -> arrivals since ``since_us``
    plan: Plan | None = None
    busy: bool = False  # a plan is being made
    again: bool = False  # its workers changed while it was made: plan again once it is in
    next_us: int | None = None


class Engine:
    """One shared worker pool: see the module docstring."""

    def __init__(self, types: Sequence[QueryType], workers: Sequence[WorkerState], executor: Executor, *,
                 clock: Callable[[], int], on_end: EndHandler,
                 on_decide: Callable[[str, str], None] | None = None, on_fault: FaultHandler | None = None) -> None:
        if not types:
            raise ValueError("an engine needs at least one query type")
        self.types = {t.name: t for t in types}
        self._type_list = list(types)
        if len(self.types) != len(types):
            raise ValueError(f"query type names must be unique: {[t.name for t in types]}")
        self.workers: list[WorkerState] = list(workers)
        self._index = {w.id: i for i, w in enumerate(self.workers)}
        self._free = sum(w.is_free for w in self.workers)  # workers that could start a batch now
        self.executor, self.clock, self.on_end = executor, clock, on_end
        self.on_decide = on_decide  # (query type, policy name) after each decide() call: metrics
        # a policy or planner that raises fails only its own types' queued queries, and this hears of it (live);
        # None: the exception propagates (the simulator, where a bug must surface)
        self.on_fault = on_fault
        self._plannings: list[_Planning] = []  # one per planner (add_planner), each over its scope
        self.num_decisions = 0
        self._running: dict[int, Batch] = {}  # worker id -> its running batch
        self._attempts: dict[int, int] = {}  # query id -> dispatches so far (only while it is not done)
        self._wakeups: set[int] = set()  # times the executor will call wakeup()
        self._target: dict[int, frozenset[str]] = {}  # worker id -> placement still to carry out
        self._leaving: set[int] = set()  # workers removed while running a batch: they go when it ends
        self._retired: set[int] = set()  # workers that have gone: their ids are never taken again
        self._instances: dict[str, int] = {}  # Triton model -> the instance count a plan last set
        # query type -> (indices of its workers, None when all of them; how many of them are healthy)
        self._views: dict[str, tuple[list[int] | None, int]] = {}
        self._reroute_due = False  # workers or the plan changed: routed queues may have to move
        self._planning_inline = 0  # depth of executor.plan calls under way (see step)
        self._quickest: dict[str, tuple[int, int]] = {}  # query type -> (latency version, quickest us)
        # (query type, device kind, latency version, slack in ms) -> queries one worker can serve in that slack
        self._capacity: dict[tuple[str, str, int, int], int] = {}

    # ------------------------------------------------------------------ events from the driver
    def arrive(self, *queries: Query) -> None:
        """Admit queries that arrived together (each, or end it as rejected), then let the policies decide once."""
        for query in queries:
            self._admit(query)
        self.step()

    def _admit(self, query: Query) -> None:
        qt = self.types.get(query.type)
        if qt is None:
            self._end(query, Outcome.REJECTED, error=UnknownModel(
                f"unknown query type {query.type!r}; this pool serves {sorted(self.types)}"))
            return
        now = query.arrival_us
        error = self._refusal(qt, query)
        if error is not None:
            self._end(query, Outcome.REJECTED, now, error=error)
            return
        qt.queue.push(query)
        qt.latest_deadline_us = max(qt.latest_deadline_us, query.deadline_us)
        try:
            if qt.routes is not None:
                self._route(qt, query, now, again=False)
            qt.policy.observe_arrival(now, query)
        except Exception as exc:
            self._fault((qt,), qt.policy.name, exc)
            return
        for state in self._plannings:
            if state.planner.scope.has_type(qt.name):
                state.arrivals[qt.name] = state.arrivals.get(qt.name, 0) + 1
                try:
                    due = state.planner.observe_arrival(now, query)
                except Exception as exc:
                    self._fault(self._types_of(state), type(state.planner).__name__, exc)
                    continue
                if due:
                    self._request(state)

    def cancel(self, query_id: int, query_type: str) -> bool:
        """A client left: drop its query if it is still queued (True) and end it as cancelled."""
        qt = self.types.get(query_type)
        if qt is None or query_id not in qt.queue:
            return False
        self._end(qt.remove([query_id])[0], Outcome.CANCELLED)
        return True

    def batch_done(self, batch: Batch, result: BatchResult | None = None) -> None:
        """A batch finished at ``clock()``; ignored if its worker was lost meanwhile."""
        if not self._release(batch):
            return
        self._drop_left()
        now = self.clock()
        result = result or BatchResult()
        qt = self.types[batch.queries[0].type]
        records = []
        failed, served_by, outputs = result.failed, result.served_by, result.outputs
        size, variant, end, accuracy = len(batch.queries), batch.variant_id, self._end, batch.accuracy
        for q in batch.queries:
            if failed and q.id in failed:
                end(q, Outcome.FAILED, now, error=failed[q.id])
                continue
            served = served_by.get(q.id, variant) if served_by else variant
            records.append(end(q, Outcome.MET if now <= q.deadline_us else Outcome.LATE, now, served,
                               accuracy[served], size, output=outputs.get(q.id) if outputs else None))
        try:
            qt.policy.observe_completion(now, records)
        except Exception as exc:
            self._fault((qt,), qt.policy.name, exc)
        for follow_up in result.follow_ups:  # every follow-up is queued before any policy decides (no re-entry)
            self._admit(follow_up)
        self.step()

    def batch_failed(self, batch: Batch, error: WorkerError) -> None:
        """A batch's worker could not run it: retried if the worker was lost, else each query gets the error."""
        if not self._release(batch):
            return
        self._drop_left()
        if isinstance(error, WorkerLost):
            self._requeue(batch.queries, error)
        else:
            for q in batch.queries:
                self._end(q, Outcome.FAILED, error=error)
        self.step()

    def update_workers(self, serving: Iterable[WorkerState]) -> None:
        """Reconcile with the full set of workers that should be serving now (a driver's membership registry): one
        absent from it leaves (drained, as :meth:`remove_workers`), a new one joins, and each keeps or changes its
        health as the set says; then the policies decide once. A full set cannot be applied out of order, as a
        stream of adds and removes can."""
        desired = {w.id: w for w in serving}
        joining = [w for wid, w in desired.items() if wid not in self._index]
        leaving = [wid for wid in self._index if wid not in desired and wid not in self._leaving]
        self._add(joining)
        self._remove(leaving)
        for wid, w in desired.items():
            self._health(wid, w.healthy)
        self._replan({w.id for w in joining} | set(leaving))
        self.step()

    def _replan(self, worker_ids: set[int]) -> None:
        """A planner whose workers joined or left plans again at once: its plan names workers by id, and a worker
        that joined serves nothing of a planned type, or one that left takes its routed queries with it, until it
        does (a planner's period can be seconds)."""
        for state in self._plannings:
            if any(state.planner.scope.has_worker(wid) for wid in worker_ids):
                self._request(state, workers_changed=True)

    def set_health(self, worker_id: int, healthy: bool) -> None:
        """A worker went down (its running batch is retried elsewhere) or came back. A worker that has left (or is
        leaving, see :meth:`remove_workers`) never comes back; its loss is still a loss."""
        self._health(worker_id, healthy)
        self.step()

    def _health(self, worker_id: int, healthy: bool) -> None:
        i = self._index.get(worker_id)
        if i is None or (healthy and worker_id in self._leaving):
            return
        worker = self.workers[i]
        # a leaving worker is already down; that it died matters only for the batch it was finishing
        died_leaving = not healthy and worker_id in self._leaving and worker_id in self._running
        if worker.healthy == healthy and not died_leaving:
            return
        self._set(i, worker, healthy=healthy, busy_until_us=None, loading_model=None, loading_until_us=None,
                  staging_model=None)
        self._workers_changed()
        batch = self._running.pop(worker_id, None)
        if batch is not None:
            self._requeue(batch.queries, WorkerLost(f"worker {worker_id} was lost while running its batch",
                                                    worker=str(worker_id), queries=batch.query_ids))
        self._drop_left()
        if not healthy:
            self._fail_unserved(Unavailable("no healthy worker"))

    def remove_workers(self, worker_ids: Iterable[int]) -> None:
        """Workers leave the pool for good (their Triton was scaled away): none starts another batch or load, and
        each goes once the batch it runs, if any, has ended; that batch's queries are answered as usual, or
        retried elsewhere if it fails. So a worker drained this way loses no query."""
        self._remove(worker_ids)
        self.step()

    def _remove(self, worker_ids: Iterable[int]) -> None:
        worker_ids = list(worker_ids)
        if not worker_ids:
            return
        for wid in worker_ids:
            i = self._index[wid]
            self._set(i, self.workers[i], healthy=False, loading_model=None, loading_until_us=None,
                      staging_model=None)
            self._leaving.add(wid)
        self._workers_changed()
        self._drop_left()
        self._fail_unserved(Unavailable("no healthy worker"))

    def _drop_left(self) -> None:
        """Forget the leaving workers that run no batch any more."""
        gone = {wid for wid in self._leaving if wid not in self._running}
        if not gone:
            return
        self._leaving -= gone
        self._retired |= gone
        self.workers = [w for w in self.workers if w.id not in gone]
        self._index = {w.id: i for i, w in enumerate(self.workers)}
        self._free = sum(w.is_free for w in self.workers)
        for wid in gone:
            self._target.pop(wid, None)
        self._workers_changed()

    def has_worker(self, worker_id: int) -> bool:
        """Whether the worker is (still) in the pool: added, and not yet gone after :meth:`remove_workers`."""
        return worker_id in self._index

    def _fail_unserved(self, error: AccscaleError) -> None:
        """End the queued queries of every type left without a healthy worker: none could serve them."""
        for qt in self.types.values():
            if not self._num_healthy(qt):
                self._fail_queued(qt, error)

    def add_workers(self, workers: Iterable[WorkerState]) -> None:
        self._add(workers)
        self.step()

    def _add(self, workers: Iterable[WorkerState]) -> None:
        workers = list(workers)
        for w in workers:  # checked first: a refused call adds none of them
            if w.id in self._index or w.id in self._retired:
                raise ValueError(f"worker {w.id} is already in the pool, or was: a worker id is never reused")
        for w in workers:
            self._index[w.id] = len(self.workers)
            self.workers.append(w)
            self._free += w.is_free
        if workers:
            self._workers_changed()

    def load_done(self, worker_id: int, model: str, ok: bool = True) -> None:
        """A load finished (or failed: the model stays absent); the worker serves again. Ignored for a worker that
        has left meanwhile."""
        i = self._index.get(worker_id)
        if i is None:
            return
        w = self.workers[i]
        resident = w.resident | {model} if ok and w.resident is not None else w.resident
        if w.staging_model == model:
            self._set(i, w, resident=resident, staging_model=None)
        else:
            self._set(i, w, resident=resident, loading_model=None, loading_until_us=None)
        self._workers_changed()
        if not ok:
            log.warning("worker %d: loading %s failed", worker_id, model)
            self._target.pop(worker_id, None)  # do not retry a failed placement in a loop
            # a type left with no worker at all: its queries get an answer now
            self._fail_unserved(Unavailable(f"no healthy worker (loading {model} failed)"))
        self.step()

    def wakeup(self) -> None:
        """A requested wakeup time came; a periodic plan may be due."""
        now = self.clock()
        self._wakeups = {t for t in self._wakeups if t > now}
        for state in self._plannings:
            if state.next_us is not None and now >= state.next_us:
                self._request(state)
        self.step()

    # ------------------------------------------------------------------ plans
    def add_planner(self, planner: Planner) -> None:
        """Plan ``planner.scope`` with ``planner`` from now on: the first plan at once, then every period and on
        bursts. No two planners share a query type or a worker."""
        self._check_scope(planner, planner.scope)
        state = _Planning(planner, self.clock())
        self._plannings.append(state)
        self._request(state)
        self.step()

    def set_scope(self, planner: Planner, workers: Iterable[int]) -> None:
        """The workers ``planner`` plans from now on (one joined or left its part of the pool); its next plan sees
        them. A planner's scope changes only here, where no two planners may come to share a worker."""
        scope = replace(planner.scope, workers=frozenset(workers))
        if scope == planner.scope:
            return
        self._check_scope(planner, scope)
        planner.scope = scope
        self._reroute_due = True
        self._request(self._state(planner), workers_changed=True)
        self.step()

    def _check_scope(self, planner: Planner, scope: Scope) -> None:
        for other in (state.planner.scope for state in self._plannings if state.planner is not planner):
            for mine, theirs, what in ((scope.types, other.types, "query type"), (scope.workers, other.workers,
                                                                                    "worker")):
                if mine is None or theirs is None or mine & theirs:
                    raise ValueError(f"two planners would plan the same {what}: give each its own")

    def request_plan(self, planner: Planner) -> None:
        """Ask ``planner`` for a plan now, on top of its period."""
        self._request(self._state(planner))
        self.step()

    def _request(self, state: _Planning, *, workers_changed: bool = False) -> None:
        """Plan now, unless a plan is already being made: the request is then served by that one, or, when the
        planner's workers changed since it was asked for, by another once it is in."""
        if state.busy:
            state.again |= workers_changed
            return
        now, scope = self.clock(), state.planner.scope
        demand = Demand(state.since_us, now, dict(state.arrivals),
                        tuple(w for w in self.workers if scope.has_worker(w.id)))
        state.arrivals.clear()
        state.since_us, state.busy = now, True
        # an executor that plans inline (the simulator) applies the plan from inside this event: its step waits
        # for the event's own, once everything the event brings is admitted
        self._planning_inline += 1
        try:
            self.executor.plan(state.planner, now, demand)
        finally:
            self._planning_inline -= 1

    def _types_of(self, state: _Planning) -> list[QueryType]:
        return [qt for qt in self._type_list if state.planner.scope.has_type(qt.name)]

    def _state(self, planner: Planner) -> _Planning:
        return next(state for state in self._plannings if state.planner is planner)

    def plan_failed(self, planner: Planner) -> None:
        """The planner raised: its current plan stays, and its next one is asked for a period later."""
        state = self._state(planner)
        state.busy = state.again = False
        state.next_us = self.clock() + planner.period_us
        self._wake(state.next_us)

    def apply_plan(self, planner: Planner, plan: Plan) -> None:
        """A plan is in force: the planner's workers move to its placement as they become free; its types'
        policies route by it."""
        state = self._state(planner)
        state.busy = False
        now, scope = self.clock(), planner.scope
        stray = sorted(wid for wid in plan.placement if wid in self._index and not scope.has_worker(wid))
        if stray:  # the plan is refused whole: the current one stays
            state.next_us = now + planner.period_us
            self._wake(state.next_us)
            self._fault(self._types_of(state), type(planner).__name__, PolicyError(
                f"plan places models on worker(s) {stray}, which its planner does not own"))
            self.step()
            return
        state.plan = plan
        for wid, models in plan.placement.items():
            if wid in self._index:  # else it left the pool while the plan was made (remove_workers)
                self._target[wid] = frozenset(models)
        for model, count in plan.instances.items():
            if self._instances.get(model) != count:
                self._instances[model] = count
                self.executor.scale(model, count, [w for w in self.workers if scope.has_worker(w.id)])
        for qt in self._types_of(state):
            try:
                qt.policy.observe_plan(now, plan)
            except Exception as exc:
                self._fault((qt,), qt.policy.name, exc)
        self._reroute_due = True
        state.next_us = now + planner.period_us
        self._wake(state.next_us)
        if state.again:  # its workers changed while this plan was made: it is in force, and another is asked for
            state.again = False
            self._request(state)
        self.step()

    def plan_of(self, query_type: str) -> Plan | None:
        """The plan in force for a query type (None: unplanned, or no plan yet)."""
        return next((state.plan for state in self._plannings if state.planner.scope.has_type(query_type)), None)

    # ------------------------------------------------------------------ the loop
    def step(self) -> None:
        """Let every policy decide until none has anything left to do; carry out each decision. Inside another
        event (a plan applied inline while an arrival is admitted), the event's own step does it once."""
        if self._planning_inline:
            return
        now = self.clock()
        if self._target:
            self._move_to_target(now)
        if self._reroute_due:
            self._reroute(now)
        progress = self._free > 0  # a policy acts on a free worker: with none, there is nothing to decide
        while progress:
            progress = False
            for qt in self._by_head_deadline():
                if not qt.queue:
                    break  # the rest are idle too: an empty queue sorts last
                try:
                    decision = qt.policy.decide(now, qt.view, self._workers_for(qt))
                    self.num_decisions += 1
                    if self.on_decide is not None:
                        self.on_decide(qt.name, qt.policy.name)
                    if decision.wakeup_us is not None and decision.wakeup_us > now:
                        self._wake(decision.wakeup_us)
                    if not decision.is_empty:
                        self._apply(qt, decision, now)
                except Exception as exc:
                    self._fault((qt,), qt.policy.name, exc)
                    progress = self._free > 0  # its queue is empty now; the other types decide on
                    continue
                if not decision.is_empty:
                    progress = self._free > 0
                    if not progress:
                        break

    def _by_head_deadline(self) -> list[QueryType]:
        if len(self._type_list) == 1:
            return self._type_list
        return sorted(self._type_list, key=lambda t: t.queue.peek().deadline_us if t.queue else 1 << 62)

    def _apply(self, qt: QueryType, decision: Decision, now: int) -> None:
        for d in decision.dispatches:
            i = self._index.get(d.worker_id)
            if i is None:
                raise PolicyError(f"{qt.policy.name}: no worker {d.worker_id}")
            worker = self.workers[i]
            if not worker.is_free:
                raise PolicyError(f"{qt.policy.name}: worker {d.worker_id} is not free")
            if not d.query_ids:
                raise PolicyError(f"{qt.policy.name}: empty batch for worker {d.worker_id}")
            model = qt.models.get(d.variant_id)
            if model is None or not worker.holds(model):
                raise PolicyError(f"{qt.policy.name}: variant {d.variant_id!r} is not resident on worker {worker.id}")
            queries = tuple(qt.remove(d.query_ids))
            expected = qt.policy.latency.us(d.variant_id, len(queries), worker.device)
            batch = Batch(d, queries, now, expected, worker.device, qt.accuracy)
            self._set(i, worker, busy_until_us=now + expected)
            self._running[worker.id] = batch
            for q in queries:
                self._attempts[q.id] = self._attempts.get(q.id, 0) + 1
            self.executor.run_batch(batch)
        if decision.dropped:
            error = DeadlineExceeded(f"dropped by {qt.policy.name}: no variant can meet its deadline any more")
            for q in qt.remove(decision.dropped):
                self._end(q, Outcome.DROPPED, now, error=error)
        for u in decision.unloads:
            self._unload(u)
        for load in decision.loads:
            self._load(load, now)

    def _load(self, load: Load, now: int) -> None:
        i = self._index.get(load.worker_id)
        if i is None or not self.workers[i].is_free:
            raise PolicyError(f"cannot load {load.model!r}: worker {load.worker_id} is missing or not free")
        worker = self.workers[i]
        expected = self.executor.load(worker, load.model)
        self._set(i, worker, loading_model=load.model, loading_until_us=now + expected)
        self._workers_changed()

    def _unload(self, unload: Unload) -> None:
        i = self._index.get(unload.worker_id)
        if i is None or unload.worker_id in self._running:
            raise PolicyError(f"cannot unload {unload.model!r}: worker {unload.worker_id} is missing or busy")
        worker = self.workers[i]
        resident = worker.resident if worker.resident is not None else frozenset(self._all_models())
        self._set(i, worker, resident=resident - {unload.model})
        self._workers_changed()
        self.executor.unload(worker, unload.model)

    def _move_to_target(self, now: int) -> None:
        """Carry out the plan's placement, make before break: load what a worker lacks while it keeps serving
        what it holds, one model at a time; once it holds everything the plan wants, unload the rest
        between two batches. A plan change so never leaves a worker without a model to serve."""
        for wid, target in list(self._target.items()):
            i = self._index[wid]
            worker = self.workers[i]
            if not worker.healthy or worker.staging_model is not None or worker.loading_model is not None:
                continue
            resident = worker.resident if worker.resident is not None else frozenset(self._all_models())
            missing = sorted(target - resident)
            if missing:
                self.executor.load(worker, missing[0])
                self._set(i, worker, staging_model=missing[0])
                self._workers_changed()
            elif worker.is_free:
                for model in sorted(resident - target):
                    self._unload(Unload(wid, model))
                del self._target[wid]

    def _set(self, i: int, worker: WorkerState, **changes) -> None:
        """Replace worker ``i``'s state by ``worker`` with ``changes``, keeping count of the free workers."""
        new = replace(worker, **changes)
        self._free += new.is_free - self.workers[i].is_free
        self.workers[i] = new

    def _workers_changed(self) -> None:
        self._views.clear()
        self._reroute_due = True

    def _route(self, qt: QueryType, query: Query, now: int, *, again: bool) -> None:
        """Queue ``query`` (already in the type's queue) where the type's policy routes it, or end it if dropped."""
        assert qt.routes is not None
        ask = qt.policy.reroute if again else qt.policy.route
        target = ask(now, query, qt.view, self._workers_for(qt))
        if target is DROP:
            qt.queue.remove([query.id])
            self._end(query, Outcome.DROPPED, now, error=DeadlineExceeded(
                f"dropped by {qt.policy.name}: it can no longer meet its deadline"))
            return
        if target is not None and target not in self._index:
            raise PolicyError(f"{qt.policy.name}: routed query {query.id} to unknown worker {target}")
        qt.routes.push(query, target)

    def _reroute(self, now: int) -> None:
        """Route again the queries of every worker its type's policy no longer keeps, and those held unrouted."""
        self._reroute_due = False
        for qt in self._type_list:
            routes = qt.routes
            if routes is None or not routes.where:
                continue
            try:
                for wid in routes.workers():
                    i = self._index.get(wid) if wid is not None else None
                    if i is not None and qt.policy.keeps(self.workers[i]):
                        continue
                    for q in routes.take(wid):
                        self._route(qt, q, now, again=True)
            except Exception as exc:
                self._fault((qt,), qt.policy.name, exc)

    def _all_models(self) -> set[str]:
        return {m for qt in self.types.values() for m in qt.models.values()}

    # ------------------------------------------------------------------ admission, workers, endings
    def _refusal(self, qt: QueryType, query: Query) -> RequestError | None:
        if not self._view(qt)[1]:
            return Unavailable("no healthy worker")
        limit = qt.limits.queue_limit
        if limit is not None and len(qt.queue) >= limit:
            return Unavailable(f"queue full ({limit} requests queued)")
        if query.stage == 0:  # a client's SLO below the quickest option on any worker cannot be met
            cached = self._quickest.get(qt.name)  # quickest_us(), inline: it is asked on every arrival
            quickest = cached[1] if cached is not None and cached[0] == qt.policy.latency.version else \
                self.quickest_us(qt.name)
            if query.deadline_us - query.arrival_us < quickest:
                return SloInfeasible(f"slo_us {query.deadline_us - query.arrival_us} is below the fastest variant's "
                                     f"batch-1 latency ({quickest} us): no variant can meet it")
            if qt.limits.admission and qt.queue:
                return self._infeasible(qt, query)
        return None

    def _infeasible(self, qt: QueryType, query: Query) -> RequestError | None:
        """Refuse a query that the queries queued ahead of it (earlier deadlines) already make infeasible.

        The bound is optimistic, so that only a query no schedule could serve is refused: every healthy
        worker of the type starts at once (the batches running now are ignored) and runs, back to back,
        the option (variant, batch size) that serves the most queries by the deadline. Under sustained
        overload an EDF queue otherwise grows until every query in it waits almost its whole SLO, and
        nearly all end late or dropped after they queued (issue 26: 3.6% of capacity met at 3x load);
        refused at once, a client can try elsewhere, and the queries admitted are the ones that can make it.
        """
        slack_us = query.deadline_us - query.arrival_us
        if query.deadline_us >= qt.latest_deadline_us:
            ahead = len(qt.queue)  # the usual case (one SLO): every queued query is ahead
        else:
            ahead = qt.queue.count_due_by(query.deadline_us)
        capacity = sum(n * self._served_within(qt, device, slack_us) for device, n in self._devices(qt).items())
        if ahead < capacity:
            return None
        return Overloaded(f"{ahead} requests are queued ahead of this one, and the workers can serve at most "
                          f"{capacity} in its slo_us of {slack_us}: it cannot be met")

    def _served_within(self, qt: QueryType, device: str, slack_us: int) -> int:
        """The most queries one worker of ``device`` can finish within ``slack_us``, or a little more (cached per
        millisecond, rounded up, so that the bound stays optimistic)."""
        latency = qt.policy.latency
        window_ms = -(-slack_us // 1000)
        key = (qt.name, device, latency.version, window_ms)
        served = self._capacity.get(key)
        if served is None:
            window_us = window_ms * 1000
            served = max((b * (window_us // us) for v in qt.policy.profile.variants if device in v.latency
                          for b in v.latency[device].batch_sizes
                          if 0 < (us := latency.us(v.id, b, device)) <= window_us), default=0)
            if len(self._capacity) > 4096:  # many SLOs or latency versions: start again
                self._capacity.clear()
            self._capacity[key] = served
        return served

    def _devices(self, qt: QueryType) -> dict[str, int]:
        """Healthy workers of the type per device kind."""
        mine = self._view(qt)[0]
        devices: dict[str, int] = {}
        for w in self.workers if mine is None else (self.workers[i] for i in mine):
            if w.healthy:
                devices[w.device] = devices.get(w.device, 0) + 1
        return devices

    def quickest_us(self, query_type: str) -> int:
        """The quickest option of a query type on any device kind in the pool (batch 1)."""
        qt = self.types[query_type]
        version = qt.policy.latency.version
        cached = self._quickest.get(query_type)
        if cached is None or cached[0] != version:
            devices = {w.device for w in self.workers} or {qt.policy.device}
            cached = self._quickest[query_type] = (version, min(qt.policy.quickest_us(d) for d in devices))
        return cached[1]

    def _workers_for(self, qt: QueryType) -> list[WorkerState]:
        """The workers that hold one of the type's models, or are loading one (all of them when none is placed)."""
        mine = self._view(qt)[0]
        return self.workers if mine is None else [self.workers[i] for i in mine]

    def _num_healthy(self, qt: QueryType) -> int:
        return self._view(qt)[1]

    def _view(self, qt: QueryType) -> tuple[list[int] | None, int]:
        view = self._views.get(qt.name)
        if view is None:
            models = set(qt.models.values())
            mine = [i for i, w in enumerate(self.workers) if w.resident is None or models & w.resident
                    or w.loading_model in models or w.staging_model in models]
            view = self._views[qt.name] = (None if len(mine) == len(self.workers) else mine,
                                           sum(self.workers[i].healthy for i in mine))
        return view

    def _release(self, batch: Batch) -> bool:
        """Free the batch's worker; False if the batch is stale (its worker was lost and it was retried)."""
        if self._running.get(batch.worker_id) is not batch:
            return False
        del self._running[batch.worker_id]
        i = self._index[batch.worker_id]
        self._set(i, self.workers[i], busy_until_us=None)
        return True

    def _requeue(self, queries: Iterable[Query], error: AccscaleError) -> None:
        now = self.clock()
        for q in queries:
            qt = self.types[q.type]
            # a query past its deadline is retried too: its policy drops it or serves it late, as it
            # does any late query (late_queries)
            if self._attempts.get(q.id, 0) < qt.limits.max_attempts and self._num_healthy(qt):
                qt.queue.push(q)  # retried on another worker
                if qt.routes is not None:
                    try:
                        self._route(qt, q, now, again=True)
                    except Exception as exc:
                        self._fault((qt,), qt.policy.name, exc)
            else:
                self._end(q, Outcome.FAILED, now, error=Unavailable(
                    f"{error} (after {self._attempts.get(q.id, 0)} attempt(s))"))

    def _fault(self, types: Iterable[QueryType], culprit: str, exc: Exception) -> None:
        """A policy or planner raised: its own types' queued queries fail with InternalError, and the other types
        keep serving (a deployment of five systems loses one, not five); without a fault handler, it propagates."""
        if self.on_fault is None:
            raise exc
        log.error("%s failed; failing the queued requests of %s", culprit, [qt.name for qt in types],
                  exc_info=exc)
        error = InternalError(f"scheduling failed in {culprit}: {type(exc).__name__}: {exc}")
        for qt in types:
            self._fail_queued(qt, error)
            self.on_fault(qt.name, culprit, exc)

    def fail_queued(self, error: AccscaleError) -> None:
        """End every queued query with ``error`` (the driver's answer to a bug in the engine itself)."""
        for qt in self.types.values():
            self._fail_queued(qt, error)

    def _fail_queued(self, qt: QueryType, error: AccscaleError) -> None:
        now = self.clock()
        for q in qt.remove([q.id for q in qt.queue.scan()]):
            self._end(q, Outcome.FAILED, now, error=error)

    def _end(self, query: Query, outcome: Outcome, now: int | None = None, variant_id: str | None = None,
             accuracy: float | None = None, batch_size: int = 0, *, output: object = None,
             error: AccscaleError | None = None) -> QueryRecord:
        self._attempts.pop(query.id, None)
        record = QueryRecord(query.id, query.arrival_us, query.deadline_us, self.clock() if now is None else now,
                             outcome, variant_id, accuracy, batch_size, query.type, query.parent)
        self.on_end(record, output, error)
        return record

    def _wake(self, time_us: int) -> None:
        if time_us not in self._wakeups:
            self._wakeups.add(time_us)
            self.executor.wake_at(time_us)

    # ------------------------------------------------------------------ what the drivers read
    def set_policy(self, query_type: str, policy: Policy) -> Policy:
        """Switch a type's policy in place (its queue is kept); returns the old one."""
        qt = self.types[query_type]
        old, queued = qt.policy, list(qt.queue.scan())
        qt.use(policy)
        self._quickest.pop(query_type, None)
        self._views.pop(query_type, None)  # its models are the new profile's
        now = self.clock()
        plan = self.plan_of(query_type)
        try:
            if plan is not None:
                policy.observe_plan(now, plan)
            if qt.routes is not None:  # the new policy routes every query afresh
                for q in queued:
                    self._route(qt, q, now, again=True)
        except Exception as exc:
            self._fault((qt,), policy.name, exc)
        self.step()
        return old

    @property
    def placing(self) -> bool:
        """A plan is being made, or its placement is not carried out yet."""
        return any(state.busy for state in self._plannings) or bool(self._target)

    def workers_of(self, query_type: str) -> list[WorkerState]:
        """The workers a query type's policy sees."""
        return self._workers_for(self.types[query_type])

    def queued(self, query_type: str | None = None) -> int:
        if query_type is not None:
            return len(self.types[query_type].queue)
        return sum(len(t.queue) for t in self.types.values())

    def running(self) -> Mapping[int, Batch]:
        return self._running


__all__ = ["SIMULATED", "EndHandler", "Engine", "Executor", "FaultHandler", "TypeLimits", "QueryType"]
