"""Builders shared by the tests: tiny supernets, calibrated subnets, profiles."""

from __future__ import annotations

import random

import numpy as np
import torch

from export.presets import SupernetSpec
from export.subnetact import SubNetAct, build
from export.train import random_subnet
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant

TINY = SupernetSpec(image_size=8, stage_channels=(8, 16), max_depths=(2, 3), width_choices=(0.25, 0.5, 1.0))


def make_act(spec: SupernetSpec = TINY, seed: int = 0) -> SubNetAct:
    """An untrained SubNetAct supernet with randomised BatchNorm affine parameters."""
    torch.manual_seed(seed)
    act = build(spec)
    with torch.no_grad():
        for norm in act.norms:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.2, 0.2)
    return act.eval()


def make_images(n: int, spec: SupernetSpec = TINY, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(size=(n, 1, spec.image_size, spec.image_size)).astype(
        np.float32))


def calibrate_random(act: SubNetAct, n: int, seed: int = 0) -> list[tuple[int, ...]]:
    """Calibrate ``n`` distinct subnets (largest and smallest first) and install their tables."""
    rng = random.Random(seed)
    rows = list(dict.fromkeys([act.layout.largest(), act.layout.smallest()]))
    while len(rows) < n:
        row = random_subnet(act, rng)
        if row not in rows:
            rows.append(row)
    images = make_images(64, act.spec, seed + 1)
    act.set_norm_tables([act.calibrate(r, images) for r in rows])
    return rows


def make_profile(n_variants: int = 4, batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)) -> Profile:
    """A Pareto profile: accuracy and latency both rise with the variant index."""
    variants = tuple(
        Variant(f"v{i}", round(0.70 + 0.02 * i, 4), Actuation("model", f"m{i}"),
                {"cpu": LatencyCurve(batch_sizes, tuple((1 + i) * (1 + 0.5 * b) for b in batch_sizes),
                                     tuple((1 + i) * (2 + 0.5 * b) for b in batch_sizes))})
        for i in range(n_variants)
    )
    return Profile("test", "tests/builders.py", variants)


def make_queries(n: int = 8, slo_us: int = 36_000, gap_us: int = 0, start_us: int = 0) -> list:
    """``n`` queries arriving every ``gap_us`` from ``start_us``, each with deadline arrival + slo."""
    from scheduler_sidecar.core.records import Query

    return [Query(start_us + i * gap_us + slo_us, i, i, start_us + i * gap_us) for i in range(n)]


def make_queue(queries) -> object:
    from scheduler_sidecar.core.queue import EdfQueue

    queue = EdfQueue()
    for q in queries:
        queue.push(q)
    return queue


class Routed:
    """A routing policy's queues kept as the engine keeps them, for tests that call the policy directly."""

    def __init__(self, policy, workers) -> None:
        from scheduler_sidecar.core.queue import EdfQueue, QueueView, WorkerQueues

        self.policy, self.workers = policy, workers
        self.queue, self.routes = EdfQueue(), WorkerQueues()
        self.view = QueueView(self.queue, self.routes)

    def arrive(self, now_us: int, query):
        """Queue ``query`` where the policy routes it; returns the policy's answer (a worker id, None or DROP)."""
        from scheduler_sidecar.core.records import DROP

        self.queue.push(query)
        target = self.policy.route(now_us, query, self.view, self.workers)
        if target is DROP:
            self.queue.remove([query.id])
        else:
            self.routes.push(query, target)
        self.policy.observe_arrival(now_us, query)
        return target

    def decide(self, now_us: int):
        """The policy's decision, carried out on the queues (not on the workers)."""
        decision = self.policy.decide(now_us, self.view, self.workers)
        gone = list(decision.dropped) + [i for d in decision.dispatches for i in d.query_ids]
        self.queue.remove(gone)
        self.routes.remove(gone)
        return decision


