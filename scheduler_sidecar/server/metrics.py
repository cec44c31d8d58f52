"""The sidecar's Prometheus metrics (served at ``/metrics`` on the HTTP port).

One registry per sidecar, so that several sidecars in one process (tests) do not collide.
Mean serving accuracy is ``accscale_served_accuracy_sum / accscale_served_accuracy_count``
(accuracy of the variants that answered queries within their SLO, the papers' metric);
SLO attainment is ``met / sum over outcomes`` of ``accscale_requests_total``, ``escalated`` left out (a request a
model passed on, whose end the next model counts).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    disable_created_metrics,
    generate_latest,
)

disable_created_metrics()  # the *_created series double the output and no dashboard reads them

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("accscale_requests", "Requests by how they ended: met/late (answered within/after "
                                "the SLO), dropped (slack gone), rejected (refused on arrival), shed (refused on "
                                "arrival: the queue ahead makes its SLO infeasible), failed, error; escalated (passed on to a "
                                "cascade's next model, which counts its end)",
                                ["model", "variant", "outcome"], registry=r)
        self.served_accuracy = Summary("accscale_served_accuracy", "Profiled accuracy of the variant that served "
                                       "each request answered within its SLO", ["model"], registry=r)
        self.latency = Histogram("accscale_request_latency_seconds", "Arrival to answer, answered requests",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("accscale_queue_depth", "Queued requests", ["model"], registry=r)
        self.batch_size = Histogram("accscale_batch_size", "Size of dispatched batches", ["model"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.decisions = Counter("accscale_decisions", "Policy decide() calls", ["model", "policy"], registry=r)
        self.policy = Gauge("accscale_policy", "1 for the active policy of each model", ["model", "policy"],
                            registry=r)
        self.worker_healthy = Gauge("accscale_worker_healthy", "1 if the Triton endpoint is ready, else 0",
                                    ["endpoint"], registry=r)
        self.latency_scale = Gauge("accscale_latency_scale", "Measured over profiled batch latency the policy plans "
                                   "with (latency calibration; 1 until measured)", ["model"], registry=r)
        self.loop_lag = Gauge("accscale_loop_lag_seconds", "How late the event loop runs a ready handler (the "
                              "recent largest): counted against each arriving request's deadline", registry=r)
        self.faults = Counter("accscale_scheduling_faults", "Exceptions raised by a model's policy or planner "
                              "(culprit). A policy's fails that model's queued requests only; a planner whose plan() "
                              "raises keeps its last plan, one that raises on an arrival or plans beyond its workers "
                              "fails its models' queued requests", ["model", "culprit"], registry=r)
        self.worker_failures = Counter("accscale_worker_failures", "Batches lost to a failed worker",
                                       ["endpoint"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelMetrics:
    """One logical model's series, each looked up once: ``labels()`` takes a lock and builds a key per call."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self.metrics = metrics
        self.model = model
        self.queue_depth = metrics.queue_depth.labels(model)
        self.served_accuracy = metrics.served_accuracy.labels(model)
        self.latency = metrics.latency.labels(model)
        self.batch_size = metrics.batch_size.labels(model)
        self.latency_scale = metrics.latency_scale.labels(model)
        self.latency_scale.set(1.0)
        self._requests: dict[tuple[str, str], Counter] = {}
        self._decisions: dict[str, Counter] = {}

    def request(self, variant: str, outcome: str) -> None:
        child = self._requests.get((variant, outcome))
        if child is None:
            child = self._requests[(variant, outcome)] = self.metrics.requests.labels(self.model, variant, outcome)
        child.inc()

    def decision(self, policy: str) -> None:
        child = self._decisions.get(policy)
        if child is None:
            child = self._decisions[policy] = self.metrics.decisions.labels(self.model, policy)
        child.inc()

    def fault(self, culprit: str) -> None:
        self.metrics.faults.labels(self.model, culprit).inc()

    def policy(self, old: str | None, new: str) -> None:
        if old is not None:
            self.metrics.policy.labels(self.model, old).set(0)
        self.metrics.policy.labels(self.model, new).set(1)
