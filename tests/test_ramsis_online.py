"""RAMSIS online (§3.2): round-robin, load monitor, per-worker lookup, and expectation vs simulation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loadtest.traces import poisson
from scheduler_sidecar.core.records import Query, WorkerState
from scheduler_sidecar.sim.simulator import SimConfig, Simulator
from scheduler_sidecar.systems import make_policy, policies
from scheduler_sidecar.systems.ramsis import LATENCY_CSV
from scheduler_sidecar.systems.ramsis.generate import generate_set
from scheduler_sidecar.systems.ramsis.mdp import MdpSpec
from scheduler_sidecar.systems.ramsis.model_table import from_profile, load_summary_csv, to_profile
from scheduler_sidecar.systems.ramsis.online import LoadMonitor, LoadTable, RoundRobin
from tests.builders import Routed

SLO_MS, K, LOAD_QPS = 150.0, 4, 120.0
# expectation (§5.1) vs the simulator on a 600 s Poisson trace (72 k queries): accuracy per
# satisfied query within ACC_TOL points; the expected violation rate is an upper bound (the
# MDP counts a whole batch late and rounds slack down) up to VIOLATION_TOL points
ACC_TOL_POINTS = 0.5
VIOLATION_TOL_POINTS = 0.2


@pytest.fixture(scope="module")
def image_profile():
    return to_profile(load_summary_csv(LATENCY_CSV, "image_cloud_cpu"))


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, image_profile):
    out = tmp_path_factory.mktemp("ramsis") / "k4"
    table = from_profile(image_profile).pareto()
    generate_set(table, MdpSpec(SLO_MS, K, LOAD_QPS), [LOAD_QPS], out, refine=False)
    return out


def q(i: int, arrival_us: int, slo_us: int = 150_000) -> Query:
    return Query(arrival_us + slo_us, i, i, arrival_us)


def test_profile_from_the_csv_runs_p95_deterministically(image_profile):
    """The simulator's p50 and the MDP's p99 both read the authors' p95 (digest A7)."""
    table = load_summary_csv(LATENCY_CSV, "image_cloud_cpu")
    v = image_profile.variant("efficientnet_b0")
    assert v.latency["cpu"].p50_ms == v.latency["cpu"].p99_ms
    assert v.latency["cpu"].p50_at(1) == pytest.approx(table.latency(table.model_ids.index("efficientnet_b0"), 1))
    assert np.allclose(from_profile(image_profile).latency_ms, table.latency_ms[
        [table.model_ids.index(m) for m in from_profile(image_profile).model_ids]])


