"""A cascade in the simulator: every model is a query type of its own on its own workers (its replicas), and an
escalation is a follow-up query on the next model's queue, so a plan's replica counts meet queueing before they
are deployed.

Each request stands for one sample of an evaluation split (drawn uniformly, or the ones given, as a live replay
sends them); a model's batch routes each of its samples by the sample's cached confidence
(:func:`python_backend.cascade.route`, as the BLS model does). Every model's workers batch by the head's slack (the
largest profiled batch that fits, Clipper+'s rule) and drop what can no longer make its deadline.

SLO-aware forwarding (an extension; the paper has no SLO): where the time left cannot pay for the next model at
batch 1, the request is answered by the model it is at, and counted as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from python_backend.cascade import ANSWER, answered_early, route
from scheduler_sidecar.core.records import Batch, BatchResult, Outcome, Query
from scheduler_sidecar.sim.results import OUTCOME_CODES
from scheduler_sidecar.sim.simulator import Simulator
from scheduler_sidecar.sim.world import SimWorker, World
from scheduler_sidecar.systems.hybridserve.cascade import Cascade, Predictions
from scheduler_sidecar.systems.hybridserve.family import DEVICE, Family
from scheduler_sidecar.systems.superserve.baselines import ClipperPlus


@dataclass(frozen=True)
class CascadeRun:
    requests: int
    violation_ratio: float  # late or dropped
    accuracy: float  # over answered requests
    met_accuracy: float  # over requests answered within their SLO
    reach: tuple[float, ...]  # share of requests that ran on each model
    answered: tuple[float, ...]  # share each model answered
    answered_early: float  # share answered because the next model could not finish in time
    worker_s_per_request: float  # busy worker-seconds over requests
    mean_wait_ms: tuple[float, ...]  # per model: queueing before a batch starts
    mean_service_ms: tuple[float, ...]  # per model: its batches' duration
    mean_batch: tuple[float, ...]  # per model: requests per batch
    latency_ms: tuple[float, float]  # p50 and p99 of answered requests, arrival to answer
    mean_latency_ms: float  # of answered requests (Fig. 4a)
    p999_latency_ms: float  # their 99.9th percentile (Fig. 4b)
    latency_by_model_ms: tuple[tuple[float, float], ...] = ()  # per model: p50 and p99 of the requests it answered


class Escalation:
    """The simulator's result model for a cascade: where each query of a finished batch goes next."""

    def __init__(self, cascade: Cascade, preds: Predictions, sample: np.ndarray, first_us: Sequence[int], *,
                 slo_aware: bool = True) -> None:
        self.cascade, self.preds, self.sample = cascade, preds, sample
        self.first_us, self.slo_aware = list(first_us), slo_aware
        self.index = {m: i for i, m in enumerate(cascade.models)}
        self.root: dict[int, int] = {}  # query id -> its request
        self.last: dict[int, int] = {}  # request -> its latest query (the one whose outcome is the request's)
        self.by: dict[int, tuple[int, bool]] = {}  # request -> (answering model, answered early)
        n = len(cascade.models)
        self.busy_us, self.wait_us, self.served = np.zeros(n), np.zeros(n), np.zeros(n)
        self.batches = np.zeros(n)

    def __call__(self, batch: Batch, now_us: int, new_id) -> BatchResult:
        i = self.index[batch.dispatch.variant_id]
        self.busy_us[i] += now_us - batch.start_us
        self.batches[i] += 1
        roots = [self.root.get(q.id, q.id) for q in batch.queries]
        self.wait_us[i] += sum(batch.start_us - q.arrival_us for q in batch.queries)
        self.served[i] += len(batch.queries)
        last = len(self.cascade.models) - 1
        t = self.cascade.thresholds[i] if i < last else 0.0
        onward = route(i, self.preds.conf[i, self.sample[roots]], np.asarray(t), last, self.cascade.skip)
        early = answered_early(onward, np.array([q.deadline_us - now_us for q in batch.queries]), self.first_us) \
            if self.slo_aware else np.zeros(len(onward), dtype=bool)
        out = []
        for q, root, nxt, late in zip(batch.queries, roots, onward.tolist(), early.tolist()):
            if nxt == ANSWER or late:
                self.by[root] = (i, late)
            else:
                qid = new_id()
                self.root[qid], self.last[root] = root, qid
                out.append(Query(q.deadline_us, qid, qid, now_us, self.cascade.models[nxt], parent=q.id,
                                 stage=q.stage + 1))
        return BatchResult(follow_ups=tuple(out))


