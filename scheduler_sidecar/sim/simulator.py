"""Discrete-event simulator: the engine on simulated time, with batch latencies from the world.

NOTE on the model. Events are arrivals (read in order from the trace), batch completions,
load completions, worker failures, wakeups and plans coming into force, processed in time order
with ties broken deterministically (completions, loads, failures, wakeups, plans, then arrivals;
then by sequence number). Each event goes to the :class:`~scheduler_sidecar.core.engine.Engine`,
which lets the policies decide exactly as it does in the live sidecar. A planner runs inline when
the engine asks for a plan; its wall time is recorded, and the plan is in force at once or, with
``plan_delay_us``, as late as that says (a live planner's solve time, measured). A failed
worker's running batch goes back to the queue (retried elsewhere). Every query ends in exactly
one record.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from scheduler_sidecar.core.engine import SIMULATED, Engine, QueryType, TypeLimits
from scheduler_sidecar.core.latency import Calibration
from scheduler_sidecar.core.plan import Demand, Planner
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.records import Batch, BatchResult, Outcome, Query, QueryRecord, WorkerState
from scheduler_sidecar.errors import AccscaleError
from scheduler_sidecar.sim.results import OUTCOME_CODES, BatchRecord, SimResult
from scheduler_sidecar.sim.world import BatchLatency, World

_COMPLETION, _LOAD, _FAILURE, _WAKEUP, _PLAN = 0, 1, 2, 3, 4

# what a batch did in the world: (batch, now_us, new query id) -> its result (follow-up queries, ...)
ResultModel = Callable[[Batch, int, Callable[[], int]], BatchResult]


@dataclass(frozen=True)
class SimConfig:
    """A uniform world: ``workers`` workers of the policy's device kind holding every model."""

    workers: int
    seed: int = 0
    latency_noise: Literal["none", "tail"] = "none"
    fail_at_s: tuple[float, ...] = ()  # one worker (the lowest id still healthy) fails at each time

    def world(self, device: str) -> World:
        return World.uniform(self.workers, device, seed=self.seed, latency_noise=self.latency_noise,
                             fail_at_s=self.fail_at_s)


class Simulator:
    """Runs policies over one trace; build a new one per run.

    ``policy`` is one policy (a single query type, named ``""``), or query type -> policy for
    several types sharing the world's workers. ``planners`` plan them, each over its scope (one over everything,
    or several over their own types and workers, as a sidecar serving several systems). ``result_model`` says what a batch creates (a
    pipeline's next stage, a cascade's escalation); by default nothing. ``plan_delay_us`` says how
    long after it was asked for, at a time, a plan comes into force; by default at once. ``calibrate``: each
    batch's time rescales its policy's latency table as the live driver's calibration does (where the world's batches
    do not take their profiled p50: ``World.latency_ratios``, a live run's).
    """

    def __init__(self, policy: Policy | Mapping[str, Policy], config: SimConfig | World, *,
                 planners: Sequence[Planner] = (), result_model: ResultModel | None = None,
                 max_attempts: int = SIMULATED.max_attempts, plan_delay_us: Callable[[int], int] | None = None,
                 admission: bool = SIMULATED.admission, calibrate: bool = False) -> None:
        policies = {"": policy} if isinstance(policy, Policy) else dict(policy)
        if not policies:
            raise ValueError("a simulation needs at least one policy")
        first = next(iter(policies.values()))
        world = config.world(first.device) if isinstance(config, SimConfig) else config
        self.world = world.with_load_times([p.profile for p in policies.values()])
        # the simulator's limits (core.engine.SIMULATED), but for what the caller sets: admission, to simulate a
        # sidecar that refuses what the queue ahead makes infeasible, and max_attempts
        limits = TypeLimits(SIMULATED.queue_limit, max_attempts, admission)
        self.types = [QueryType(name, p, limits) for name, p in policies.items()]
        self.planners = tuple(planners)  # each over its scope (core.plan)
        self.result_model = result_model
        self.plan_delay_us = plan_delay_us
        self.latency = BatchLatency(self.world, [p.profile for p in policies.values()])
        self.calibration = Calibration() if calibrate else None

    def _calibrate(self, engine: Engine, batch: Batch, now_us: int) -> None:
        kind = batch.queries[0].type
        self.calibration.observe(kind, engine.types[kind].policy.latency, batch.variant_id, len(batch.queries),
                                 batch.device, now_us - batch.start_us)

    def run(self, arrival_us: Sequence[int] | np.ndarray, deadline_us: Sequence[int] | np.ndarray,
            query_types: Sequence[str] | None = None, *, start_us: int = 0) -> SimResult:
        """``start_us``: the clock's reading when the run starts, and the planner with it (a live run's first plan, to
        align the planner's periods and its seconds, which count from its start, with it); the arrivals come no earlier."""
        started = time.perf_counter()
        arrival = np.asarray(arrival_us, dtype=np.int64)
        deadline = np.asarray(deadline_us, dtype=np.int64)
        if arrival.shape != deadline.shape or (len(arrival) > 1 and np.any(np.diff(arrival) < 0)):
            raise ValueError("arrivals must be non-decreasing and match the deadlines one to one")
        n = len(arrival)
        if query_types is not None and len(query_types) != n:
            raise ValueError("query_types must name one type per arrival")
        if n and arrival[0] < start_us:
            raise ValueError(f"the first arrival ({arrival[0]} us) is before the start ({start_us} us)")
        run = _Run(self, n, start_us)
        engine = run.engine
        for planner in self.planners:
            engine.add_planner(planner)
        arrivals, deadlines = arrival.tolist(), deadline.tolist()
        types = list(query_types) if query_types is not None else None
        default_type = self.types[0].name
        events = run.events
        next_arrival = 0
        while next_arrival < n or events:
            if events and (next_arrival >= n or events[0][0] <= arrivals[next_arrival]):
                run.now, kind, _, payload = heapq.heappop(events)
                if kind != _WAKEUP:
                    run.work -= 1
                if kind == _COMPLETION:
                    if self.calibration is not None:
                        self._calibrate(engine, payload, run.now)
                    engine.batch_done(payload, self.result_model(payload, run.now, run.new_id)
                                      if self.result_model is not None else BatchResult())
                elif kind == _LOAD:
                    engine.load_done(*payload)
                elif kind == _FAILURE:
                    victim = next((w for w in engine.workers if w.healthy), None)
                    if victim is not None:
                        engine.set_health(victim.id, False)
                elif kind == _PLAN:
                    engine.apply_plan(*payload)
                elif next_arrival < n or run.work or engine.queued():
                    engine.wakeup()
                else:  # only wakeups left (a planner's period): the trace is over
                    break
            else:
                i = next_arrival
                run.now = arrivals[i]
                next_arrival += 1
                engine.arrive(Query(deadlines[i], i, i, arrivals[i], types[i] if types else default_type))
        ends = np.asarray(run.ends, dtype=np.int32)
        if np.any(ends != 1):
            bad = int(np.flatnonzero(ends != 1)[0])
            raise RuntimeError(f"query {bad} ended {ends[bad]} times; every query must end exactly once")
        return SimResult(arrival, deadline, np.asarray(run.finish, dtype=np.int64),
                         np.asarray(run.outcome, dtype=np.int8), np.asarray(run.accuracy, dtype=np.float64),
                         np.asarray(run.batch_size, dtype=np.int32), run.variant, engine.num_decisions,
                         time.perf_counter() - started, run.batches, run.follow_ups, run.solve_s)


