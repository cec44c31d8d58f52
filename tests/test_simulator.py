"""The discrete-event simulator: conservation, determinism, failures, dynamics."""

import numpy as np
import pytest

from scheduler_sidecar.core.plan import Plan, Planner
from scheduler_sidecar.core.records import Outcome
from scheduler_sidecar.sim.results import OUTCOME_CODES
from scheduler_sidecar.sim.simulator import SimConfig, Simulator
from scheduler_sidecar.sim.world import World
from scheduler_sidecar.systems import make_policy, policies
from scheduler_sidecar.systems.superserve.slackfit import SlackFit
from tests.builders import POLICY_OPTIONS, make_profile

PROFILE = make_profile(n_variants=5, batch_sizes=tuple(range(1, 17)))


def bursty_arrivals(n: int = 4000, seed: int = 0) -> np.ndarray:
    """Poisson arrivals alternating between 300 and 3000 q/s every half second."""
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    while len(out) < n:
        rate = 3000 if int(t * 2) % 2 else 300
        t += rng.exponential(1 / rate)
        out.append(t)
    return np.round(np.array(out) * 1e6).astype(np.int64)


@pytest.mark.parametrize("name", sorted(policies()))
def test_every_query_ends_exactly_once(name):
    """met + late + dropped + failed == queries, for every policy, with failures and noise."""
    arrival = bursty_arrivals()
    config = SimConfig(workers=3, seed=1, latency_noise="tail", fail_at_s=(0.5, 1.0))
    policy = make_policy(name, PROFILE, **POLICY_OPTIONS.get(name, {}))
    result = Simulator(policy, config).run(arrival, arrival + 30_000)
    s = result.summary()
    assert s["met"] + s["late"] + s["dropped"] + s["failed"] == s["queries"] == len(arrival)
    served = np.isin(result.outcome, [OUTCOME_CODES[Outcome.MET], OUTCOME_CODES[Outcome.LATE]])
    assert np.all(result.finish_us[served] >= result.arrival_us[served])
    assert sum(b.batch_size for b in result.batches) >= served.sum()  # retried batches count twice
    assert len(result.records()) == len(arrival)


def test_deterministic_under_a_seed():
    arrival = bursty_arrivals(2000)
    runs = [Simulator(make_policy("slackfit", PROFILE), SimConfig(workers=2, seed=s, latency_noise="tail"))
            .run(arrival, arrival + 30_000) for s in (7, 7, 8)]
    assert np.array_equal(runs[0].finish_us, runs[1].finish_us)
    assert runs[0].variant == runs[1].variant
    assert not np.array_equal(runs[0].finish_us, runs[2].finish_us)


def test_failed_workers_batches_are_retried_and_capacity_shrinks():
    """After failures the survivors serve everything left; with all workers gone queries fail."""
    arrival = bursty_arrivals(3000)
    some = Simulator(make_policy("slackfit", PROFILE), SimConfig(workers=4, fail_at_s=(0.3, 0.6, 0.9))).run(
        arrival, arrival + 30_000).summary()
    assert some["failed"] == 0 and some["met"] > 0
    every = Simulator(make_policy("slackfit", PROFILE), SimConfig(workers=2, fail_at_s=(0.2, 0.4))).run(
        arrival, arrival + 30_000)
    failed = every.outcome == OUTCOME_CODES[Outcome.FAILED]
    assert failed.any() and np.all(every.arrival_us[failed] >= 0.2e6)


def test_slackfit_beats_fixed_baselines_on_a_burst():
    """On a bursty trace SlackFit keeps attainment near INFaaS's with more accuracy than INFaaS."""
    arrival = bursty_arrivals(6000)
    res = {name: Simulator(make_policy(name, PROFILE), SimConfig(workers=2)).run(arrival, arrival + 30_000).summary()
           for name in ("slackfit", "infaas", "clipper")}
    assert res["slackfit"]["mean_serving_accuracy"] > res["infaas"]["mean_serving_accuracy"]
    assert res["slackfit"]["slo_attainment"] > res["clipper"]["slo_attainment"]


