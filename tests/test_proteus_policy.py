"""Proteus' data path and controller: adaptive batching (§5), routing by the plan, plan changes, and the baselines."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import Outcome, Query
from scheduler_sidecar.experiments.proteus.data import Counts, load_counts, load_profiles
from scheduler_sidecar.experiments.proteus.infaas import SLACK, InfaasPlanner
from scheduler_sidecar.experiments.proteus.systems import SYSTEMS, Setup, simulate
from scheduler_sidecar.sim.results import OUTCOME_CODES
from scheduler_sidecar.systems.proteus.batching import Adaptive, Aimd, AimdFull, Nexus, NexusFill, Single
from scheduler_sidecar.systems.proteus.planner import ProteusConfig, ProteusPlanner
from tests.builders import make_queue

LATENCY = {1: 10_000, 2: 14_000, 3: 18_000, 4: 18_000, 5: 30_000, 6: 30_000, 7: 30_000, 8: 30_000}  # us, padded


def latency(k: int) -> int:
    return LATENCY[k]


def queue(*deadlines_ms: float) -> QueueView:
    return make_queue(Query(round(d * 1000), i, i, 0) for i, d in enumerate(deadlines_ms)).view()


def test_a_lone_query_on_an_idle_worker_starts_at_its_deadline_minus_t2():
    action = Adaptive().decide(0, queue(100), latency, max_batch=8)
    assert action.dispatch == 0 and action.wakeup_us == 100_000 - LATENCY[2]
    at_wakeup = Adaptive().decide(action.wakeup_us, queue(100), latency, max_batch=8)
    assert at_wakeup.dispatch == 1  # case 1: no second query came in time


def test_a_second_query_before_the_wait_ends_waits_for_a_third():
    action = Adaptive().decide(50_000, queue(100, 120), latency, max_batch=8)
    assert action.wakeup_us == 100_000 - LATENCY[3]  # case 2: repeat with q' = q + 1
    assert Adaptive().decide(84_000, queue(100, 120), latency, max_batch=8).dispatch == 2  # past T_max_wait(3)


def test_a_full_batch_runs_at_once_and_never_exceeds_b_max():
    q = queue(*[500] * 12)
    assert Adaptive().decide(0, q, latency, max_batch=4).dispatch == 4
    assert NexusFill().decide(0, q, latency, max_batch=4).dispatch == 4


def test_hopeless_heads_are_dropped_and_a_batch_never_makes_its_head_late():
    # at t = 95 ms the head (deadline 100) cannot finish even alone; the next (deadline 105) not in a batch of 2
    q = queue(100, 105, 300)
    action = Adaptive().decide(95_000, q, latency, max_batch=8)
    assert action.drop == 2 and action.dispatch == 0
    for strategy in (Adaptive(), Nexus(), NexusFill(), Single()):
        for now in range(0, 300_000, 5_000):
            a = strategy.decide(now, queue(100, 150, 200, 250), latency, max_batch=4)
            if a.dispatch:
                assert now + latency(a.dispatch) <= 100_000, (strategy.name, now)


def test_nexus_is_work_conserving_and_the_artifacts_nexus_waits():
    assert Nexus().decide(0, queue(100), latency, max_batch=8).dispatch == 1
    waiting = NexusFill().decide(0, queue(100), latency, max_batch=8)
    assert waiting.dispatch == 0 and waiting.wakeup_us == 100_000 - LATENCY[8]


def test_aimd_grows_additively_and_backs_off_on_lateness():
    aimd = Aimd()
    for _ in range(5):
        aimd.completed(late=False)
    assert aimd.decide(0, queue(*[900] * 20), latency, max_batch=8).dispatch == 6
    aimd.completed(late=True)
    assert aimd.decide(0, queue(*[900] * 20), latency, max_batch=8).dispatch == 5
    full = AimdFull()
    full.completed(late=False)
    assert full.decide(0, queue(900), latency, max_batch=8).dispatch == 0  # only a full batch of 2 goes
    assert full.decide(0, queue(900, 900, 900), latency, max_batch=8).dispatch == 2


def small_setup(**config) -> tuple[Setup, Counts]:
    profiles = load_profiles()
    counts = load_counts()
    families = ("efficientnet", "mobilenet", "resnet")
    cols = [counts.families.index(f) for f in families]
    trace = Counts(families, counts.per_second[:40, cols])
    return Setup({f: profiles[f] for f in families}, {"cpu": 4, "pascal": 2, "ampere": 2}, 300.0,
                 ProteusConfig(**config)), trace


def test_the_ewma_demand_and_the_burst_trigger():
    setup, _ = small_setup(burst_s=2)
    planner = ProteusPlanner(setup.profiles, [(0, "cpu"), (1, "pascal")], {f: 300.0 for f in setup.profiles},
                             setup.config, initial_demand={"mobilenet": 10.0})
    assert planner.demand(0)["mobilenet"] == 10.0  # before a whole second: the initial guess
    planner.plan(0, None)
    asked = []
    for second in range(6):
        rate = 10 if second < 3 else 40
        for i in range(rate):
            asked.append(planner.observe_arrival(second * 1_000_000 + i * 1_000_000 // rate,
                                                 Query(0, 0, 0, 0, "mobilenet")))
    assert not any(asked[:40])  # at the planned rate nothing asks
    assert any(asked)  # two whole seconds at 4x the planned rate do
    counts = [10, 10, 10, 40, 40]
    alpha = 1 / (1 + 1.6)
    weights = [(1 - alpha) ** i for i in range(5)]
    expected = sum(w * c for w, c in zip(weights, reversed(counts))) / sum(weights)
    assert planner.demand(5_500_000)["mobilenet"] == pytest.approx(expected)


def test_a_plan_change_moves_few_workers_and_idle_workers_keep_their_variant():
    setup, _ = small_setup()
    workers = [(i, k) for i, k in enumerate(["cpu"] * 4 + ["pascal"] * 2 + ["ampere"] * 2)]
    planner = ProteusPlanner(setup.profiles, workers, {f: 300.0 for f in setup.profiles}, setup.config,
                             initial_demand={"efficientnet": 50.0, "mobilenet": 200.0, "resnet": 20.0})
    first = planner.plan(0, None)
    assert len(first.placement) == len(workers)  # every worker got a variant at the start
    same = planner.plan(500_000, None)  # within the first second the demand is still the initial guess
    assert same.placement == first.placement  # nothing moves: every worker keeps what it holds
    for routes in same.detail.routes.values():
        assert sum(r.share for r in routes) == pytest.approx(1.0)
        assert {r.worker_id for r in routes} <= {wid for wid, _ in workers}


def test_simulated_proteus_serves_a_small_cluster_and_every_query_ends_once():
    setup, trace = small_setup()
    runs = {name: simulate(system, setup, trace) for name, system in
            (("proteus", SYSTEMS["proteus"]), ("clipper-ha", SYSTEMS["clipper-ha"]), ("clipper-ht", SYSTEMS["clipper-ht"]))}
    for run in runs.values():
        assert len(run.result.outcome) == trace.total
        assert np.all(run.result.outcome >= 0)
    m = {name: run.metrics() for name, run in runs.items()}
    late = OUTCOME_CODES[Outcome.LATE]
    assert np.count_nonzero(runs["proteus"].result.outcome == late) == 0  # adaptive batching is never late
    assert m["proteus"]["accuracy"] > m["clipper-ht"]["accuracy"] + 5
    assert m["proteus"]["violation_ratio"] < m["clipper-ha"]["violation_ratio"] / 2
    assert runs["proteus"].plans > 1


def test_infaas_scales_a_busy_type_up_and_an_idle_one_down():
    setup, _ = small_setup()
    workers = [(i, k) for i, k in enumerate(["cpu"] * 4 + ["pascal"] * 2 + ["ampere"] * 2)]
    planner = InfaasPlanner(setup.profiles, workers, {f: 300.0 for f in setup.profiles}, setup.config,
                            initial_demand={"efficientnet": 20.0, "mobilenet": 20.0, "resnet": 20.0})
    first = planner.plan(0, None)  # the start is Proteus' MILP
    before = {q: planner._capacity(q) for q in setup.profiles}
    accuracy = {q: max(planner.types[q].variant(r.variant).accuracy for r in first.detail.routes[q])
                for q in setup.profiles}
    for i in range(600):  # one second: mobilenet at 600 q/s, the others silent
        planner.observe_arrival(1_000_000 + i * 1000, Query(0, 0, 0, 0, "mobilenet"))
    plan = planner.plan(2_000_000, None)
    assert planner._capacity("mobilenet") >= 600 / (1 - SLACK) > before["mobilenet"]
    assert planner._capacity("resnet") < before["resnet"] or planner._capacity("efficientnet") < before["efficientnet"]
    routes = plan.detail.routes["mobilenet"]
    assert sum(r.share for r in routes) == pytest.approx(1.0)
    assert all(planner.types["mobilenet"].variant(r.variant).accuracy <= accuracy["mobilenet"] for r in routes)


def test_a_type_no_worker_can_serve_does_not_empty_the_plan():
    """A query type whose variants all miss SLO/2 on every kind is left out; the others are planned as before."""
    setup, _ = small_setup()
    slo = {f: 300.0 for f in setup.profiles} | {"resnet": 1.0}  # 1 ms: no resnet variant fits anywhere
    planner = ProteusPlanner(setup.profiles, [(i, "pascal") for i in range(4)], slo, setup.config,
                             initial_demand={"efficientnet": 50.0, "mobilenet": 50.0, "resnet": 50.0})
    plan = planner.plan(0, None)
    assert plan.detail.routes["resnet"] == ()
    assert plan.detail.routes["efficientnet"] and plan.detail.routes["mobilenet"]
    assert plan.detail.solution.scale == 1.0


@pytest.mark.parametrize("bad", [{"period_s": 0}, {"overload_step": 0}, {"ewma_window_s": 0}, {"burst_s": 1.5},
                                 {"headroom": -1}])
def test_proteus_config_refuses_values_that_would_hang_or_divide_by_zero(bad):
    with pytest.raises(ValueError, match="proteus"):
        ProteusConfig(**bad)


def test_a_waiting_worker_keeps_the_profiles_tail_as_its_guard():
    """Adaptive batching waits until d - T(q+1) less the guard: the p99 over p50 of that batch on the worker's
    device kind (none where the profile's p99 is its p50), plus a fixed margin."""
    from dataclasses import replace

    from scheduler_sidecar.core.plan import Plan
    from scheduler_sidecar.core.profile import LatencyCurve
    from scheduler_sidecar.core.records import WorkerState
    from scheduler_sidecar.systems.proteus.policy import Proteus
    from scheduler_sidecar.systems.proteus.routing import Route, Routing
    from tests.builders import Routed, make_profile

    def wakeup(tail_ms: float, guard_us: int = 0) -> int:
        profile = make_profile()
        variants = tuple(replace(v, latency={d: LatencyCurve(c.batch_sizes, c.p50_ms, tuple(x + tail_ms for x in c.p50_ms))
                                             for d, c in v.latency.items()}) for v in profile.variants)
        policy = Proteus(replace(profile, variants=variants), query_type="m", guard_us=guard_us)
        policy.observe_plan(0, Plan(0, {}, Routing({"m": (Route(0, variants[-1].id, 1.0, 4),)}, {"m": 1.0})))
        queues = Routed(policy, [WorkerState(0)])
        queues.arrive(0, Query(100_000, 0, 0, 0))
        return queues.decide(0).wakeup_us

    p50_of_two = round(make_profile().variants[-1].latency["cpu"].p50_at(2) * 1000)  # the most accurate variant's
    assert wakeup(0.0) == 100_000 - p50_of_two
    assert wakeup(3.0) == 100_000 - p50_of_two - 3_000
    assert wakeup(3.0, guard_us=1_000) == 100_000 - p50_of_two - 4_000


def first_ask_us(window: str, shift_us: int) -> int:
    """When the planner first asks for a burst plan: 10 queries/s planned, then 40/s from 3 s, every arrival
    ``shift_us`` later."""
    setup, _ = small_setup(burst_window=window)
    planner = ProteusPlanner(setup.profiles, [(0, "cpu"), (1, "pascal")], {f: 300.0 for f in setup.profiles},
                             setup.config, initial_demand={"mobilenet": 10.0})
    planner.plan(0, None)
    for second in range(8):
        rate = 10 if second < 3 else 40
        for i in range(rate):
            now = shift_us + second * 1_000_000 + i * 1_000_000 // rate
            if planner.observe_arrival(now, Query(0, 0, 0, 0, "mobilenet")):
                return now - shift_us
    raise AssertionError("no burst plan asked for")


def test_the_sliding_burst_rule_moves_a_plan_by_the_arrivals_jitter_not_by_a_second():
    """The same arrivals a little later ask for their plan as much later (the default rule); counted in the clock's
    whole seconds, where the seconds fall moved the ask by most of a second (the rule before, still a choice)."""
    shifts = (0, 3_000, 250_000, 600_000, 997_000)
    sliding = {first_ask_us("sliding", s) for s in shifts}
    assert len(sliding) == 1  # relative to the arrivals, the same instant whatever the shift
    assert 4_000_000 < sliding.pop() < 5_000_000  # two seconds into the burst at 4x the plan
    whole = [first_ask_us("whole-seconds", s) for s in shifts]
    assert max(whole) - min(whole) > 500_000