def decide(policy, queries, workers, now_us: int = 0):
    """``policy``'s decision on these queued queries (a routing policy's routed first, as the engine does)."""
    if not policy.routes:
        return policy.decide(now_us, make_queue(queries).view(), workers)
    queues = Routed(policy, workers)
    for q in queries:
        queues.arrive(q.arrival_us, q)
    return queues.decide(now_us)


def make_workers(n: int = 1, busy: int = 0) -> list:
    """``n`` workers, the first ``busy`` of them running a batch."""
    from scheduler_sidecar.core.records import WorkerState

    return [WorkerState(i, busy_until_us=10**9 if i < busy else None) for i in range(n)]


# what the RAMSIS-family policies need beyond a profile: their choices depend on K and the SLO,
# and RAMSIS generates its MDP policies in the constructor for these loads (a tiny profile: fast)
POLICY_OPTIONS: dict[str, dict] = {
    "ramsis": {"slo_ms": 36.0, "workers": 1, "loads": [100.0]},
    "jellyfish": {"slo_ms": 36.0, "workers": 1},
    "modelswitching": {"slo_ms": 36.0, "workers": 1, "loads": [100.0], "profile_s": 2.0},
}


def make_mover(profile: Profile | None = None):
    """A policy that first moves worker 0 from model m3 to m2 (unload, load), then serves variant v2 (on m2)."""
    from scheduler_sidecar.core.records import Decision, Load, Unload
    from scheduler_sidecar.systems.superserve.baselines import ClipperPlus

    class MoveToM2(ClipperPlus):
        name = "move-to-m2"

        def __init__(self, profile, **options) -> None:
            super().__init__(profile, variant_id="v2", **options)
            self.moved = False

        def decide(self, now_us, queue, workers):
            if not self.moved and workers and workers[0].is_free:
                self.moved = True
                return Decision(unloads=(Unload(workers[0].id, "m3"),), loads=(Load(workers[0].id, "m2"),))
            return super().decide(now_us, queue, workers)

    return MoveToM2(profile or make_profile())


def synthetic(accuracies: list[float], n: int = 3000, seed: int = 0):
    """A cascade family's predictions where confidence tracks correctness loosely: right answers are more confident
    on average."""
    from scheduler_sidecar.systems.hybridserve.cascade import Predictions  # the cascade tests' only

    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 10, n)
    labels, conf = [], []
    for a in accuracies:
        right = rng.random(n) < a
        labels.append(np.where(right, truth, (truth + rng.integers(1, 10, n)) % 10))
        conf.append(np.clip(np.where(right, rng.beta(5, 2, n), rng.beta(2, 4, n)), 0, 1))
    return Predictions(np.array(labels), np.array(conf), truth)


def synthetic_cascade():
    """A three-model cascade family (s, m, l: 1, 3 and 9 ms at batch 1, +35% per added row; 80, 90 and 95% accurate),
    its cascade (thresholds 0.7 and 0.75) and predictions: what a simulation of a cascade needs, fixed, so that no
    build's trained weights or measured latencies move a result."""
    from pathlib import Path  # the cascade tests' only

    from scheduler_sidecar.systems.hybridserve.cascade import Cascade  # the cascade tests' only
    from scheduler_sidecar.systems.hybridserve.family import Family, FamilyModel  # the cascade tests' only

    sizes = (1, 2, 4, 8, 16)

    def model(name: str, ms: float, accuracy: float) -> FamilyModel:
        p50 = tuple(ms * (1 + 0.35 * (b - 1)) for b in sizes)
        return FamilyModel(name, 1.0, ms / 1000, LatencyCurve(sizes, p50, tuple(x * 1.2 for x in p50)),
                           {"test": {"all": accuracy}})

    family = Family((model("s", 1.0, 0.8), model("m", 3.0, 0.9), model("l", 9.0, 0.95)), Path("."), 16)
    return family, Cascade(("s", "m", "l"), (0.7, 0.75)), synthetic([0.8, 0.9, 0.95])