class _Run:
    """One run's state: the event heap, the engine and its executor, and the per-query outcome arrays."""

    def __init__(self, sim: Simulator, n: int, start_us: int) -> None:
        self.sim, self.n = sim, n
        self.now = start_us
        self.events: list[tuple[int, int, int, object]] = []
        self.work = 0  # events in the heap other than wakeups
        self._seq = itertools.count(1)
        self._ids = itertools.count(n)
        # per-query outcomes, filled as queries end (plain lists: numpy item assignment is slow per query)
        self.finish = [-1] * n
        self.outcome = [-1] * n
        self.ends = [0] * n  # terminal outcomes recorded per query: must end at exactly 1
        self.accuracy = [math.nan] * n
        self.batch_size = [0] * n
        self.variant: list[str | None] = [None] * n
        self.batches: list[BatchRecord] = []
        self.follow_ups: list[QueryRecord] = []
        self.solve_s: list[float] = []
        self._codes = OUTCOME_CODES
        self._met = OUTCOME_CODES[Outcome.MET]
        for t in sorted(sim.world.fail_at_s):
            self._push(round(t * 1e6), _FAILURE, None)
        self.engine = Engine(sim.types, sim.world.worker_states(), self, clock=lambda: self.now,
                             on_end=self._on_end)

    def new_id(self) -> int:
        return next(self._ids)

    def _push(self, time_us: int, kind: int, payload: object) -> None:
        self.work += kind != _WAKEUP
        heapq.heappush(self.events, (time_us, kind, next(self._seq), payload))

    def _on_end(self, record: QueryRecord, output: object, error: AccscaleError | None) -> None:
        i = record.query_id
        if i >= self.n:
            self.follow_ups.append(record)
            return
        self.ends[i] += 1
        self.finish[i] = record.finish_us
        outcome = record.outcome
        self.outcome[i] = self._met if outcome is Outcome.MET else self._codes[outcome]  # the usual case unhashed
        if outcome is Outcome.MET or outcome is Outcome.LATE:
            self.accuracy[i] = record.accuracy
            self.batch_size[i] = record.batch_size
            self.variant[i] = record.variant_id

    # ---------------------------------------------------------------- the engine's executor
    def run_batch(self, batch: Batch) -> None:
        latency = self.sim.latency.sample_us(batch.variant_id, len(batch.queries), batch.worker_id)
        self._push(self.now + latency, _COMPLETION, batch)
        self.batches.append(BatchRecord(self.now, len(batch.queries), batch.variant_id))

    def load(self, worker: WorkerState, model: str) -> int:
        delay = self.sim.world.load_us(model)
        self._push(self.now + delay, _LOAD, (worker.id, model))
        return delay

    def unload(self, worker: WorkerState, model: str) -> None:
        pass  # instant: the engine no longer dispatches the model to the worker

    def wake_at(self, time_us: int) -> None:
        self._push(time_us, _WAKEUP, None)

    def scale(self, model: str, instances: int, workers: Sequence[WorkerState]) -> None:
        pass  # a simulated worker is one replica: a planner that counts replicas places them as workers

    def plan(self, planner: Planner, now_us: int, demand: Demand) -> None:
        started = time.perf_counter()
        plan = planner.plan(now_us, demand)
        self.solve_s.append(time.perf_counter() - started)
        delay_us = self.sim.plan_delay_us(now_us) if self.sim.plan_delay_us is not None else 0
        if delay_us > 0:
            self._push(now_us + delay_us, _PLAN, (planner, plan))
        else:
            self.engine.apply_plan(planner, plan)