def simulate(family: Family, cascade: Cascade, replicas: Sequence[int], preds: Predictions, arrival_us: np.ndarray,
             slo_ms: float, *, slowdown: float = 1.0, seed: int = 0, slo_aware: bool = True,
             sample: np.ndarray | None = None, latency_ratios: Sequence[float] = ()) -> CascadeRun:
    """Run ``cascade`` with ``replicas[i]`` workers holding its i-th model over requests arriving at ``arrival_us``;
    ``preds`` holds the cascade's models' predictions (rows in cascade order) on the split requests are drawn from
    (``sample``: each request's sample; default: drawn uniformly); every model's latency is its profile's times
    ``slowdown``, or, with ``latency_ratios``, that times one of them drawn at random (a live run's, measured)."""
    if len(replicas) != len(cascade.models) or min(replicas) < 1:
        raise ValueError("every model of the cascade needs at least one replica")
    workers = tuple(SimWorker(DEVICE, resident=frozenset({m})) for m, r in zip(cascade.models, replicas)
                    for _ in range(r))
    policies = {m: ClipperPlus(family.profile(m, slowdown), device=DEVICE) for m in cascade.models}
    n = len(arrival_us)
    if sample is None:
        sample = np.random.default_rng(seed).integers(0, len(preds.truth), n)
    elif len(sample) != n or not ((0 <= sample) & (sample < len(preds.truth))).all():
        raise ValueError(f"sample must name one of the split's {len(preds.truth)} samples per request")
    first_us = [policies[m].latency.us(m, 1, DEVICE) for m in cascade.models]
    escalation = Escalation(cascade, preds, sample, first_us, slo_aware=slo_aware)
    result = Simulator(policies, World(workers, seed=seed, latency_ratios=tuple(latency_ratios)),
                       result_model=escalation).run(
        arrival_us, arrival_us + round(slo_ms * 1000), [cascade.models[0]] * n)
    return _summarise(escalation, result, preds, sample)


def _summarise(esc: Escalation, result, preds: Predictions, sample: np.ndarray) -> CascadeRun:
    n = len(result.outcome)
    outcome = {i: int(code) for i, code in enumerate(result.outcome)}
    outcome.update((r.query_id, OUTCOME_CODES[r.outcome]) for r in result.follow_ups)
    met = np.array([outcome[esc.last.get(r, r)] == OUTCOME_CODES[Outcome.MET] for r in range(n)])
    finish = dict(enumerate(result.finish_us.tolist()))
    finish.update((r.query_id, r.finish_us) for r in result.follow_ups)
    models = len(esc.cascade.models)
    answered_by = np.array([esc.by.get(r, (-1, False))[0] for r in range(n)])
    early = np.array([esc.by.get(r, (-1, False))[1] for r in range(n)])
    done = answered_by >= 0
    correct = np.zeros(n, dtype=bool)
    correct[done] = preds.labels[answered_by[done], sample[done]] == preds.truth[sample[done]]
    latency_ms = np.array([finish[esc.last.get(r, r)] - result.arrival_us[r] for r in np.flatnonzero(done)]) / 1000
    return CascadeRun(
        n, float(1 - met.mean()) if n else 0.0, float(correct[done].mean()) if done.any() else 0.0,
        float(correct[met].mean()) if met.any() else 0.0,
        tuple(float(s / n) for s in esc.served), tuple(float((answered_by == i).mean()) for i in range(models)),
        float(early.mean()), float(esc.busy_us.sum() / 1e6 / n) if n else 0.0,
        tuple(float(w / max(s, 1) / 1000) for w, s in zip(esc.wait_us, esc.served)),
        tuple(float(b / max(k, 1) / 1000) for b, k in zip(esc.busy_us, esc.batches)),
        tuple(float(s / max(k, 1)) for s, k in zip(esc.served, esc.batches)),
        tuple(float(np.percentile(latency_ms, q)) if len(latency_ms) else 0.0 for q in (50, 99)),
        float(latency_ms.mean()) if len(latency_ms) else 0.0,
        float(np.percentile(latency_ms, 99.9)) if len(latency_ms) else 0.0,
        tuple(_p50_p99(latency_ms[answered_by[done] == i]) for i in range(models)))


def _p50_p99(ms: np.ndarray) -> tuple[float, float]:
    return (float(np.percentile(ms, 50)), float(np.percentile(ms, 99))) if len(ms) else (0.0, 0.0)
