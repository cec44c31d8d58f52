"""HybridServe's planner: replicas R ∝ ρl within a budget, the placement program (Eqs. 2-4) against brute force,
and Algorithm 3."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from scheduler_sidecar.systems.hybridserve.placement import (
    BALANCED,
    NETWORK_COST,
    SAME_SERVER_COST,
    Device,
    Instance,
    instances_of,
    place,
    plan,
    replicas,
)

REACH, LATENCY = (1.0, 0.4, 0.35, 0.17), (1e-3, 2e-3, 4e-3, 8e-3)  # the vit-4 AP proportions (Table III)


def chain_flow(reach, answered) -> np.ndarray:
    """``flow`` without skips: model i forwards what reaches it and it does not answer to model i + 1."""
    n = len(reach)
    flow = np.zeros((n, n))
    for i in range(n - 1):
        flow[i, i + 1] = reach[i] - answered[i]
    return flow


def scale_interval(r, work):
    """[low, high): the scales λ whose rounding max(1, round-half-up(λ w)) is r."""
    low = max([(k - 0.5) / w for k, w in zip(r, work) if k > 1], default=0.0)
    return low, min((k + 0.5) / w for k, w in zip(r, work))


@pytest.mark.parametrize("budget", [4, 5, 6, 9, 16, 23, 40])
def test_replicas_are_the_rounding_at_the_largest_scale_within_the_budget(budget):
    work = np.array(REACH) * LATENCY
    r = replicas(REACH, LATENCY, budget)
    assert sum(r) <= budget and min(r) >= 1
    low, high = scale_interval(r, work)
    assert low < high  # r is max(1, round(λ ρl)) for a common λ: proportional to ρl within rounding
    # just above that interval the next rounding adds a replica to every model whose breakpoint is at ``high``
    stepping = sum(1 for k, w in zip(r, work) if math.isclose((k + 0.5) / w, high, rel_tol=1e-9))
    assert sum(r) + stepping > budget


def test_replicas_approach_the_proportions_of_the_work():
    r = np.array(replicas(REACH, LATENCY, 80))
    work = np.array(REACH) * LATENCY
    assert np.allclose(r / r.sum(), work / work.sum(), atol=0.02)


def test_replicas_need_one_instance_per_model_and_keep_one_for_an_unreached_model():
    with pytest.raises(ValueError, match="at least 4"):
        replicas(REACH, LATENCY, 3)
    with pytest.raises(ValueError, match="rounding"):
        replicas(REACH, LATENCY, 8, "ceil")
    assert replicas(REACH, LATENCY, 4) == (1, 1, 1, 1)
    r = replicas((1.0, 0.5, 0.0), (1e-3, 2e-3, 8e-3), 7)
    assert r[2] == 1 and sum(r) <= 7 and r[1] == r[0]


@pytest.mark.parametrize("seed", range(6))
def test_balanced_replicas_leave_the_busiest_model_least_busy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 5))
    reach = np.sort(rng.uniform(0.01, 1.0, n))[::-1]
    reach[0] = 1.0
    latency = np.sort(rng.uniform(1e-4, 1e-2, n))
    work = reach * latency
    for budget in range(n, n + 9):
        r = np.array(replicas(reach, latency, budget, BALANCED))
        assert r.sum() == budget and r.min() >= 1
        best = min(max(work / np.array(c)) for c in itertools.product(range(1, budget - n + 2), repeat=n)
                   if sum(c) <= budget)
        assert max(work / r) == pytest.approx(best)
    # a model no request reaches keeps its one replica
    assert replicas((1.0, 0.0, 0.5), (1e-3, 1e-3, 4e-3), 9, BALANCED) == (3, 1, 5)


def brute_force(instances, devices, flow):
    """The least Eq. 2 cost over every assignment within memory and Σu <= 1, None if there is none."""
    copies = np.bincount([s.model for s in instances])
    best = None
    for assign in itertools.product(range(len(devices)), repeat=len(instances)):
        on = [[s for s, a in zip(instances, assign) if a == g] for g in range(len(devices))]
        if any(sum(s.memory_mb for s in on[g]) > d.memory_mb + 1e-9 or sum(s.utilisation for s in on[g]) > d.speed
               + 1e-9 for g, d in enumerate(devices)):
            continue
        cost = 0.0
        for (a, s), (b, t) in itertools.combinations(enumerate(instances), 2):
            i, j = sorted((s.model, t.model))
            if i == j or assign[a] == assign[b]:
                continue
            same_server = devices[assign[a]].server == devices[assign[b]].server
            cost += flow[i, j] / (copies[i] * copies[j]) * (SAME_SERVER_COST if same_server else NETWORK_COST)
        best = cost if best is None else min(best, cost)
    return best


def random_case(seed):
    """3 models, 4-6 instances, 3 devices on 2 servers (one of them a faster kind); a skip edge 0 -> 2."""
    rng = np.random.default_rng(seed)
    devices = [Device("a", "s1", 100), Device("b", "s1", float(rng.uniform(40, 100))),
               Device("c", "s2", float(rng.uniform(60, 120)), speed=2.0)]
    reps = (1, 2, 1) if seed % 3 == 0 else tuple(int(k) for k in rng.integers(1, 3, 3))
    reps = reps if sum(reps) >= 4 else (2, 1, 1)
    instances = [Instance(i, r, float(rng.uniform(20, 60)), float(rng.uniform(0.1, 0.8)))
                 for i in range(3) for r in range(reps[i])]
    forward, skip = rng.uniform(0.2, 0.6), rng.uniform(0.0, 0.2)
    flow = np.array([[0, forward, skip], [0, 0, forward * rng.uniform(0.2, 0.7)], [0, 0, 0]])
    return instances, devices, flow


@pytest.mark.parametrize("seed", range(10))
def test_the_placement_program_equals_brute_force(seed):
    instances, devices, flow = random_case(seed)
    placed, expected = place(instances, devices, flow), brute_force(instances, devices, flow)
    assert placed.feasible == (expected is not None), placed.status
    if expected is None:
        return
    assert placed.cost == pytest.approx(expected, abs=1e-6)
    by_name = {d.name: d for d in devices}
    for d in devices:  # the placement it returns keeps Eqs. 3 and 4
        on = [s for s, p in zip(instances, placed.devices) if p == d.name]
        assert sum(s.memory_mb for s in on) <= d.memory_mb + 1e-6
        assert sum(s.utilisation / by_name[d.name].speed for s in on) <= 1 + 1e-6


def test_the_brute_force_cases_include_infeasible_ones():
    assert any(brute_force(*random_case(seed)) is None for seed in range(10))
    assert any(brute_force(*random_case(seed)) is not None for seed in range(10))


def test_a_chain_shares_a_device_until_utilisation_forbids_it():
    devices = [Device("a", "s1", 1000), Device("b", "s1", 1000), Device("c", "s2", 1000)]
    flow = chain_flow([1.0, 0.5, 0.2], [0.5, 0.3, 0.2])
    placed = place([Instance(i, 0, 10, 0.2) for i in range(3)], devices, flow)
    assert placed.feasible and placed.cost == 0 and len(set(placed.devices)) == 1
    placed = place([Instance(i, 0, 10, 0.45) for i in range(3)], devices, flow)  # two fit on a device, not three
    assert placed.feasible and placed.cost > 0 and len(set(placed.devices)) == 2
    assert set(placed.devices) <= {"a", "b"}  # one server: the network costs ten times more
    # the cheaper edge is the one cut: 0 -> 1 carries 0.5 of the requests, 1 -> 2 carries 0.2
    assert placed.cost == pytest.approx(0.2 * SAME_SERVER_COST)


def test_no_room_is_an_explicit_infeasible_result():
    devices = [Device("a", "s1", 10)]
    placed = place([Instance(0, 0, 50, 0.1)], devices, np.zeros((1, 1)))
    assert not placed.feasible and placed.status == "Infeasible" and placed.devices == ()
    assert placed.cost == math.inf
    planned = plan([1.0], [1e-3], [50], np.zeros((1, 1)), devices, rate_qps=10)
    assert not planned.feasible and "no replica count fits" in planned.status


def test_algorithm_3_places_the_most_replicas_that_fit():
    devices = [Device(f"d{k}", f"s{k // 2}", 200) for k in range(4)]
    reach, latency, memory = [1.0, 0.4, 0.2], [1e-3, 2e-3, 8e-3], [30, 60, 120]
    flow = chain_flow(reach, [0.6, 0.2, 0.2])
    placed = plan(reach, latency, memory, flow, devices, rate_qps=300)
    assert placed.feasible and placed.replicas == replicas(reach, latency, len(placed.instances))
    assert len(placed.instances) > 3  # the budget grew past one replica per model
    # the next larger replicas do not fit: memory runs out on some device
    bigger = next(r for b in range(len(placed.instances) + 1, 17)
                  if sum(r := replicas(reach, latency, b)) > len(placed.instances))
    assert not place(instances_of(bigger, reach, latency, memory, 300), devices, flow).feasible


def test_eight_instances_on_four_devices_with_a_skip_solve_to_optimality():
    devices = [Device(f"d{k}", f"s{k // 2}", 400, speed=1.0 if k % 2 else 0.5) for k in range(4)]
    reps = replicas(REACH, LATENCY, 8)
    assert sum(reps) == 8
    flow = chain_flow(REACH, [0.6, 0.05, 0.18, 0.17])
    flow[0, 2] = 0.05  # a skip
    placed = place(instances_of(reps, REACH, LATENCY, [50, 80, 120, 200], rate_qps=150), devices, flow)
    assert placed.status == "Optimal" and len(placed.devices) == 8
