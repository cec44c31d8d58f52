"""MostAccurateFirst (Loki Alg. 1): tables are distributions, capacity is respected while the cluster has it,
and the most accurate workers fill first."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scheduler_sidecar.systems.loki import milp
from scheduler_sidecar.systems.loki.data import traffic_analysis
from scheduler_sidecar.systems.loki.routing import FRONTEND, Replica, Routing, most_accurate_first

PIPELINE = traffic_analysis()


def _replicas(solution: milp.Solution) -> list[Replica]:
    ids = itertools.count()
    return [Replica(next(ids), a.task, a.variant, a.batch, a.batch_ms, a.capacity_qps, a.accuracy)
            for a in solution.allocations for _ in range(a.replicas)]


def _check(routing: Routing, replicas: list[Replica], demand: float) -> None:
    for (_, child), table in routing.tables.items():
        assert sum(p for _, p in table) == pytest.approx(1.0)
        assert all(p >= 0 and routing.replicas[w].task == child for w, p in table)
    root_capacity = sum(r.capacity_qps for r in replicas if r.task == PIPELINE.root.name)
    for task in PIPELINE.tasks:
        workers = sorted((r for r in replicas if r.task == task.name), key=lambda r: (-r.accuracy, r.variant, r.worker_id))
        offered = sum(routing.incoming[r.worker_id] for r in workers)
        capacity = sum(r.capacity_qps for r in workers)
        if offered <= capacity * (1 - 1e-9) and demand <= root_capacity:
            assert all(routing.incoming[r.worker_id] <= r.capacity_qps * (1 + 1e-9) for r in workers)
        # most accurate first: a variant's replicas get traffic only when every more accurate variant of the
        # task is full, unless everything is full (then the rest is spread)
        full = True
        for _, group in itertools.groupby(workers, key=lambda r: r.variant):
            group = list(group)
            taken = sum(routing.incoming[r.worker_id] for r in group)
            if not full and offered <= capacity:
                assert taken == pytest.approx(0.0, abs=1e-9)
            full = full and taken >= sum(r.capacity_qps for r in group) * (1 - 1e-9)

@pytest.mark.parametrize("demand", [40, 150, 300, 900, 1800])
def test_tables_on_the_milp_plans(demand: float) -> None:
    solution = milp.plan(PIPELINE, demand, 20)
    replicas = _replicas(solution)
    routing = most_accurate_first(PIPELINE, replicas, demand)
    _check(routing, replicas, demand)
    assert sum(routing.incoming[r.worker_id] for r in replicas if r.task == PIPELINE.root.name) \
        == pytest.approx(demand)
    assert (FRONTEND, PIPELINE.root.name) in routing.tables


def test_random_placements_and_overload() -> None:
    rng = np.random.default_rng(3)
    for _ in range(30):
        replicas, ids = [], itertools.count()
        for task in PIPELINE.tasks:
            for v in rng.choice(len(task.variants), size=rng.integers(1, 4)):
                variant = task.variants[v]
                b = int(rng.choice(variant.latency.batch_sizes[:4]))
                replicas.append(Replica(next(ids), task.name, variant.id, b, variant.batch_ms(b),
                                        variant.throughput_qps(b), variant.accuracy))
        demand = float(rng.uniform(5, 400))
        routing = most_accurate_first(PIPELINE, replicas, demand)
        _check(routing, replicas, demand)
        for task, backups in routing.backups.items():  # leftover capacity, most accurate first
            assert all(routing.replicas[w].task == task and left > 0 for w, left in backups)
            accuracy = [routing.replicas[w].accuracy for w, _ in backups]
            assert accuracy == sorted(accuracy, reverse=True)


def test_a_worker_with_no_planned_traffic_still_has_a_table() -> None:
    top = [t.top for t in PIPELINE.tasks]
    replicas = [Replica(i, t.name, v.id, 1, v.batch_ms(1), v.throughput_qps(1), v.accuracy)
                for i, (t, v) in enumerate(zip(PIPELINE.tasks, top))]
    routing = most_accurate_first(PIPELINE, replicas, 0.0)
    for child in PIPELINE.root.children:
        assert sum(p for _, p in routing.tables[0, child]) == pytest.approx(1.0)
