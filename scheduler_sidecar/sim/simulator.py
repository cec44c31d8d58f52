"""Discrete-event simulator: the live driver's loop on simulated time with profiled latencies.

NOTE on the model. Workers run one batch at a time. Events are arrivals (read in order
from the trace), completions and worker failures, processed in time order with ties broken
deterministically (completions, failures, wakeups, then arrivals; then by sequence number).
After every event the policy is asked to decide until it returns an empty decision, exactly
as the live sidecar does. A batch takes the profiled p50 latency of (variant, batch size),
or, with ``latency_noise="tail"``, a lognormal sample whose median is p50 and whose 99th
percentile is p99. A failed worker's running batch goes back to the queue (retried
elsewhere). Every query ends in exactly one record: met, late, dropped or failed.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field, replace
from typing import Literal, Sequence

import numpy as np

from scheduler_sidecar.core.records import EdfQueue, Outcome, Query, QueryRecord, WorkerState, apply
from scheduler_sidecar.core.policy import Policy

_COMPLETION, _FAILURE, _WAKEUP = 0, 1, 2
_Z99 = 2.3263478740408408  # standard normal 99th percentile
OUTCOME_CODES = {Outcome.MET: 0, Outcome.LATE: 1, Outcome.DROPPED: 2, Outcome.FAILED: 3}


@dataclass(frozen=True)
class SimConfig:
    workers: int
    seed: int = 0
    latency_noise: Literal["none", "tail"] = "none"
    fail_at_s: tuple[float, ...] = ()  # one worker (the lowest id still healthy) fails at each time


@dataclass(frozen=True, slots=True)
class BatchRecord:
    start_us: int
    batch_size: int
    variant_id: str


@dataclass
class SimResult:
    """Per-query outcomes as parallel arrays (query id = index), and the run's counters."""

    arrival_us: np.ndarray
    deadline_us: np.ndarray
    finish_us: np.ndarray
    outcome: np.ndarray  # OUTCOME_CODES
    accuracy: np.ndarray  # profiled accuracy of the serving variant; NaN unless served
    batch_size: np.ndarray  # 0 unless served
    variant: list[str | None]
    decisions: int
    wall_s: float
    batches: list[BatchRecord] = field(default_factory=list)  # every dispatched batch, retried ones too

    def count(self, outcome: Outcome) -> int:
        return int(np.count_nonzero(self.outcome == OUTCOME_CODES[outcome]))

    def summary(self) -> dict[str, float | int]:
        n = len(self.outcome)
        met = self.outcome == OUTCOME_CODES[Outcome.MET]
        end_us = max(int(self.finish_us.max(initial=0)), int(self.arrival_us.max(initial=0)))
        return {
            "queries": n,
            "met": int(met.sum()),
            "late": self.count(Outcome.LATE),
            "dropped": self.count(Outcome.DROPPED),
            "failed": self.count(Outcome.FAILED),
            "slo_attainment": float(met.mean()) if n else 0.0,
            "mean_serving_accuracy": float(self.accuracy[met].mean()) if met.any() else 0.0,
            "mean_batch_size": float(np.mean([b.batch_size for b in self.batches])) if self.batches else 0.0,
            "decisions": self.decisions,
            "sim_seconds": end_us / 1e6,
            "wall_seconds": self.wall_s,
            "queries_per_wall_second": n / self.wall_s if self.wall_s > 0 else float("inf"),
        }

    def records(self) -> list[QueryRecord]:
        outcomes = {code: o for o, code in OUTCOME_CODES.items()}
        return [
            QueryRecord(i, int(self.arrival_us[i]), int(self.deadline_us[i]), int(self.finish_us[i]),
                        outcomes[int(self.outcome[i])], self.variant[i],
                        None if math.isnan(self.accuracy[i]) else float(self.accuracy[i]), int(self.batch_size[i]))
            for i in range(len(self.outcome))
        ]

    def dynamics(self, bin_s: float = 1.0) -> dict[str, np.ndarray]:
        """Per-bin ingest rate, served accuracy, batch size and attainment (SuperServe Fig. 8c)."""
        end_us = max(int(self.finish_us.max(initial=0)), int(self.arrival_us.max(initial=0)))
        bins = max(1, math.ceil(end_us / (bin_s * 1e6)))
        edges = np.arange(bins + 1) * bin_s * 1e6
        ingest = np.histogram(self.arrival_us, edges)[0] / bin_s
        met = self.outcome == OUTCOME_CODES[Outcome.MET]
        by_arrival = np.minimum((self.arrival_us / (bin_s * 1e6)).astype(np.int64), bins - 1)
        arrivals = np.bincount(by_arrival, None, bins)
        attainment = np.where(arrivals > 0, np.bincount(by_arrival, met, bins) / np.maximum(arrivals, 1), np.nan)
        by_finish = np.minimum((self.finish_us / (bin_s * 1e6)).astype(np.int64), bins - 1)
        acc_sum = np.bincount(by_finish[met], self.accuracy[met], bins)
        acc_n = np.bincount(by_finish[met], None, bins)
        starts = np.array([b.start_us for b in self.batches], dtype=np.int64)
        sizes = np.array([b.batch_size for b in self.batches], dtype=np.float64)
        by_start = np.minimum((starts / (bin_s * 1e6)).astype(np.int64), bins - 1)
        batch_sum, batch_n = np.bincount(by_start, sizes, bins), np.bincount(by_start, None, bins)
        with np.errstate(invalid="ignore", divide="ignore"):
            return {
                "time_s": edges[:-1] / 1e6,
                "ingest_qps": ingest,
                "served_accuracy": np.where(acc_n > 0, acc_sum / np.maximum(acc_n, 1), np.nan),
                "mean_batch_size": np.where(batch_n > 0, batch_sum / np.maximum(batch_n, 1), np.nan),
                "slo_attainment": attainment,
            }


