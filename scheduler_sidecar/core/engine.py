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

The engine calls four parts, each the one owner of its state: the worker table (every worker's state and which
are free, :mod:`.worker_table`), admission (what is refused on arrival, :mod:`.admission`), placement (which
models each worker holds, moved make before break, :mod:`.placement`) and routing (where a routing policy's
queries wait, :mod:`.routing`). It keeps the queues, the running batches, the plans and the one record per query.

A policy or planner that raises is contained when the driver gives a fault handler (live): only its own types'
queued queries fail, with InternalError. Without one (the simulator) the bug surfaces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from scheduler_sidecar.core.admission import Admission
from scheduler_sidecar.core.placement import Placement
from scheduler_sidecar.core.plan import Demand, Plan, Planner, Scope
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.queue import EdfQueue, QueueView, WorkerQueues
from scheduler_sidecar.core.records import (
    Batch,
    BatchResult,
    Decision,
    Outcome,
    Query,
    QueryRecord,
    WorkerState,
)
from scheduler_sidecar.core.routing import Routing
from scheduler_sidecar.core.worker_table import WorkerTable
from scheduler_sidecar.errors import (
    AccscaleError,
    DeadlineExceeded,
    InternalError,
    PolicyError,
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
    # refuse an arrival that the queries queued ahead of it already make infeasible (see core.admission)
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
        self.model_set = frozenset(self.models.values())
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
        self.table = WorkerTable(workers)  # the one owner of the workers' states
        self.executor, self.clock, self.on_end = executor, clock, on_end
        self.on_decide = on_decide  # (query type, policy name) after each decide() call: metrics
        # a policy or planner that raises fails only its own types' queued queries, and this hears of it (live);
        # None: the exception propagates (the simulator, where a bug must surface)
        self.on_fault = on_fault
        self._faulted: set[tuple[str, tuple[str, ...]]] = set()  # (culprit, its types) whose traceback was logged
        self._plannings: list[_Planning] = []  # one per planner (add_planner), each over its scope
        # whether the planners count arrivals as demand: live, the sidecar's warm-up requests at start are not
        # clients' (counted, 8 at once made Loki's controller plan for a demand no client sent)
        self.counting_demand = True
        self.num_decisions = 0
        self._running: dict[int, Batch] = {}  # worker id -> its running batch
        self._attempts: dict[int, int] = {}  # query id -> dispatches so far (only while it is not done)
        self._wakeups: set[int] = set()  # times the executor will call wakeup()
        self._planning_inline = 0  # depth of executor.plan calls under way (see step)
        self.admission = Admission(self.table)
        self.placement = Placement(self.table, executor, self._running, self._all_models, self._workers_changed)
        self.routing = Routing(self.table, self._dropped)

    # ------------------------------------------------------------------ events from the driver
    def arrive(self, *queries: Query, decide: bool = True) -> None:
        """Admit queries that arrived together (each, or end it as rejected), then let the policies decide once;
        with ``decide`` false, at the next event that decides instead (more of the same burst is still arriving)."""
        for query in queries:
            self._admit(query)
        if decide:
            self.step()

    def _admit(self, query: Query) -> None:
        qt = self.types.get(query.type)
        if qt is None:
            self._end(query, Outcome.REJECTED, error=UnknownModel(
                f"unknown query type {query.type!r}; this pool serves {sorted(self.types)}"))
            return
        now = query.arrival_us
        error = self.admission.refusal(qt, query)
        if error is not None:
            self._end(query, Outcome.REJECTED, now, error=error)
            return
        qt.queue.push(query)
        qt.latest_deadline_us = max(qt.latest_deadline_us, query.deadline_us)
        try:
            if qt.routes is not None:
                self.routing.route(qt, query, now, again=False)
            qt.policy.observe_arrival(now, query)
        except Exception as exc:
            self._fault((qt,), qt.policy.name, exc)
            return
        for state in self._plannings if self.counting_demand else ():
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
        absent from it leaves, a new one joins, and each keeps or changes its health as the set says; then the
        policies decide once. A full set cannot be applied out of order, as a stream of adds and removes can.

        A worker that leaves serves nothing more and goes once the batch it runs, if any, has ended; that batch's
        queries are answered as usual, or retried elsewhere if it fails. So a worker drained this way loses no
        query. A worker id is never taken again."""
        desired = {w.id: w for w in serving}
        joining = [w for wid, w in desired.items() if wid not in self.table.index]
        leaving = [wid for wid in self.table.index if wid not in desired and wid not in self.table.leaving]
        self._add(joining)
        # comebacks first, then losses, then leaves: a type that loses its last worker may get another in the same set
        back = {wid for wid, w in sorted(desired.items(), key=lambda item: not item[1].healthy)
                if self._health(wid, w.healthy) and w.healthy}
        self._remove(leaving)
        self._replan({w.id for w in joining} | set(leaving) | back)
        self.step()

    def _replan(self, worker_ids: set[int]) -> None:
        """A planner whose workers joined, left or came back plans again at once: its plan names workers by id, and a
        worker that joined or came back serves nothing of a planned type, or one that left takes its routed queries
        with it, until it does (a planner's period can be seconds). Decision: a worker that goes down does not
        re-plan; its queries are routed to the plan's other workers. A re-plan then moves models while a worker
        short, and the pinned failure runs lost more by it (violations: loki-fail 21.35% -> 22.16%, proteus-fail
        9.36% -> 9.62%)."""
        for state in self._plannings:
            if any(state.planner.scope.has_worker(wid) for wid in worker_ids):
                self._request(state, workers_changed=True)

    def set_health(self, worker_id: int, healthy: bool) -> None:
        """A worker went down (its running batch is retried elsewhere) or came back. A worker that has left (or is
        leaving, see :meth:`update_workers`) never comes back; its loss is still a loss."""
        if self._health(worker_id, healthy) and healthy:
            self._replan({worker_id})
        self.step()

    def _health(self, worker_id: int, healthy: bool) -> bool:
        """Whether the worker's health changed (a serving worker's, not a leaving one's)."""
        table = self.table
        i = table.index.get(worker_id)
        if i is None or (healthy and worker_id in table.leaving):
            return False
        worker = table.workers[i]
        # a leaving worker is already down; that it died matters only for the batch it was finishing
        died_leaving = not healthy and worker_id in table.leaving and worker_id in self._running
        if worker.healthy == healthy and not died_leaving:
            return False
        table.set(i, worker, healthy=healthy, busy_until_us=None, loading_model=None, loading_until_us=None,
                  staging_model=None)
        self._workers_changed()
        batch = self._running.pop(worker_id, None)
        if batch is not None:
            self._requeue(batch.queries, WorkerLost(f"worker {worker_id} was lost while running its batch",
                                                    worker=str(worker_id), queries=batch.query_ids))
        self._drop_left()
        if not healthy:
            self._fail_unserved(Unavailable("no healthy worker"))
        return not died_leaving

    def _remove(self, worker_ids: Iterable[int]) -> None:
        worker_ids = list(worker_ids)
        if not worker_ids:
            return
        for wid in worker_ids:
            i = self.table.index[wid]
            self.table.set(i, self.table.workers[i], healthy=False, loading_model=None, loading_until_us=None,
                           staging_model=None)
            self.table.leaving.add(wid)
        self._workers_changed()
        self._drop_left()
        self._fail_unserved(Unavailable("no healthy worker"))

    def _drop_left(self) -> None:
        """Forget the leaving workers that run no batch any more."""
        gone = {wid for wid in self.table.leaving if wid not in self._running}
        if not gone:
            return
        self.table.retire(gone)
        for wid in gone:
            self.placement.abandon(wid)
        self._workers_changed()

    def has_worker(self, worker_id: int) -> bool:
        """Whether the worker is (still) in the pool: added, and not yet gone after it left (it may be draining)."""
        return worker_id in self.table.index

    def _fail_unserved(self, error: AccscaleError) -> None:
        """End the queued queries of every type left without a healthy worker: none could serve them."""
        for qt in self.types.values():
            if not self.table.view(qt.name, qt.model_set)[1]:
                self._fail_queued(qt, error)

    def _add(self, workers: Iterable[WorkerState]) -> None:
        workers = list(workers)
        self.table.add(workers)
        if workers:
            self._workers_changed()

    def load_done(self, worker_id: int, model: str, ok: bool = True) -> None:
        """A load finished (or failed: the model stays absent); the worker serves again. Ignored for a worker that
        has left meanwhile."""
        if not self.placement.loaded(worker_id, model, ok):
            return
        if not ok:
            log.warning("worker %d: loading %s failed", worker_id, model)
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
        self.routing.due = True
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
        leaving = self.table.leaving  # draining: no plan may count on them
        demand = Demand(state.since_us, now, dict(state.arrivals),
                        tuple(w for w in self.workers if scope.has_worker(w.id) and w.id not in leaving))
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
        again, state.busy, state.again = state.again, False, False
        state.next_us = self.clock() + planner.period_us
        self._wake(state.next_us)
        if again:  # its workers changed while the failed plan was made: that one more try is not lost
            self._request(state)
            self.step()

    def apply_plan(self, planner: Planner, plan: Plan) -> None:
        """A plan is in force: the planner's workers move to its placement as they become free; its types'
        policies route by it."""
        state = self._state(planner)
        state.busy = False
        now, scope = self.clock(), planner.scope
        table = self.table
        # a worker that left meanwhile (or is draining) is no stray: the plan was made while it was the planner's
        stray = sorted(wid for wid in plan.placement
                       if wid in table.index and wid not in table.leaving and not scope.has_worker(wid))
        if stray:  # the plan is refused whole: the current one stays
            state.next_us = now + planner.period_us
            self._wake(state.next_us)
            self._fault(self._types_of(state), type(planner).__name__, PolicyError(
                f"plan places models on worker(s) {stray}, which its planner does not own"))
            if state.again:
                state.again = False
                self._request(state)
            self.step()
            return
        state.plan = plan
        self.placement.place(plan, scope)
        for qt in self._types_of(state):
            try:
                qt.policy.observe_plan(now, plan)
            except Exception as exc:
                self._fault((qt,), qt.policy.name, exc)
        self.routing.due = True
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
        if self.placement.target:
            self.placement.move()
        if self.routing.due:
            self._reroute(now)
        table = self.table
        progress = table.free > 0  # a policy acts on a free worker: with none, there is nothing to decide
        while progress:
            progress = False
            for qt in self._by_head_deadline():
                if not qt.queue:
                    break  # the rest are idle too: an empty queue sorts last
                try:
                    decision = qt.policy.decide(now, qt.view, table.serving(qt.name, qt.model_set))
                    self.num_decisions += 1
                    if self.on_decide is not None:
                        self.on_decide(qt.name, qt.policy.name)
                    if decision.wakeup_us is not None and decision.wakeup_us > now:
                        self._wake(decision.wakeup_us)
                    if not decision.is_empty:
                        self._apply(qt, decision, now)
                except Exception as exc:
                    self._fault((qt,), qt.policy.name, exc)
                    progress = table.free > 0  # its queue is empty now; the other types decide on
                    continue
                if not decision.is_empty:
                    progress = table.free > 0
                    if not progress:
                        break

    def _by_head_deadline(self) -> list[QueryType]:
        if len(self._type_list) == 1:
            return self._type_list
        return sorted(self._type_list, key=lambda t: t.queue.peek().deadline_us if t.queue else 1 << 62)

    def _apply(self, qt: QueryType, decision: Decision, now: int) -> None:
        table = self.table
        for d in decision.dispatches:
            i = table.index.get(d.worker_id)
            if i is None:
                raise PolicyError(f"{qt.policy.name}: no worker {d.worker_id}")
            worker = table.workers[i]
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
            table.set(i, worker, busy_until_us=now + expected)
            self._running[worker.id] = batch
            for q in queries:
                self._attempts[q.id] = self._attempts.get(q.id, 0) + 1
            self.executor.run_batch(batch)
        if decision.dropped:
            error = DeadlineExceeded(f"dropped by {qt.policy.name}: no variant can meet its deadline any more")
            for q in qt.remove(decision.dropped):
                self._end(q, Outcome.DROPPED, now, error=error)
        for u in decision.unloads:
            self.placement.unload(u)
        for load in decision.loads:
            self.placement.load(load, now)

    def _workers_changed(self) -> None:
        self.table.changed()
        self.routing.due = True

    def _dropped(self, qt: QueryType, query: Query, now: int) -> None:
        """A routing policy gave up on a query as it routed it (Loki's early dropping)."""
        self._end(query, Outcome.DROPPED, now, error=DeadlineExceeded(
            f"dropped by {qt.policy.name}: it can no longer meet its deadline"))

    def _reroute(self, now: int) -> None:
        """Route again the queries of every worker its type's policy no longer keeps, and those held unrouted."""
        self.routing.due = False
        for qt in self._type_list:
            if qt.routes is None:
                continue
            try:
                self.routing.reroute(qt, now)
            except Exception as exc:
                self._fault((qt,), qt.policy.name, exc)

    def _all_models(self) -> set[str]:
        return {m for qt in self.types.values() for m in qt.models.values()}

    # ------------------------------------------------------------------ workers and endings
    def is_running(self, batch: Batch) -> bool:
        """Whether ``batch`` is still the one its worker runs (not stale: its worker was not lost meanwhile)."""
        return self._running.get(batch.worker_id) is batch

    def _release(self, batch: Batch) -> bool:
        """Free the batch's worker; False if the batch is stale (its worker was lost and it was retried)."""
        if not self.is_running(batch):
            return False
        del self._running[batch.worker_id]
        i = self.table.index[batch.worker_id]
        self.table.set(i, self.table.workers[i], busy_until_us=None)
        return True

    def _requeue(self, queries: Iterable[Query], error: AccscaleError) -> None:
        now = self.clock()
        for q in queries:
            qt = self.types[q.type]
            # a query past its deadline is retried too: its policy drops it or serves it late, as it
            # does any late query (late_queries)
            if self._attempts.get(q.id, 0) < qt.limits.max_attempts and self.table.view(qt.name, qt.model_set)[1]:
                qt.queue.push(q)  # retried on another worker
                if qt.routes is not None:
                    try:
                        self.routing.route(qt, q, now, again=True)
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
        names = [qt.name for qt in types]
        key = (culprit, tuple(names))
        if key not in self._faulted:  # a bug that raises on every decision logs its traceback once (the metric counts)
            self._faulted.add(key)
            log.error("%s failed; failing the queued requests of %s", culprit, names, exc_info=exc)
        else:
            log.debug("%s failed again (%s: %s)", culprit, type(exc).__name__, exc)
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
        self.admission.forget(query_type)
        self.table.forget_type(query_type)  # its models are the new profile's
        now = self.clock()
        plan = self.plan_of(query_type)
        try:
            if plan is not None:
                policy.observe_plan(now, plan)
            if qt.routes is not None:  # the new policy routes every query afresh
                for q in queued:
                    self.routing.route(qt, q, now, again=True)
        except Exception as exc:
            self._fault((qt,), policy.name, exc)
        self.step()
        return old

    @property
    def placing(self) -> bool:
        """A plan is being made, or its placement is not carried out yet."""
        return any(state.busy for state in self._plannings) or bool(self.placement.target)

    @property
    def workers(self) -> list[WorkerState]:
        """Every worker in the pool, leaving ones included, as the engine sees it now."""
        return self.table.workers

    def workers_of(self, query_type: str) -> list[WorkerState]:
        """The workers a query type's policy sees."""
        qt = self.types[query_type]
        return self.table.serving(qt.name, qt.model_set)

    def queued(self, query_type: str | None = None) -> int:
        if query_type is not None:
            return len(self.types[query_type].queue)
        return sum(len(t.queue) for t in self.types.values())

    def running(self) -> Mapping[int, Batch]:
        return self._running


__all__ = ["SIMULATED", "EndHandler", "Engine", "Executor", "FaultHandler", "TypeLimits", "QueryType"]
