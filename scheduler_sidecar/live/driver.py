"""The live driver: the engine on the wall clock, with real workers behind the :class:`Worker` seam.

One :class:`LiveDriver` per shared worker pool. Each logical model is a query type of its
engine (:class:`LiveModel` is what the front ends see of it), and every model instance of a
worker is one worker slot shared by all types, so two logical models never run two batches on
one slot at once. The driver supplies the clock and the executor: a dispatched batch becomes
one call on the slot's worker (its ``send``, which calls back, where it has one: the native
worker's; else an awaited ``infer``), with the rows concatenated and the variant's control
row (supernet) or model name (separate models), and its output split back into one answer per
request; a load or unload goes to Triton's model-control API; a plan is solved in a thread, so
a long solve never blocks requests. A logical model's ``follow_up`` hook may turn an answer into
the query of a next step (a cascade's escalation, a pipeline's next stage) on another logical
model; the client then gets the last step's answer, which says the variant that served it.

Latency calibration (``ModelSpec.latency_calibration``, on by default). A profile is measured
on an idle worker; under load, on a shared CPU, batches can run well over their profiled p50,
and a policy that trusts the profile then plans batches that miss their deadlines. The driver
gives each batch's measured service time to :class:`~scheduler_sidecar.core.latency.Calibration`,
which scales the latency table the policy reads when the batches' times move from the factor in
use (the simulator applies the same rule where it is asked to). The policy object, and whatever
state it keeps, stays.

Every request ends exactly once (the engine's records): answered (met or late), dropped by the
policy (DEADLINE_EXCEEDED), refused on arrival (INVALID_ARGUMENT/UNAVAILABLE), or failed. A
batch whose worker is lost goes back to the queue while its requests have attempts left. A
request whose client leaves is taken off the queue (or its answer discarded if it is running).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from scheduler_sidecar.core.engine import Engine, QueryType, TypeLimits
from scheduler_sidecar.core.latency import Calibration
from scheduler_sidecar.core.plan import Demand, Planner
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.profile import Profile, Variant
from scheduler_sidecar.core.records import Batch, BatchResult, Outcome, Query, QueryRecord, WorkerState
from scheduler_sidecar.errors import (
    AccscaleError,
    Code,
    InternalError,
    Overloaded,
    RequestError,
    Unavailable,
    WorkerError,
    WorkerFailed,
    WorkerLost,
)
from scheduler_sidecar.live.membership import Membership
from scheduler_sidecar.live.tensors import TensorSpec
from scheduler_sidecar.live.workers import InferCall, Worker

log = logging.getLogger(__name__)

CONTROL_INPUT = "CONTROL"  # the supernet models' control tensor, filled in by the sidecar
RPC_GRACE_S = 2.0  # a worker RPC may run this long past its batch's last deadline before it is abandoned
DEFAULT_LOAD_US = 2_000_000  # expected model load time until one has been measured, where no profile states one


def now_us() -> int:
    return time.monotonic_ns() // 1000


@dataclass(frozen=True)
class ModelOptions:
    """What the driver needs of a logical model's configuration."""

    name: str
    default_slo_us: int = 50_000
    limits: TypeLimits = TypeLimits()  # queue limit, attempts and admission
    latency_calibration: bool = True


class Answer(NamedTuple):
    """What served one query, and its output rows (raw bytes per output name). A named tuple: one is made per
    query, and a frozen dataclass sets each field through ``object.__setattr__``."""

    outputs: dict[str, bytes]
    variant_id: str
    accuracy: float
    queue_us: int  # arrival to dispatch (of the step that answered: a cascade's earlier steps count as queued)
    service_us: int  # dispatch to the worker's answer
    batch_size: int
    worker: str  # the worker's URL
    slot: int  # the worker slot (one model instance of a worker) that ran the batch

    def parameters(self) -> dict[str, object]:
        """Response parameters: what served the request and where its time went."""
        return {"variant": self.variant_id, "accuracy": self.accuracy, "queue_us": self.queue_us,
                "service_us": self.service_us, "batch_size": self.batch_size, "worker": self.worker,
                "slot": self.slot}

    @staticmethod
    def join(answers: Sequence[Answer]) -> Answer:
        """The answer to a request of several rows: the rows' outputs in order, the variants and workers that
        served them (each once, in row order, comma-separated), their mean accuracy, the longest queue and
        service times, the largest batch, and the slot if one slot ran them all (-1 otherwise)."""
        if len(answers) == 1:
            return answers[0]
        first = answers[0]
        return Answer({name: b"".join(a.outputs[name] for a in answers) for name in first.outputs},
                      ",".join(dict.fromkeys(a.variant_id for a in answers)),
                      sum(a.accuracy for a in answers) / len(answers), max(a.queue_us for a in answers),
                      max(a.service_us for a in answers), max(a.batch_size for a in answers),
                      ",".join(dict.fromkeys(a.worker for a in answers)),
                      first.slot if all(a.slot == first.slot and a.worker == first.worker for a in answers) else -1)