class Simulator:
    """Runs one policy over one trace; build a new one per run."""

    def __init__(self, policy: Policy, config: SimConfig) -> None:
        if config.workers < 1:
            raise ValueError("a simulation needs at least one worker")
        self.policy = policy
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        profile, device = policy.profile, policy.device
        self._accuracy = {v.id: v.accuracy for v in profile.variants}
        # (variant, k) -> (p50 in us, lognormal sigma) of the smallest profiled batch size >= k: a batch
        # between profiled sizes is padded, as a batching server runs it
        self._latency: dict[tuple[str, int], tuple[float, float]] = {}
        for v in profile.variants:
            curve = v.latency[device]
            k = 1
            for b, p50, p99 in zip(curve.batch_sizes, curve.p50_ms, curve.p99_ms):
                sigma = math.log(max(p99, p50) / p50) / _Z99 if p50 > 0 else 0.0
                for size in range(k, b + 1):
                    self._latency[(v.id, size)] = (p50 * 1000, sigma)
                k = b + 1

    def _latency_us(self, variant: str, batch: int) -> int:
        p50, sigma = self._latency[(variant, batch)]
        if self.config.latency_noise == "tail":
            p50 *= math.exp(sigma * self.rng.standard_normal())
        return max(1, round(p50))

    def run(self, arrival_us: Sequence[int] | np.ndarray, deadline_us: Sequence[int] | np.ndarray) -> SimResult:
        started = time.perf_counter()
        arrival = np.asarray(arrival_us, dtype=np.int64)
        deadline = np.asarray(deadline_us, dtype=np.int64)
        if arrival.shape != deadline.shape or (len(arrival) > 1 and np.any(np.diff(arrival) < 0)):
            raise ValueError("arrivals must be non-decreasing and match the deadlines one to one")
        n = len(arrival)
        finish = np.full(n, -1, dtype=np.int64)
        outcome = np.full(n, -1, dtype=np.int8)
        ends = np.zeros(n, dtype=np.int32)  # terminal outcomes recorded per query: must end at exactly 1
        accuracy = np.full(n, np.nan)
        batch_size = np.zeros(n, dtype=np.int32)
        variant: list[str | None] = [None] * n
        batches: list[BatchRecord] = []
        policy, queue = self.policy, EdfQueue()
        workers = [WorkerState(i, device=policy.device) for i in range(self.config.workers)]
        running: dict[int, tuple[int, str, tuple[Query, ...]]] = {}  # worker id -> (token, variant, queries)
        events: list[tuple[int, int, int, object]] = []
        seq = 0
        for t in sorted(self.config.fail_at_s):
            heapq.heappush(events, (round(t * 1e6), _FAILURE, seq := seq + 1, None))
        observe_completion = type(policy).observe_completion is not Policy.observe_completion
        decisions = 0
        arrival_list, deadline_list = arrival.tolist(), deadline.tolist()
        next_arrival = 0
        met_code, late_code = OUTCOME_CODES[Outcome.MET], OUTCOME_CODES[Outcome.LATE]
        while next_arrival < n or events:
            if events and (next_arrival >= n or events[0][0] <= arrival_list[next_arrival]):
                now, kind, _, payload = heapq.heappop(events)
                if kind == _COMPLETION:
                    wid, token = payload
                    if wid not in running or running[wid][0] != token:
                        continue  # the worker failed while running this batch
                    _, var, queries = running.pop(wid)
                    workers[wid] = replace(workers[wid], busy_until_us=None)
                    acc = self._accuracy[var]
                    for q in queries:
                        ends[q.id] += 1
                        finish[q.id] = now
                        outcome[q.id] = met_code if now <= q.deadline_us else late_code
                        accuracy[q.id] = acc
                        batch_size[q.id] = len(queries)
                        variant[q.id] = var
                    if observe_completion:
                        policy.observe_completion(now, [
                            QueryRecord(q.id, q.arrival_us, q.deadline_us, now,
                                        Outcome.MET if now <= q.deadline_us else Outcome.LATE, var, acc, len(queries))
                            for q in queries])
                elif kind == _FAILURE:
                    victim = next((w for w in workers if w.healthy), None)
                    if victim is None:
                        continue
                    workers[victim.id] = replace(victim, healthy=False, busy_until_us=None)
                    if victim.id in running:  # its batch goes back to the queue, to be retried elsewhere
                        for q in running.pop(victim.id)[2]:
                            queue.push(q)
                    if not any(w.healthy for w in workers):
                        for q in list(queue.scan()):
                            ends[q.id] += 1
                            finish[q.id], outcome[q.id] = now, OUTCOME_CODES[Outcome.FAILED]
                        queue = EdfQueue()
            else:
                now = arrival_list[next_arrival]
                q = Query(deadline_list[next_arrival], next_arrival, next_arrival, now)
                next_arrival += 1
                if not any(w.healthy for w in workers):
                    ends[q.id] += 1
                    finish[q.id], outcome[q.id] = now, OUTCOME_CODES[Outcome.FAILED]
                    continue
                queue.push(q)
                policy.observe_arrival(now, q)
            # decide until the policy has nothing more to do
            while queue:
                decision = policy.decide(now, queue.view(), workers)
                decisions += 1
                if decision.wakeup_us is not None and decision.wakeup_us > now:
                    heapq.heappush(events, (decision.wakeup_us, _WAKEUP, seq := seq + 1, None))
                if decision.is_empty:
                    break
                dispatched, dropped = apply(decision, queue, workers, now, self._latency_us)
                for q in dropped:
                    ends[q.id] += 1
                    finish[q.id], outcome[q.id] = now, OUTCOME_CODES[Outcome.DROPPED]
                for batch in dispatched:
                    d = batch.dispatch
                    seq += 1
                    running[d.worker_id] = (seq, d.variant_id, batch.queries)
                    heapq.heappush(events, (now + batch.expected_latency_us, _COMPLETION, seq, (d.worker_id, seq)))
                    batches.append(BatchRecord(now, len(batch.queries), d.variant_id))
        if np.any(ends != 1):
            bad = int(np.flatnonzero(ends != 1)[0])
            raise RuntimeError(f"query {bad} ended {ends[bad]} times; every query must end exactly once")
        return SimResult(arrival, deadline, finish, outcome, accuracy, batch_size, variant, decisions,
                         time.perf_counter() - started, batches)