def test_round_robin_is_global_over_arrivals_and_skips_slots_with_no_worker():
    """Arrival i goes to slot i mod K; with fewer live workers than K, the slots beyond them are skipped."""
    balancer = RoundRobin(3)
    assert [balancer.pick(3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [balancer.pick(2) for _ in range(4)] == [1, 0, 1, 0]
    assert balancer.pick(0) is None


def test_a_lost_workers_queue_is_routed_again_and_the_others_keep_theirs(image_profile, policy_dir):
    """In the engine: worker 1 fails while every worker holds a queue; only its queries move, round-robin."""
    from scheduler_sidecar.core.engine import Engine, QueryType

    class Idle:  # runs nothing, so the queues stay as routed
        def run_batch(self, batch):
            pass

        def wake_at(self, time_us):
            pass

    policy = make_policy("ramsis", image_profile, policy_dir=policy_dir, slo_ms=SLO_MS, workers=K)
    workers = [WorkerState(i, busy_until_us=10**12) for i in range(K)]  # busy: nothing is dispatched
    engine = Engine([QueryType("", policy)], workers, Idle(), clock=lambda: 0, on_end=lambda *a: None)
    for i in range(2 * K):
        engine.arrive(q(i, 0))
    routes = engine.types[""].routes
    before = {w: [x.id for x in routes.view(w).scan()] for w in range(K)}
    assert before == {w: [w, w + K] for w in range(K)}
    engine.set_health(1, False)
    after = {w: [x.id for x in routes.view(w).scan()] for w in range(K)}
    assert after[1] == [] and sorted(after[0] + after[2] + after[3]) == list(range(2 * K))
    assert all(set(before[w]) <= set(after[w]) for w in (0, 2, 3))


def test_load_monitor_counts_a_sliding_window():
    monitor = LoadMonitor(500.0)
    for t_us in range(0, 1_000_000, 1000):  # 1000 q/s for 1 s
        monitor.observe(t_us)
    assert monitor.load_qps(999_999) == pytest.approx(1000.0, rel=0.01)
    assert monitor.load_qps(1_400_000) == pytest.approx(200.0, rel=0.02)  # only the last 100 ms of arrivals remain
    assert monitor.load_qps(2_000_000) == 0.0


def test_load_table_picks_the_lowest_load_at_or_above():
    table = LoadTable([(400.0, "a"), (800.0, "b"), (1200.0, "c")])
    assert [table.pick(x) for x in (0.0, 400.0, 401.0, 800.0, 1199.0)] == ["a", "a", "b", "b", "c"]
    assert table.out_of_range == 0
    assert table.pick(5000.0) == "c" and table.out_of_range == 1


def test_each_worker_looks_up_its_own_queue(image_profile, policy_dir):
    """A free worker's action comes from (its queue length, its head's slack), not the global queue."""
    policy = make_policy("ramsis", image_profile, policy_dir=policy_dir, slo_ms=SLO_MS, workers=K)
    workers = [WorkerState(i) for i in range(K)]
    queues = Routed(policy, workers)
    for i in range(6):  # slots 0 and 1 get two queries each, slots 2 and 3 one each
        queues.arrive(1000 * i, q(i, 1000 * i))
    workers[1] = WorkerState(1, busy_until_us=10**9)
    now = 20_000
    decision = queues.decide(now)
    by_worker = {d.worker_id: d for d in decision.dispatches}
    assert set(by_worker) == {0, 2, 3}  # worker 1 is busy
    assert by_worker[0].query_ids == (0, 4) and by_worker[2].query_ids == (2,) and by_worker[3].query_ids == (3,)
    mdp = policy.policies[0]
    for wid, head in ((0, 0), (2, 2)):
        n = len(by_worker[wid].query_ids)
        slack_ms = (q(head, 1000 * head).deadline_us - now) / 1000
        assert (by_worker[wid].variant_id, n) == mdp.action(n, slack_ms)
    for d in decision.dispatches:  # as the engine carries it out
        workers[d.worker_id] = WorkerState(d.worker_id, busy_until_us=now + 1000)
    assert queues.decide(now).is_empty  # worker 1's queries wait for worker 1


def test_policy_options_are_validated(image_profile, policy_dir):
    with pytest.raises(ValueError, match="policy_dir"):
        make_policy("ramsis", image_profile)
    with pytest.raises(ValueError, match="K = 4 workers, not 5"):
        make_policy("ramsis", image_profile, policy_dir=str(policy_dir), workers=5)
    with pytest.raises(ValueError, match="slo_ms and workers"):
        make_policy("jellyfish", image_profile)
    assert {"ramsis", "jellyfish", "modelswitching"} <= set(policies())


def test_expectation_agrees_with_the_simulator(image_profile, policy_dir):
    """§7.3.1: simulated accuracy follows the expectation; the expected violation rate bounds the simulated one."""
    policy = make_policy("ramsis", image_profile, policy_dir=policy_dir, slo_ms=SLO_MS, workers=K,
                         late_queries="serve")
    expected = policy.policies[0]
    arrival_us = np.round(poisson(LOAD_QPS, 600.0, seed=3).arrival_s * 1e6).astype(np.int64)
    result = Simulator(policy, SimConfig(workers=K)).run(arrival_us, arrival_us + round(SLO_MS * 1000))
    s = result.summary()
    violation = (s["late"] + s["dropped"]) / s["queries"]
    assert s["dropped"] == 0
    assert abs(100 * (s["mean_serving_accuracy"] - expected.expected_accuracy)) < ACC_TOL_POINTS
    assert 100 * violation < 100 * expected.meta["expected_violation_rate"] + VIOLATION_TOL_POINTS


@pytest.mark.parametrize("name", ["ramsis", "jellyfish", "modelswitching"])
def test_every_query_ends_exactly_once(image_profile, policy_dir, name):
    """Overload, a worker failure (its batch is retried without observe_arrival) and late queries."""
    options = {"slo_ms": SLO_MS, "workers": K, "late_queries": "serve"}
    options |= {"policy_dir": policy_dir} if name == "ramsis" else {"loads": [100.0, 200.0, 400.0]}
    if name == "modelswitching":
        options["profile_s"] = 5.0
    policy = make_policy(name, image_profile, **options)
    arrival_us = np.round(poisson(400.0, 10.0, seed=1).arrival_s * 1e6).astype(np.int64)
    result = Simulator(policy, SimConfig(workers=K, fail_at_s=(3.0,))).run(arrival_us, arrival_us + 150_000)
    s = result.summary()  # the simulator raises if a query ends twice or never
    assert s["met"] + s["late"] + s["dropped"] + s["failed"] == len(arrival_us)
    assert s["late"] > 0 and s["failed"] == 0


def test_simulate_command_runs_ramsis_on_the_authors_csv(tmp_path, policy_dir, capsys):
    from loadtest.traces import with_slo
    from scheduler_sidecar.cli import main

    trace = tmp_path / "t.txt"
    with_slo(poisson(LOAD_QPS, 5.0, seed=2), SLO_MS).save(trace)
    base = ["simulate", "--profile", str(LATENCY_CSV), "--profile-set", "image_cloud_cpu", "--trace", str(trace),
            "--workers", str(K), "--slo-ms", str(SLO_MS), "--json"]
    assert main([*base, "--policy", "ramsis", "--ramsis-policies", str(policy_dir)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dropped"] == 0 and out["met"] + out["late"] == out["queries"] > 0
    assert main([*base, "--policy", "ramsis"]) == 2
    assert "--ramsis-policies" in capsys.readouterr().err
