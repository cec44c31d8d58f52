"""HybridServe's planner: replicas R ∝ ρl within a budget, and the placement program (Eqs. 2-4) against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scheduler_sidecar.systems.hybridserve.placement import (
    Device,
    Instance,
    chain_flow,
    place,
    plan,
    replicas,
    transfer_cost,
)

REACH, LATENCY = (1.0, 0.4, 0.35, 0.17), (1.0, 2.0, 4.0, 8.0)


def test_replicas_follow_work_and_fill_the_budget():
    for budget in (4, 6, 9, 16, 40):
        r = replicas(REACH, LATENCY, budget)
        assert sum(r) <= budget and min(r) >= 1
        work = np.array(REACH) * LATENCY
        # the largest scale: one more replica anywhere is what rounding at a larger scale would add, over budget
        assert all(sum(r) + 1 > budget or r[i] + 1 > np.floor(work[i] / work.max() * max(r) + 1.5)
                   for i in range(4))
    r = replicas(REACH, LATENCY, 40)
    ratio = np.array(r) / (np.array(REACH) * LATENCY)
    assert ratio.max() / ratio.min() < 1.5  # within rounding of proportional
    with pytest.raises(ValueError, match="at least 4"):
        replicas(REACH, LATENCY, 3)


def brute_force(instances, devices, flow):
    copies = np.bincount([s.model for s in instances], minlength=flow.shape[0])
    best = None
    for assign in itertools.product(range(len(devices)), repeat=len(instances)):
        ok = all(sum(s.memory_mb for s, a in zip(instances, assign) if a == g) <= d.memory_mb + 1e-9 and
                 sum(s.utilisation / d.speed for s, a in zip(instances, assign) if a == g) <= 1 + 1e-9
                 for g, d in enumerate(devices))
        if not ok:
            continue
        cost = sum(flow[s.model, t.model] / (copies[s.model] * copies[t.model])
                   * transfer_cost(devices[assign[a]], devices[assign[b]])
                   for (a, s), (b, t) in itertools.permutations(enumerate(instances), 2) if s.model < t.model)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_placement_program_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    devices = [Device("a", "s1", 100), Device("b", "s1", rng.uniform(40, 100)), Device("c", "s2", 100, speed=2.0)]
    reps = tuple(int(k) for k in rng.integers(1, 3, 3))
    instances = [Instance(i, r, float(rng.uniform(20, 60)), float(rng.uniform(0.1, 0.7)))
                 for i in range(3) for r in range(reps[i])]
    reach = np.array([1.0, rng.uniform(0.3, 0.7), rng.uniform(0.05, 0.3)])
    flow = chain_flow(reach, [reach[0] - reach[1], reach[1] - reach[2], reach[2]])
    placed, expected = place(instances, devices, flow), brute_force(instances, devices, flow)
    assert placed.feasible == (expected is not None)
    if expected is not None:
        assert placed.cost == pytest.approx(expected, abs=1e-6)


def test_a_chain_shares_a_device_until_utilisation_forbids_it():
    devices = [Device("a", "s1", 1000), Device("b", "s1", 1000), Device("c", "s2", 1000)]
    flow = chain_flow([1.0, 0.5, 0.2], [0.5, 0.3, 0.2])
    light = [Instance(i, 0, 10, 0.2) for i in range(3)]
    placed = place(light, devices, flow)
    assert placed.feasible and placed.cost == 0 and len(set(placed.devices)) == 1
    busy = [Instance(i, 0, 10, 0.45) for i in range(3)]  # two fit on a device, not three
    placed = place(busy, devices, flow)
    assert placed.feasible and placed.cost > 0 and len(set(placed.devices)) >= 2
    assert set(placed.devices) <= {"a", "b"}  # the third on the same server: the network costs ten times more


def test_no_room_is_an_explicit_infeasible_result():
    devices = [Device("a", "s1", 10)]
    placed = place([Instance(0, 0, 50, 0.1)], devices, np.zeros((1, 1)))
    assert not placed.feasible and placed.devices == ()
    assert not plan([1.0], [1e-3], [50], np.zeros((1, 1)), devices, rate_qps=10).feasible


def test_algorithm_3_takes_the_most_replicas_that_fit():
    devices = [Device(f"d{k}", f"s{k // 2}", 200) for k in range(4)]
    reach, latency, memory = [1.0, 0.4, 0.2], [1e-3, 2e-3, 8e-3], [30, 60, 120]
    flow = chain_flow(reach, [0.6, 0.2, 0.2])
    placed = plan(reach, latency, memory, flow, devices, rate_qps=300)
    assert placed.feasible
    assert sum(s.memory_mb for s in placed.instances) <= 800
    used = {d: sum(s.utilisation for s, p in zip(placed.instances, placed.devices) if p == d) for d in placed.devices}
    assert all(u <= 1 + 1e-9 for u in used.values())
    assert len(placed.instances) >= 4  # more than one replica somewhere: the budget grew until memory ran out