class LiveModel:
    """One logical model (a query type) of the driver: its tensors, variants and :meth:`infer`."""

    def __init__(self, options: ModelOptions, profile: Profile, inputs: tuple[TensorSpec, ...],
                 outputs: tuple[TensorSpec, ...], stats) -> None:
        for v in profile.variants:
            if v.actuation.kind not in ("supernet", "model", "pipeline"):
                raise ValueError(f"profile {profile.name}: variant {v.id!r} is a {v.actuation.kind!r} variant; "
                                 "the sidecar serves supernet, model and pipeline variants")
        self.options = options
        self.name = options.name
        self.profile = profile
        self.inputs = {t.name: t for t in inputs}
        self.outputs = {t.name: t for t in outputs}
        self.stats = stats  # server.metrics.ModelMetrics, or a stand-in with the same methods
        self.variants = {v.id: v for v in profile.variants}
        self.control = {v.id: np.asarray(v.actuation.control, np.int32).tobytes()
                        for v in profile.variants if v.actuation.kind == "supernet"}
        self.driver: LiveDriver | None = None
        # a cascade's escalation or a pipeline's next stage: (a query's input rows, its output rows, its time left
        # in us) -> (the logical model of the next step, its input rows), or None when this answer is final
        self.follow_up: Callable[[dict[str, bytes], dict[str, bytes], int],
                                 tuple[str, dict[str, bytes]] | None] | None
        self.follow_up = None

    @property
    def policy(self) -> Policy:
        assert self.driver is not None
        return self.driver.engine.types[self.name].policy

    async def infer(self, inputs: dict[str, bytes], slo_us: int, budget_us: int | None = None) -> Answer:
        """Serve one row."""
        return (await self.infer_rows([inputs], slo_us, budget_us))[0]

    async def infer_rows(self, rows: Sequence[dict[str, bytes]], slo_us: int,
                         budget_us: int | None = None, waited_us: int = 0) -> list[Answer]:
        """Serve a request of several rows (see :meth:`LiveDriver.infer`)."""
        assert self.driver is not None
        return await self.driver.infer(self, rows, slo_us, budget_us, waited_us)

    def call(self, variant: Variant, inputs: list[dict[str, bytes]],
             parameters: tuple[tuple[str, object], ...] = ()) -> InferCall:
        """The worker call that runs ``variant`` on these rows, with the dispatch's ``parameters``."""
        act = variant.actuation
        tensors = [(spec, tuple(row[spec.name] for row in inputs)) for spec in self.inputs.values()]
        if act.kind == "supernet":
            control = TensorSpec(CONTROL_INPUT, "INT32", (len(act.control),))
            tensors.append((control, (self.control[variant.id],) * len(inputs)))
        return InferCall(act.model, act.version or "", tuple(tensors), tuple(self.outputs.values()), parameters)


class Request:
    """One client request in flight, a query per row: answered (``done(answers, None)``) when every row is, or
    failed (``done(None, error)``) by its first row that fails; ``done`` is called once, on the event loop, and
    must not raise. What :meth:`LiveDriver.submit` returns and :meth:`LiveDriver.withdraw` takes."""

    __slots__ = ("answers", "left", "done", "ended", "query_ids", "model")

    def __init__(self, model: str, rows: int, done: Callable[[list[Answer] | None, RequestError | None], None]
                 ) -> None:
        self.model = model
        self.answers: list[Answer | None] = [None] * rows
        self.left = rows
        self.done = done
        self.ended = False
        self.query_ids: list[int] = []

    def end(self, answers: list[Answer] | None, error: RequestError | None) -> None:
        self.ended = True
        try:
            self.done(answers, error)
        except Exception:  # a bug in the caller's callback: it is the caller's, never the engine's event's
            log.exception("answering a request failed")


