"""The live driver: the simulator's loop on the wall clock, with real Triton workers.

For each logical model a :class:`LiveModel` holds the EDF queue, the policy and one worker
slot per Triton model instance. Every arrival, completion, worker change and requested
wakeup runs :meth:`LiveModel.schedule`, which asks the policy to decide until it has
nothing more to do and applies each decision with :func:`~scheduler_sidecar.core.records.apply`,
exactly as the simulator does; ``schedule`` never awaits, so a decision always sees a
consistent queue. Each dispatched batch runs as its own task: one ``ModelInfer`` on the
slot's endpoint with the rows concatenated and the variant's control row (supernet) or
model name (separate models), and its output split back into one answer per request.

Latency calibration (``ModelSpec.latency_calibration``, on by default). A profile is
measured on an idle worker; under load, on a shared CPU, batches can run well over their
profiled p50, and a policy that trusts the profile then plans batches that miss their
deadlines. The driver keeps the ratio of each batch's measured service time to its profiled
p50 over the last ``CALIBRATION_WINDOW`` batches and, when the window's 90th percentile
moves more than ``CALIBRATION_TOLERANCE`` from the factor in use, rebuilds the policy on the
profile scaled by it. The policy stays a pure function of what it is given; only its input
is corrected.

Every request ends exactly once: answered (met or late), dropped by the policy
(DEADLINE_EXCEEDED), refused on arrival (INVALID_ARGUMENT/UNAVAILABLE), or failed. A batch
whose worker fails goes back to the queue while its requests have attempts and time left,
and is answered with UNAVAILABLE otherwise. A request whose client leaves is taken off the
queue (or its answer discarded if it is already running).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from dataclasses import dataclass, replace
from typing import Iterable

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from scheduler_sidecar.server.config import ModelSpec
from scheduler_sidecar.core.records import Batch, EdfQueue, Outcome, Query, QueryRecord, WorkerState, apply
from scheduler_sidecar.server.metrics import Metrics, ModelMetrics
from scheduler_sidecar.policies import Policy, make_policy
from scheduler_sidecar.core.profile import Profile, Variant
from scheduler_sidecar.server.protocol import Answer, Code, SidecarError, TensorSpec
from scheduler_sidecar.live.endpoints import Endpoint, WorkerPool

log = logging.getLogger(__name__)

CONTROL_INPUT = "CONTROL"  # the supernet models' control tensor (DESIGN 4.2), filled in by the sidecar
RPC_GRACE_S = 2.0  # a worker RPC may run this long past its batch's last deadline before it is abandoned
# worker errors that mean the worker is gone (its batch is retried elsewhere); others are relayed
WORKER_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN)
CALIBRATION_WINDOW = 64  # batches whose measured/profiled latency ratio is kept
CALIBRATION_QUANTILE = 90  # plan with a factor most batches stay under
CALIBRATION_TOLERANCE = 0.1  # re-plan when that factor moves by more than 10%
CALIBRATION_BOUNDS = (0.5, 10.0)  # a factor outside these means a broken measurement, not a slow worker


def now_us() -> int:
    return time.monotonic_ns() // 1000


@dataclass
class _Pending:
    query: Query
    inputs: dict[str, bytes]  # one row per input, raw
    future: asyncio.Future
    attempts: int = 0


class LiveModel:
    """One logical model: queue, policy and worker slots; answers :meth:`infer`."""

    def __init__(self, spec: ModelSpec, profile: Profile, inputs: tuple[TensorSpec, ...],
                 outputs: tuple[TensorSpec, ...], metrics: Metrics) -> None:
        for v in profile.variants:
            if v.actuation.kind not in ("supernet", "model"):
                raise ValueError(f"{spec.profile}: variant {v.id!r} is a {v.actuation.kind!r} variant; "
                                 "the sidecar serves supernet and model variants")
        self.spec = spec
        self.name = spec.name
        self.profile = profile
        self.inputs = {t.name: t for t in inputs}
        self.outputs = {t.name: t for t in outputs}
        self.stats = ModelMetrics(metrics, spec.name)
        self.latency_scale = 1.0
        self._ratios: collections.deque[float] = collections.deque(maxlen=CALIBRATION_WINDOW)
        self._policy_spec = (spec.policy, dict(spec.policy_options))
        self.policy = self._make_policy(*self._policy_spec)
        self.variants = {v.id: v for v in profile.variants}
        self.fastest_us = min(self.policy.latency_us(v, 1) for v in profile.variants)
        self._control = {v.id: np.asarray(v.actuation.control, np.int32).tobytes()
                         for v in profile.variants if v.actuation.kind == "supernet"}
        self.queue = EdfQueue()
        self.workers: list[WorkerState] = []
        self.endpoint_of: dict[int, Endpoint] = {}
        self.pool: WorkerPool | None = None
        self._pending: dict[int, _Pending] = {}
        self._running: dict[int, int] = {}  # worker id -> token of the batch it runs
        self._inflight: set[int] = set()  # ids of queries in running batches
        self._ids = itertools.count()
        self._tokens = itertools.count()
        self._wakeup: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.stats.policy(None, spec.policy)

    # ---------------------------------------------------------------- configuration
    def _make_policy(self, name: str, options: dict) -> Policy:
        profile = self.profile if self.latency_scale == 1.0 else self.profile.scaled(self.latency_scale)
        return make_policy(name, profile, **{"overhead_us": self.spec.overhead_us, **options})

    def set_policy(self, name: str, options: dict | None = None) -> str:
        """Switch policy in place (the queue is kept); returns the old policy's name."""
        policy = self._make_policy(name, options or {})
        self._policy_spec = (name, dict(options or {}))
        old, self.policy = self.policy.name, policy
        self.stats.policy(old, name)
        log.info("model %s: policy %s -> %s", self.name, old, name)
        self.schedule()
        return old

    @property
    def triton_models(self) -> set[str]:
        return {v.actuation.model for v in self.profile.variants}

    def add_endpoint(self, endpoint: Endpoint, slots: int) -> None:
        for _ in range(slots):
            wid = len(self.workers)
            self.workers.append(WorkerState(wid, healthy=endpoint.healthy, device=self.policy.device))
            self.endpoint_of[wid] = endpoint
        self.schedule()

    def endpoint_changed(self, endpoint: Endpoint) -> None:
        for i, w in enumerate(self.workers):
            if self.endpoint_of[w.id] is endpoint:
                busy = w.busy_until_us if endpoint.healthy else None
                self.workers[i] = replace(w, healthy=endpoint.healthy, busy_until_us=busy)
                if not endpoint.healthy:
                    self._running.pop(w.id, None)  # its batch's RPC fails on its own and is retried
        if not any(w.healthy for w in self.workers):
            for query in list(self.queue.scan()):
                self.queue.discard(query.id)
                self._fail(query.id, Code.UNAVAILABLE, "no healthy Triton worker", "failed")
        self.schedule()

    # ---------------------------------------------------------------- requests
    def row_inputs(self, tensors: Iterable[tuple[str, bytes]]) -> dict[str, bytes]:
        """Check that a request names every input exactly once (types and sizes are checked by the front ends)."""
        rows: dict[str, bytes] = {}
        for name, raw in tensors:
            if name not in self.inputs:
                raise SidecarError(Code.INVALID_ARGUMENT, f"unexpected input '{name}' for model '{self.name}'; "
                                   f"inputs are {sorted(self.inputs)}")
            if name in rows:
                raise SidecarError(Code.INVALID_ARGUMENT, f"input '{name}' given twice")
            rows[name] = raw
        missing = sorted(set(self.inputs) - set(rows))
        if missing:
            raise SidecarError(Code.INVALID_ARGUMENT, f"model '{self.name}' expects inputs {missing}")
        return rows

    async def infer(self, inputs: dict[str, bytes], slo_us: int, budget_us: int | None = None) -> Answer:
        """Queue one request and wait for its answer; raises :class:`SidecarError` if it has none."""
        if slo_us < self.fastest_us:
            self.stats.request("", "rejected")
            raise SidecarError(Code.INVALID_ARGUMENT, f"slo_us {slo_us} is below the fastest variant's "
                               f"batch-1 latency ({self.fastest_us} us): no variant can meet it")
        if not any(w.healthy for w in self.workers):
            self.stats.request("", "rejected")
            raise SidecarError(Code.UNAVAILABLE, "no healthy Triton worker")
        if len(self.queue) >= self.spec.queue_limit:
            self.stats.request("", "rejected")
            raise SidecarError(Code.UNAVAILABLE, f"queue full ({self.spec.queue_limit} requests queued)")
        now = now_us()
        qid = next(self._ids)
        query = Query(now + min(slo_us, budget_us if budget_us is not None else slo_us), qid, qid, now)
        future = asyncio.get_running_loop().create_future()
        self._pending[qid] = _Pending(query, inputs, future)
        self.queue.push(query)
        self.policy.observe_arrival(now, query)
        self.schedule()
        try:
            return await future
        finally:
            if future.cancelled():  # the client left: free its queue entry
                self._pending.pop(qid, None)
                self.queue.discard(qid)
                self.stats.queue_depth.set(len(self.queue))

    def schedule(self) -> None:
        """Let the policy decide until it has nothing to do; start the batches it dispatches."""
        try:
            self._schedule()
        except Exception as exc:  # a policy bug: no request may hang on it, so fail every one not running
            log.exception("model %s: policy %s failed", self.name, self.policy.name)
            self.queue = EdfQueue()
            for qid in [q for q in self._pending if q not in self._inflight]:
                self._fail(qid, Code.INTERNAL, f"scheduling failed: {type(exc).__name__}: {exc}", "error")
        self.stats.queue_depth.set(len(self.queue))

    def _schedule(self) -> None:
        now = now_us()
        policy = self.policy
        while self.queue:
            decision = policy.decide(now, self.queue.view(), self.workers)
            self.stats.decision(policy.name)
            if decision.wakeup_us is not None and decision.wakeup_us > now:
                self._set_wakeup(decision.wakeup_us - now)
            if decision.is_empty:
                break
            batches, dropped = apply(decision, self.queue, self.workers, now,
                                     lambda v, k: policy.latency_us(self.variants[v], k))
            for query in dropped:
                self._fail(query.id, Code.DEADLINE_EXCEEDED, f"dropped: its deadline cannot be met by any "
                           f"variant (fastest takes {self.fastest_us} us)", "dropped")
            for batch in batches:
                token = next(self._tokens)
                self._running[batch.dispatch.worker_id] = token
                self._inflight.update(q.id for q in batch.queries)
                task = asyncio.get_running_loop().create_task(self._run(batch, token))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _set_wakeup(self, delay_us: int) -> None:
        if self._wakeup is not None:
            self._wakeup.cancel()
        self._wakeup = asyncio.get_running_loop().call_later(delay_us / 1e6, self.schedule)

    # ---------------------------------------------------------------- batches
    async def _run(self, batch: Batch, token: int) -> None:
        try:
            await self._execute(batch, token)
        except Exception as exc:  # a bug; the batch's requests still get an answer
            log.exception("model %s: batch on worker %d failed", self.name, batch.dispatch.worker_id)
            self._end_rpc(batch, token)
            for q in batch.queries:
                self._fail(q.id, Code.INTERNAL, f"{type(exc).__name__}: {exc}", "error")
        self.schedule()

    def _end_rpc(self, batch: Batch, token: int) -> None:
        """The batch's worker is free again (unless it was reassigned) and its queries are no longer running."""
        self._free(batch.dispatch.worker_id, token)
        self._inflight.difference_update(q.id for q in batch.queries)

    async def _execute(self, batch: Batch, token: int) -> None:
        endpoint = self.endpoint_of[batch.dispatch.worker_id]
        variant = self.variants[batch.dispatch.variant_id]
        rows = [p for p in (self._pending.get(q.id) for q in batch.queries) if p is not None]
        if not rows:  # every client left before its batch started
            self._end_rpc(batch, token)
            return
        for p in rows:
            p.attempts += 1
        start = now_us()
        timeout_s = (max(q.deadline_us for q in batch.queries) - start) / 1e6 + RPC_GRACE_S
        try:
            response = await endpoint.infer(self._request(variant, rows), timeout_s)
        except grpc.aio.AioRpcError as exc:
            self._end_rpc(batch, token)
            self._worker_error(endpoint, exc, rows)
            return
        end = now_us()
        self._end_rpc(batch, token)
        try:
            answers = self._split(response, len(rows))
        except SidecarError as exc:
            for p in rows:
                self._fail(p.query.id, exc.code, exc.message, "error")
            return
        records = []
        for p, outputs in zip(rows, answers):
            q = p.query
            outcome = Outcome.MET if end <= q.deadline_us else Outcome.LATE
            records.append(QueryRecord(q.id, q.arrival_us, q.deadline_us, end, outcome, variant.id,
                                       variant.accuracy, len(rows)))
            self.stats.request(variant.id, outcome.value)
            if outcome is Outcome.MET:
                self.stats.served_accuracy.observe(variant.accuracy)
            self.stats.latency.observe((end - q.arrival_us) / 1e6)
            if self._pending.pop(q.id, None) is not None and not p.future.done():
                p.future.set_result(Answer(outputs, variant.id, variant.accuracy, start - q.arrival_us,
                                           end - start, len(rows), endpoint.url))
        self.stats.batch_size.observe(len(rows))
        self.policy.observe_completion(end, records)
        if self.spec.latency_calibration:
            self._calibrate(variant, len(rows), end - start)

    def _calibrate(self, variant: Variant, batch_size: int, service_us: int) -> None:
        profiled_us = variant.latency[self.policy.device].p50_at(batch_size) * 1000
        self._ratios.append(service_us / profiled_us)
        if len(self._ratios) < CALIBRATION_WINDOW:
            return
        factor = float(np.clip(np.percentile(self._ratios, CALIBRATION_QUANTILE), *CALIBRATION_BOUNDS))
        if abs(factor / self.latency_scale - 1) > CALIBRATION_TOLERANCE:
            log.info("model %s: batches run %.2fx their profiled latency; re-planning", self.name, factor)
            self.latency_scale = factor
            self.stats.latency_scale.set(factor)
            self.policy = self._make_policy(*self._policy_spec)

    def _request(self, variant: Variant, rows: list[_Pending]) -> pb.ModelInferRequest:
        act = variant.actuation
        k = len(rows)
        request = pb.ModelInferRequest(model_name=act.model, model_version=act.version or "")
        for spec in self.inputs.values():
            request.inputs.add(name=spec.name, datatype=spec.datatype, shape=[k, *spec.dims])
            request.raw_input_contents.append(b"".join(p.inputs[spec.name] for p in rows))
        if act.kind == "supernet":
            control = self._control[variant.id]
            request.inputs.add(name=CONTROL_INPUT, datatype="INT32", shape=[k, len(act.control)])
            request.raw_input_contents.append(control * k)
        return request

    def _split(self, response: pb.ModelInferResponse, k: int) -> list[dict[str, bytes]]:
        rows: list[dict[str, bytes]] = [{} for _ in range(k)]
        if len(response.raw_output_contents) != len(response.outputs):
            raise SidecarError(Code.INTERNAL, "worker answered without raw output contents")
        for tensor, raw in zip(response.outputs, response.raw_output_contents):
            if tensor.name not in self.outputs:
                continue
            size = self.outputs[tensor.name].row_bytes
            if len(raw) != size * k:
                raise SidecarError(Code.INTERNAL, f"worker output '{tensor.name}' has {len(raw)} bytes, "
                                   f"expected {size * k} for {k} rows")
            for i in range(k):
                rows[i][tensor.name] = raw[i * size:(i + 1) * size]
        return rows

    def _worker_error(self, endpoint: Endpoint, exc: grpc.aio.AioRpcError, rows: list[_Pending]) -> None:
        code, details = exc.code(), exc.details()
        if code not in WORKER_LOST:  # Triton answered: relay its error to every request of the batch
            for p in rows:
                self._fail(p.query.id, Code.from_grpc(code), f"worker {endpoint.url}: {details}", "error")
            return
        self.stats.metrics.worker_failures.labels(endpoint.url).inc()
        if self.pool is not None:
            self.pool.mark_down(endpoint, f"{code.name}: {details}")
        now = now_us()
        healthy = any(w.healthy for w in self.workers)
        for p in rows:
            if p.future.done():
                continue
            if healthy and p.attempts < self.spec.max_attempts and now < p.query.deadline_us:
                self.queue.push(p.query)  # retried on another worker
            else:
                self._fail(p.query.id, Code.UNAVAILABLE, f"worker {endpoint.url} failed ({code.name}: {details}) "
                           f"after {p.attempts} attempt(s)", "failed")

    def _free(self, wid: int, token: int) -> None:
        if self._running.get(wid) == token:
            del self._running[wid]
            i = next(i for i, w in enumerate(self.workers) if w.id == wid)
            self.workers[i] = replace(self.workers[i], busy_until_us=None)

    def _fail(self, qid: int, code: Code, message: str, outcome: str) -> None:
        pending = self._pending.pop(qid, None)
        if pending is not None and not pending.future.done():
            self.stats.request("", outcome)
            pending.future.set_exception(SidecarError(code, message))

    async def close(self) -> None:
        if self._wakeup is not None:
            self._wakeup.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for qid in list(self._pending):
            self._fail(qid, Code.UNAVAILABLE, "the sidecar is shutting down", "failed")