def test_dynamics_cover_the_run():
    arrival = bursty_arrivals(3000)
    result = Simulator(make_policy("slackfit", PROFILE), SimConfig(workers=2)).run(arrival, arrival + 30_000)
    dyn = result.dynamics(bin_s=0.5)
    assert set(dyn) == {"time_s", "ingest_qps", "served_accuracy", "mean_batch_size", "slo_attainment"}
    assert dyn["ingest_qps"].sum() * 0.5 == pytest.approx(len(arrival))
    assert np.nanmax(dyn["mean_batch_size"]) > np.nanmin(dyn["mean_batch_size"])


def test_bad_traces_are_rejected():
    with pytest.raises(ValueError, match="non-decreasing"):
        Simulator(make_policy("slackfit", PROFILE), SimConfig(workers=1)).run([5, 3], [10, 10])
    with pytest.raises(ValueError, match="before the start"):
        Simulator(make_policy("slackfit", PROFILE), SimConfig(workers=1)).run([5, 6], [10, 10], start_us=6)


class Periodic(Planner):
    """Plans every 100 ms, recording when it was asked to."""

    period_us = 100_000

    def __init__(self) -> None:
        self.asked: list[int] = []

    def plan(self, now_us, demand):
        self.asked.append(now_us)
        return Plan(now_us)


class Watching(SlackFit):
    """SlackFit, recording each plan it is given: (when it was asked for, when it came into force)."""

    def __init__(self, profile) -> None:
        super().__init__(profile)
        self.seen: list[tuple[int, int]] = []

    def observe_plan(self, now_us, plan):
        self.seen.append((plan.created_us, now_us))


def test_a_run_starts_at_its_start_and_plans_come_into_force_late():
    """A live run's clock and solve times taken over: the first plan is asked for at start_us, each comes into
    force plan_delay_us later, and the period counts from then, as the live driver's does."""
    planner, policy = Periodic(), Watching(PROFILE)
    arrival = np.arange(500_000, 800_000, 10_000)
    Simulator(policy, SimConfig(workers=1), planners=[planner], plan_delay_us=lambda now_us: 20_000).run(
        arrival, arrival + 30_000, start_us=450_000)
    assert planner.asked[:3] == [450_000, 570_000, 690_000]
    assert policy.seen[:2] == [(450_000, 470_000), (570_000, 590_000)]


def test_a_worlds_batch_overhead_adds_to_every_batch():
    arrival = np.array([0, 100_000])
    finish = [Simulator(make_policy("slackfit", PROFILE), World.uniform(1, batch_overhead_ms=ms)).run(
        arrival, arrival + 50_000).finish_us for ms in (0.0, 2.5)]
    assert (finish[1] - finish[0]).tolist() == [2_500, 2_500]


@pytest.mark.parametrize("calibrate", [True, False])
def test_a_calibrated_simulation_plans_with_what_its_batches_take(calibrate):
    """Every batch takes twice its p50 (a live run's measured ratio): with calibration the policy's table is scaled
    by 2 once a window of batches has run, by the live driver's rule; without it, never. At exactly p50 (the
    default world) calibration changes nothing."""
    from scheduler_sidecar.core.latency import CALIBRATION_WINDOW

    arrival = np.arange(4 * CALIBRATION_WINDOW, dtype=np.int64) * 20_000
    slow = SlackFit(PROFILE)
    Simulator(slow, World.uniform(1, latency_ratios=(2.0,)), calibrate=calibrate).run(arrival, arrival + 500_000)
    assert slow.latency.scale("cpu") == (2.0 if calibrate else 1.0)
    exact, plain = SlackFit(PROFILE), SlackFit(PROFILE)
    with_rule = Simulator(exact, SimConfig(workers=1), calibrate=True).run(arrival, arrival + 500_000)
    without = Simulator(plain, SimConfig(workers=1)).run(arrival, arrival + 500_000)
    assert exact.latency.scale("cpu") == 1.0
    assert np.array_equal(with_rule.outcome, without.outcome) and np.array_equal(with_rule.finish_us,
                                                                                  without.finish_us)