@dataclass
class _Pending:
    query: Query
    model: LiveModel
    inputs: dict[str, bytes]  # one row per input, raw
    request: Request  # the client's; a follow-up query answers its parent's client
    row: int  # which of the request's rows this query answers
    since_us: int  # the client's request's arrival: a follow-up's answer counts its queue from there
    handed_over: bool = False  # a follow-up query took over the answer


class _Run(NamedTuple):
    """A batch on its way through a worker."""

    batch: Batch
    worker: Worker
    model: LiveModel
    variant: Variant
    live: list[_Pending]  # its queries whose clients are still there, in order
    start_us: int
    last_deadline_us: int


class LiveDriver:
    """The engine of one worker pool on the wall clock (see the module docstring)."""

    def __init__(self, models: Iterable[tuple[LiveModel, Policy]], *, clock: Callable[[], int] = now_us,
                 on_worker_lost: Callable[[Worker, str], None] | None = None,
                 membership: Membership | None = None) -> None:
        pairs = list(models)
        self.models = {m.name: m for m, _ in pairs}
        types = [QueryType(m.name, p, m.options.limits) for m, p in pairs]
        self.clock = clock
        self.started_us = clock()
        # what the plan times in this log count from (bench fidelity aligns a simulation on it)
        log.info("plan times below count from the start: monotonic clock %.6f s", self.started_us / 1e6)
        self.engine = Engine(types, [], self, clock=clock, on_end=self._on_end,
                             on_decide=lambda name, policy: self.models[name].stats.decision(policy),
                             on_fault=lambda name, culprit, exc: self.models[name].stats.fault(culprit))
        for model, _ in pairs:
            model.driver = self
            # read when /metrics is scraped, not set on every request
            model.stats.queue_depth.set_function(lambda name=model.name: self.engine.queued(name))
        # which workers and slots there are: the one owner of that state (the engine is told the full set)
        self.membership = membership or Membership()
        self.on_worker_lost = on_worker_lost or (lambda worker, reason: None)
        self._pending: dict[int, _Pending] = {}
        self._held: list[Query] | None = None  # queries submitted together, not yet arrived (see ``together``)
        self._undecided = False  # a burst's queries were queued early (a withdrawal within it), not decided on yet
        self._ids = itertools.count()
        self._calibration = Calibration()
        # Triton model -> last measured load time (the profile's measured one until then)
        self._load_us = {m: round(ms * 1000) for _, p in pairs for m, ms in p.profile.load_ms().items()}
        self._loads: dict[tuple[str, str], asyncio.Future] = {}  # (Triton, model) -> its load in progress
        self._timers: set[asyncio.TimerHandle] = set()
        self._planner_faults: set[int] = set()  # id() of the planners whose failure's traceback was logged
        self._tasks: set[asyncio.Task] = set()
        self._sent = 0  # batches sent through a worker's ``send`` and not answered yet
        self._settled: asyncio.Future | None = None  # resolved when the last of them is

    # ---------------------------------------------------------------- workers
    def add_worker(self, worker: Worker, slots: int, *, device: str | None = None,
                   resident: frozenset[str] | None = None, owner: int | None = None) -> list[int]:
        """Add ``slots`` worker slots (the worker's model instances) for ``owner``'s models (a planner's index, None:
        the unplanned models); returns their ids, which are never reused. The worker joins the membership on its
        first call.

        ``device`` is the slots' device kind (default: the one the first model's policy plans for);
        ``resident`` the Triton models loaded there (default: every model).
        """
        member = next((m for m in self.membership.members.values() if m.worker is worker), None)
        if member is None:  # never a second member for this connection: one that left stays left (add_slots says so)
            member = self.membership.join(worker, device=device)
        elif device is not None and member.device != device:
            raise ValueError(f"worker {worker.url} is of device kind {member.device!r}, not {device!r}")
        ids = self.membership.add_slots(member, slots, owner=owner, resident=resident)
        self.sync()
        return ids

    def remove_worker(self, worker: Worker) -> list[int]:
        """Take the worker's slots out of the pool (it left the deployment); returns their ids. Each finishes the
        batch it runs (:meth:`Engine.update_workers`): :meth:`drained` says when all have."""
        member = self.membership.leave(worker)
        ids = list(member.slots)
        self.sync()
        return ids

    def worker_health(self, worker: Worker, healthy: bool) -> None:
        """The worker went down or came back (the registry may know already: the health checks share it)."""
        self.membership.set_health(worker, healthy)
        self.sync()
        if not healthy:  # a leaving worker is out of the serving set, but the batch it was finishing is lost
            for sid in [sid for sid, slot in self.membership.slots.items()
                        if self.membership.members[slot.member].worker is worker and self.engine.has_worker(sid)]:
                self._guard(self.engine.set_health, sid, False)
            self._forget_drained()

    def sync(self) -> None:
        """Hand the engine the full set of slots that should be serving, then forget the slots that have drained."""
        default = next(iter(self.engine.types.values())).policy.device
        self._guard(self.engine.update_workers, [
            WorkerState(slot.id, healthy=member.healthy, device=member.device or default, resident=slot.resident)
            for slot, member in self.membership.serving()])
        self._forget_drained()

    def _forget_drained(self) -> None:
        """Forget the slots of leaving workers that the engine has let go (their last batch has ended)."""
        members = self.membership.members
        self.membership.forget({sid for sid, slot in self.membership.slots.items()
                                if members[slot.member].leaving and not self.engine.has_worker(sid)})

    async def drained(self, ids: Sequence[int], poll_s: float = 0.05) -> None:
        """Wait until the removed slots ``ids`` run no batch any more (each ends by its deadline, plus a grace)."""
        while any(self.engine.has_worker(sid) for sid in ids):
            await asyncio.sleep(poll_s)
        self._forget_drained()

    @property
    def slots(self) -> dict[int, object]:
        """Slot id -> its :class:`~scheduler_sidecar.live.membership.Slot`, every slot the registry holds."""
        return self.membership.slots

    def set_scope(self, planner: Planner, workers: frozenset[int]) -> None:
        """The slots ``planner`` plans from now on (through the engine, which keeps planners apart)."""
        self._guard(self.engine.set_scope, planner, workers)

    def use_planner(self, planner: Planner) -> None:
        """Plan ``planner.scope`` from now on (the first plan at once, then every period and on bursts)."""
        self._guard(self.engine.add_planner, planner)

    def healthy_slots(self, model: str) -> int:
        return sum(w.healthy for w in self.engine.workers_of(model))

    # ---------------------------------------------------------------- requests
    async def infer(self, model: LiveModel, rows: Sequence[dict[str, bytes]], slo_us: int,
                    budget_us: int | None = None, waited_us: int = 0) -> list[Answer]:
        """Queue one request and wait for its answers (see :meth:`submit`); raises a RequestError if it has none. A
        request whose caller is cancelled (the client left) is withdrawn."""
        future = asyncio.get_running_loop().create_future()

        def done(answers: list[Answer] | None, error: RequestError | None) -> None:
            if not future.done():
                future.set_result(answers) if error is None else future.set_exception(error)

        request = self.submit(model, rows, slo_us, budget_us, waited_us, done)
        try:
            return await future
        finally:
            if future.cancelled() or not future.done():  # the caller was cancelled: the client left
                future.cancel()
                self.withdraw(request)

    def submit(self, model: LiveModel, rows: Sequence[dict[str, bytes]], slo_us: int, budget_us: int | None,
               waited_us: int, done: Callable[[list[Answer] | None, RequestError | None], None]) -> Request:
        """Queue one request, a query per row; ``done`` gets its answers, or the error of the first row that has none.

        A request's rows are queries of their own that share its deadline: a policy may batch them
        with other clients' rows, on different variants, and they arrive together (one decision for
        all of them). The request is answered when every row is; if a row fails, the request fails
        with that row's error and its other rows are withdrawn (taken off the queue, or their answers
        discarded if they are running): a client gets all of its rows or an error, as from Triton.
        ``waited_us``: how long the request had already waited when it got here (the front end's estimate); it
        arrived that much earlier, and its deadline is that much nearer.

        No coroutine or future per request: the native edge calls this for each request it takes, and its answer
        goes out from ``done`` (the asyncio front ends wait on it through :meth:`infer`).
        """
        now = self.clock() - waited_us
        deadline = now + min(slo_us, budget_us + waited_us if budget_us is not None else slo_us)
        request = Request(model.name, len(rows), done)
        queries = []
        for row, inputs in enumerate(rows):
            qid = next(self._ids)
            query = Query(deadline, qid, qid, now, model.name)
            self._pending[qid] = _Pending(query, model, inputs, request, row, now)
            queries.append(query)
            request.query_ids.append(qid)
        if self._held is not None:
            self._held.extend(queries)
        else:
            self._guard(self.engine.arrive, *queries)
        return request

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """The requests submitted inside arrive together: the policies decide once for all of them (a burst the
        native edge hands over in one call), each query still with its own arrival time."""
        if self._held is not None:  # inside a burst already: it is the outer one's
            yield
            return
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held or self._undecided:
                self._undecided = False
                self._guard(self.engine.arrive, *held)

    def withdraw(self, request: Request) -> None:
        """The client left: its request is not answered, and its rows still queued are taken off the queue (those
        running finish, and their answers are discarded)."""
        if self._held:  # a request of the burst being taken is queued (not decided on) before it leaves the queue
            held, self._held = self._held, []
            self._undecided = True
            self._guard(lambda: self.engine.arrive(*held, decide=False))
        if not request.ended:
            request.ended = True
            self._withdraw_rows(request)

    def _withdraw_rows(self, request: Request) -> None:
        for qid in request.query_ids:
            pending = self._pending.pop(qid, None)
            if pending is not None:  # a row, or a row's follow-up on another model
                self._guard(self.engine.cancel, qid, pending.query.type)

    def set_policy(self, model: str, policy: Policy) -> Policy:
        """Switch a model's policy in place; returns the old one."""
        old = self.engine.types[model].policy
        self._guard(self.engine.set_policy, model, policy)
        return old

    def _on_end(self, record: QueryRecord, output: object, error: AccscaleError | None) -> None:
        pending = self._pending.pop(record.query_id, None)
        if pending is None:
            return
        stats = pending.model.stats
        outcome = record.outcome
        request = pending.request
        if pending.handed_over and outcome in (Outcome.MET, Outcome.LATE):  # its follow-up's end is the request's
            stats.request(record.variant_id or "", "escalated")
            return
        label = "error" if isinstance(error, (WorkerFailed, InternalError)) else \
            "shed" if isinstance(error, Overloaded) else outcome.value
        stats.request(record.variant_id or "", label)
        if request.ended:
            return
        if outcome is Outcome.MET or outcome is Outcome.LATE:
            rows, start, end, worker, slot = output
            if outcome is Outcome.MET:
                stats.served_accuracy.observe(record.accuracy)
            stats.latency.observe((end - pending.since_us) / 1e6)
            request.answers[pending.row] = Answer(rows, record.variant_id, record.accuracy,
                                                  start - pending.since_us, end - start, record.batch_size, worker,
                                                  slot)
            request.left -= 1
            if request.left == 0:
                request.end(request.answers, None)
            return
        request.end(None, error if isinstance(error, RequestError)
                    else Unavailable(str(error) if error else outcome.value))
        if len(request.query_ids) > 1:  # its other rows: off the queue once the engine's event has returned
            asyncio.get_running_loop().call_soon(self._withdraw_rows, request)

    def _guard(self, fn, *args):
        """Run an engine event. A policy or planner that raises is the engine's to contain (it fails only its own
        models' queries); what reaches here is a bug in the engine itself, whose state may be broken for every
        model: every request not running fails rather than hangs."""
        try:
            return fn(*args)
        except Exception as exc:
            log.exception("scheduling failed")
            error = InternalError(f"scheduling failed: {type(exc).__name__}: {exc}")
            self.engine.fail_queued(error)
            running = {q.id for batch in self.engine.running().values() for q in batch.queries}
            for qid in [qid for qid in self._pending if qid not in running]:
                pending = self._pending.pop(qid)
                if not pending.request.ended:
                    pending.model.stats.request("", "error")
                    pending.request.end(None, error)
            return None

    # ---------------------------------------------------------------- the engine's executor
    def run_batch(self, batch: Batch) -> None:
        """Send the batch to its worker: through the worker's ``send`` where it has one (its answer comes back in a
        callback, with no coroutine per batch), else in a task that awaits ``infer``."""
        # called from inside the engine's event: whatever ends the batch at once waits for the event to return (a task)
        rows = [self._pending.get(q.id) for q in batch.queries]
        live = [p for p in rows if p is not None]
        if not live:  # every client left before its batch started
            self._spawn(self._later(self._guard, self.engine.batch_done, batch, BatchResult()))
            return
        model = live[0].model
        run = _Run(batch, self.membership.worker(batch.worker_id), model, model.variants[batch.variant_id], live,
                   self.clock(), max(q.deadline_us for q in batch.queries))
        try:
            call = model.call(run.variant, [p.inputs for p in live], batch.dispatch.params)
            send = getattr(run.worker, "send", None)
            if send is None:
                self._spawn(self._run(run, call))
                return
            send(call, self._timeout_s(run.last_deadline_us), lambda result: self._sent_back(run, result))
        except Exception as exc:  # the call could not be made or started: the batch ends as a failed one
            self._spawn(self._later(self._ran, run, exc))
            return
        self._sent += 1

    async def _later(self, fn, *args) -> None:
        fn(*args)

    def _timeout_s(self, last_deadline_us: int) -> float:
        return max(0.0, (last_deadline_us - self.clock()) / 1e6) + RPC_GRACE_S

    def _sent_back(self, run: _Run, result: list[dict[str, bytes]] | BaseException) -> None:
        self._sent -= 1
        if self._sent == 0 and self._settled is not None and not self._settled.done():
            self._settled.set_result(None)
        self._ran(run, result)

    async def _run(self, run: _Run, call: InferCall) -> None:
        try:
            result = await run.worker.infer(call, self._timeout_s(run.last_deadline_us))
        except Exception as exc:
            result = exc
        self._ran(run, result)

    def _ran(self, run: _Run, result: list[dict[str, bytes]] | BaseException) -> None:
        """A batch's worker answered: a failure of several rows for a reason other than time is retried in halves
        (:meth:`_halves`); anything else ends the batch."""
        if isinstance(result, WorkerFailed) and len(run.live) > 1 and result.code is not Code.DEADLINE_EXCEEDED:
            log.warning("a batch of %d on %s failed (%s); retrying it in halves", len(run.live), run.worker.url,
                        result)
            self._spawn(self._halves(run))
            return
        self._finish(run, [result] * len(run.live) if isinstance(result, WorkerFailed) else result)

    async def _halves(self, run: _Run) -> None:
        half = len(run.live) // 2
        params = run.batch.dispatch.params
        try:
            result = [*await self._infer(run.worker, run.model, run.variant, run.live[:half], run.last_deadline_us,
                                         params),
                      *await self._infer(run.worker, run.model, run.variant, run.live[half:], run.last_deadline_us,
                                         params)]
        except Exception as exc:
            result = exc
        self._finish(run, result)

    def _finish(self, run: _Run, result: list[dict[str, bytes] | WorkerFailed] | BaseException) -> None:
        batch, worker, model, live, start = run.batch, run.worker, run.model, run.live, run.start_us
        if isinstance(result, WorkerLost):
            self.on_worker_lost(worker, str(result))
            self._guard(self.engine.batch_failed, batch, result.about(batch.query_ids))
            return
        if isinstance(result, WorkerError):
            self._guard(self.engine.batch_failed, batch, result.about(batch.query_ids))
            return
        if isinstance(result, BaseException):  # a bug; the batch's requests still get an answer
            log.error("batch on %s failed", self.membership.label(batch.worker_id), exc_info=result)
            self._guard(self.engine.batch_failed, batch, WorkerFailed(
                f"{type(result).__name__}: {result}", worker=worker.url, queries=batch.query_ids))
            return
        end = self.clock()
        served = [(p, out) for p, out in zip(live, result) if not isinstance(out, WorkerFailed)]
        failed = {p.query.id: out for p, out in zip(live, result) if isinstance(out, WorkerFailed)}
        outputs = {p.query.id: (out, start, end, worker.url, batch.worker_id) for p, out in served}
        model.stats.batch_size.observe(len(live))
        if model.options.latency_calibration and not failed:  # a split batch's time is not a batch latency
            self._calibrate(model, run.variant, batch.device, len(live), end - start)
        follow_ups: tuple[Query, ...] = ()
        # a stale batch's result is dropped by the engine (its queries run again): it hands nothing over
        if model.follow_up is not None and served and self.engine.is_running(batch):
            try:
                follow_ups = self._follow_ups(model, *zip(*served), end)
            except Exception:  # a bug in the hook: these answers stay final rather than hang
                log.exception("model %s: follow-up failed; answering with this step's outputs", model.name)
        self._guard(self.engine.batch_done, batch, BatchResult(outputs=outputs, follow_ups=follow_ups, failed=failed))

    async def _infer(self, worker: Worker, model: LiveModel, variant: Variant, rows: list[_Pending],
                     last_deadline_us: int, params: tuple[tuple[str, object], ...] = ()
                     ) -> list[dict[str, bytes] | WorkerFailed]:
        """Each row's outputs, or the worker's error for a row that fails even alone.

        A worker that fails a batch of several rows for a reason other than time is asked again in
        halves, so one client's input that breaks the model fails that request alone, not its
        batch-mates (at the cost of about 2 log2(batch) more calls, on a path that should be rare).
        """
        try:
            return await worker.infer(model.call(variant, [p.inputs for p in rows], params),
                                      self._timeout_s(last_deadline_us))
        except WorkerFailed as exc:
            if len(rows) == 1 or exc.code is Code.DEADLINE_EXCEEDED:
                return [exc] * len(rows)
            half = len(rows) // 2
            return [*await self._infer(worker, model, variant, rows[:half], last_deadline_us, params),
                    *await self._infer(worker, model, variant, rows[half:], last_deadline_us, params)]

    def _follow_ups(self, model: LiveModel, rows: tuple[_Pending, ...], answers: tuple[dict[str, bytes], ...],
                    now: int) -> tuple[Query, ...]:
        """The next step of each query that has one; it inherits the deadline and takes over the client's answer.

        One follow-up per query (a chain or a cascade); a fan-out and the merge of its answers are a
        pipeline's own (Loki).
        """
        steps = []  # every row's step first: a hook that fails part way hands none of them over
        for p, answer in zip(rows, answers):
            if p.request.ended:  # its client left: nothing to go on for
                continue
            step = model.follow_up(p.inputs, answer, p.query.deadline_us - now)
            if step is None:
                continue
            if step[0] not in self.models:
                raise ValueError(f"model {model.name}: a follow-up names unknown model {step[0]!r}")
            steps.append((p, *step))
        out = []
        for p, name, inputs in steps:
            qid = next(self._ids)
            query = Query(p.query.deadline_us, qid, qid, now, name, parent=p.query.id, stage=p.query.stage + 1)
            self._pending[qid] = _Pending(query, self.models[name], inputs, p.request, p.row, p.since_us)
            p.request.query_ids.append(qid)  # so that a client who leaves takes it off its queue too
            p.handed_over = True
            out.append(query)
        return tuple(out)

    def _calibrate(self, model: LiveModel, variant: Variant, device: str, batch_size: int, service_us: int) -> None:
        factor = self._calibration.observe(model.name, self.engine.types[model.name].policy.latency, variant.id,
                                           batch_size, device, service_us)
        if factor is not None:
            log.info("model %s: batches on %s run %.2fx their profiled latency; re-planning", model.name, device,
                     factor)
            model.stats.latency_scale.set(factor)

    def load(self, worker: WorkerState, model: str) -> int:
        self._spawn(self._load(worker.id, model))
        return self._load_us.get(model, DEFAULT_LOAD_US)

    async def _load(self, slot_id: int, model: str) -> None:
        """Load ``model`` for a slot; the slots of one Triton (a BLS model's instances) share one load of it."""
        worker = self.membership.worker(slot_id)
        shared = self._loads.get((worker.url, model))
        if shared is None:
            shared = self._loads[worker.url, model] = asyncio.ensure_future(self._load_once(worker, model))
            shared.add_done_callback(lambda _: self._loads.pop((worker.url, model), None))
        try:
            await asyncio.shield(shared)
        except WorkerError as exc:
            log.warning("loading %s on %s failed: %s", model, worker.url, exc)
            self._guard(self.engine.load_done, slot_id, model, False)
            return
        self._guard(self.engine.load_done, slot_id, model, True)

    async def _load_once(self, worker: Worker, model: str) -> None:
        start = self.clock()
        await worker.load(model)
        self._load_us[model] = self.clock() - start
        # what a simulation of this deployment takes as its actuation delay (reproduce proteus --load-ms)
        log.info("loaded %s on %s in %.0f ms", model, worker.url, self._load_us[model] / 1000)

    def unload(self, worker: WorkerState, model: str) -> None:
        member = self.membership.slots[worker.id].member
        others = [w for w in self.engine.workers if w.id != worker.id and w.id in self.membership.slots
                  and self.membership.slots[w.id].member == member and w.holds(model)]
        if not others:  # the model leaves Triton only when no slot of that worker still uses it
            self._spawn(self._unload(worker.id, model))

    async def _unload(self, slot_id: int, model: str) -> None:
        worker, label = self.membership.worker(slot_id), self.membership.label(slot_id)
        try:
            await worker.unload(model)
        except WorkerError as exc:
            log.warning("unloading %s on %s failed: %s", model, label, exc)

    def scale(self, model: str, instances: int, workers: Sequence[WorkerState]) -> None:
        per_server = {self.membership.slots[w.id].member: w.id for w in workers}  # once per server
        for slot_id in per_server.values():
            self._spawn(self._scale(slot_id, model, instances))

    async def _scale(self, slot_id: int, model: str, instances: int) -> None:
        worker, label = self.membership.worker(slot_id), self.membership.label(slot_id)
        start = self.clock()
        try:
            done = await worker.set_instances(model, instances)
        except WorkerError as exc:
            log.warning("setting %s to %d instances on %s failed: %s", model, instances, label, exc)
            return
        log.info("%s runs %d instance(s) on %s (%s in %.0f ms)", model, instances, label, done,
                 (self.clock() - start) / 1000)

    def wake_at(self, time_us: int) -> None:
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle | None = None

        def fire() -> None:
            self._timers.discard(handle)
            if self.clock() < time_us:  # early by the clock (the loop keeps its own time): wait on, since the
                self.wake_at(time_us)  # engine keeps time_us pending and would never ask for it again
            else:
                self._guard(self.engine.wakeup)

        handle = loop.call_later(max(0, time_us - self.clock()) / 1e6, fire)
        self._timers.add(handle)

    def plan(self, planner: Planner, now_us: int, demand: Demand) -> None:
        self._spawn(self._plan(planner, now_us, demand))

    async def _plan(self, planner: Planner, now_us: int, demand: Demand) -> None:
        try:
            plan = await asyncio.get_running_loop().run_in_executor(None, planner.plan, now_us, demand)
        except Exception as exc:
            culprit = type(planner).__name__
            if id(planner) not in self._planner_faults:  # one traceback per planner; the metric counts every failure
                self._planner_faults.add(id(planner))
                log.exception("planner %s failed; the current plan stays", culprit)
            else:
                log.warning("planner %s failed again (%s: %s); the current plan stays", culprit,
                            type(exc).__name__, exc)
            for name in self.models:
                if planner.scope.has_type(name):
                    self.models[name].stats.fault(culprit)
            self._guard(self.engine.plan_failed, planner)
            return
        # when it was asked for and when it was ready, in seconds since the driver started (its clock's reading then
        # is logged once): a simulation of the run plans alike (bench fidelity); and what it is, where it says
        try:
            described = f": {plan.detail.describe()}" if hasattr(plan.detail, "describe") else ""
        except Exception:  # a report only: the plan is applied all the same
            log.exception("describing a plan failed")
            described = ""
        log.info("plan asked for at %.6f s, ready at %.6f s (since the start)%s", (now_us - self.started_us) / 1e6,
                 (self.clock() - self.started_us) / 1e6, described)
        self._guard(self.engine.apply_plan, planner, plan)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait until every batch, load and plan started so far has been handed back to the engine."""
        while self._tasks or self._sent:
            if self._sent:
                if self._settled is None or self._settled.done():  # one future for every caller waiting
                    self._settled = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._settled)
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    async def close(self) -> None:
        for handle in self._timers:
            handle.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pending in list(self._pending.values()):
            if not pending.request.ended:
                pending.model.stats.request("", "failed")
                pending.request.end(None, Unavailable("the sidecar is shutting down"))
        self._pending.clear()
