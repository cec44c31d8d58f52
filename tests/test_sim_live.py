"""One engine, two clocks: the simulator and the live driver on a virtual clock give every query the same end.

The same policy class, profile, world and trace go through ``Simulator.run`` and through
:func:`tests.sim_live.run_live`; each query's outcome, serving variant and finish time must be identical.
That holds only because the live run starts an arrival after every batch completion due at the same
microsecond, as the simulator does; with arrivals first, most queries of the grid trace below differ.
SuperServe's policies, RAMSIS (the engine's worker queues) and Proteus (three query types on workers of
three device kinds, its planner re-planning every 5 s and on bursts, models loading on plan changes) all
give identical ends.
"""

from __future__ import annotations

import numpy as np
import pytest

from loadtest import traces
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.records import Outcome, QueryRecord
from scheduler_sidecar.sim.results import OUTCOME_CODES, SimResult
from scheduler_sidecar.sim.simulator import SimConfig, Simulator
from scheduler_sidecar.sim.world import SimWorker, World
from scheduler_sidecar.systems.superserve.baselines import ClipperPlus
from scheduler_sidecar.systems.superserve.greedy import MaxBatch
from scheduler_sidecar.systems.superserve.slackfit import SlackFit
from tests.builders import make_profile
from tests.conftest import REPO_ROOT
from tests.sim_live import run_live

POLICIES = [SlackFit, MaxBatch, ClipperPlus]
SLO_US = 36_000


def ends(result: SimResult) -> list[tuple[int, str | None, int]]:
    return list(zip(result.outcome.tolist(), result.variant, result.finish_us.tolist()))


def live_ends(records: list[QueryRecord]) -> list[tuple[int, str | None, int]]:
    return [(OUTCOME_CODES[r.outcome], r.variant_id, r.finish_us) for r in records]


def bursty_us(qps: float, duration_s: float, grid_us: int = 1) -> np.ndarray:
    """SuperServe's bursty trace (a quarter of the rate steady, the rest at CV² 8) on a grid of ``grid_us``."""
    trace = traces.bursty(qps / 4, qps * 3 / 4, 8.0, duration_s, seed=1)
    return (np.round(trace.arrival_s * 1e6 / grid_us) * grid_us).astype(np.int64)


def compare(policy: type[Policy], profile: Profile, world: World, arrival: np.ndarray) -> SimResult:
    deadline = arrival + SLO_US
    sim = Simulator(policy(profile), world).run(arrival, deadline)
    assert live_ends(run_live(policy(profile), world, arrival, deadline)) == ends(sim)
    return sim


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_paper_profile_bursty_trace(policy):
    """3034 queries at 2000 q/s on two workers: the policies drop some, and SlackFit and MaxBatch trade accuracy."""
    profile = Profile.load(REPO_ROOT / "profiles" / "superserve_paper.json")
    sim = compare(policy, profile, World.uniform(2, profile.device_kinds[0]), bursty_us(2000, 1.5))
    assert len(sim.outcome) == 3034 and sim.count(Outcome.DROPPED) > 0
    if policy is not ClipperPlus:
        assert len(set(sim.variant) - {None}) > 10


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_events_at_equal_times_on_a_grid(policy):
    """Arrivals on a 0.5 ms grid, batch latencies in whole 0.5 ms (tests.builders' profile), and a slower third
    worker: hundreds of arrivals fall on a batch completion, and queries are met and late."""
    world = World((SimWorker(), SimWorker(), SimWorker(speed=0.8)))
    sim = compare(policy, make_profile(), world, bursty_us(1200, 3.0, grid_us=500))
    assert len(np.intersect1d(sim.arrival_us, sim.finish_us)) > 100
    assert sim.count(Outcome.MET) > 0 and sim.count(Outcome.LATE) > 0


def test_ramsis_routes_to_worker_queues_alike(tmp_path):
    """RAMSIS on the authors' CPU profile, 6 workers and MDP policies for two loads, a gamma trace at CV² 4."""
    from scheduler_sidecar.experiments.simulate import load_profile
    from scheduler_sidecar.systems import make_policy
    from scheduler_sidecar.systems.ramsis import LATENCY_CSV
    from scheduler_sidecar.systems.ramsis.generate import generate_set
    from scheduler_sidecar.systems.ramsis.mdp import MdpSpec
    from scheduler_sidecar.systems.ramsis.model_table import MAX_QUEUE, from_profile

    profile = load_profile(LATENCY_CSV, "image_cloud_cpu")
    generate_set(from_profile(profile, "cpu", "p99_ms", MAX_QUEUE).pareto(), MdpSpec(150.0, 6, 1.0, 100, MAX_QUEUE),
                 [100.0, 200.0], tmp_path, refine=False)
    arrival = np.round(traces.gamma(150, 4, 8.0, seed=11).arrival_s * 1e6).astype(np.int64)
    sim = Simulator(make_policy("ramsis", profile, policy_dir=tmp_path), SimConfig(workers=6)).run(
        arrival, arrival + 150_000)
    live = run_live(make_policy("ramsis", profile, policy_dir=tmp_path), SimConfig(workers=6), arrival,
                    arrival + 150_000)
    assert live_ends(live) == ends(sim)
    assert sim.count(Outcome.MET) > 0.9 * len(arrival) and len(set(sim.variant) - {None}) > 1


@pytest.mark.parametrize("load_ms", [0.0, 500.0])
def test_proteus_plans_places_and_routes_alike(load_ms):
    """Proteus on three of the authors' families, 8 workers of 3 kinds, 15 s of their trace at 4x: plans every 5 s
    and on bursts, instant or 500 ms model loads (make before break)."""
    from scheduler_sidecar.experiments.proteus.data import Counts, arrivals, load_counts, load_profiles
    from scheduler_sidecar.systems.proteus.planner import ProteusConfig, ProteusPlanner
    from scheduler_sidecar.systems.proteus.policy import Proteus

    profiles, counts = load_profiles(), load_counts()
    families = ("efficientnet", "mobilenet", "resnet")
    trace = Counts(families, counts.per_second[:15, [counts.families.index(f) for f in families]] * 4)
    arrival, deadline, names = arrivals(trace, 300.0, seed=0)
    kinds = ["cpu"] * 4 + ["pascal"] * 2 + ["ampere"] * 2
    world = World(tuple(SimWorker(k, resident=frozenset()) for k in kinds), load_ms=load_ms)
    runs = []
    for _ in range(2):  # the same fresh planner and policies for each driver
        planner = ProteusPlanner({f: profiles[f] for f in families}, list(enumerate(kinds)), dict.fromkeys(families, 300.0),
                                 ProteusConfig(period_s=5.0), initial_demand=dict(zip(families, trace.per_second[0])))
        runs.append((planner, {f: Proteus(profiles[f], query_type=f, device="cpu") for f in families}))
    sim = Simulator(runs[0][1], world, planners=[runs[0][0]]).run(arrival, deadline, names)
    assert live_ends(run_live(runs[1][1], world, arrival, deadline, names, planners=[runs[1][0]])) == ends(sim)
    assert runs[0][0].plans >= 3 and runs[1][0].plans == runs[0][0].plans
    assert sim.count(Outcome.DROPPED) > 0 and len(set(sim.variant) - {None}) > 3


@pytest.mark.slow
def test_a_hybridserve_cascade_behind_the_sidecar_is_planned_and_batched_alike(hybridserve_family, tmp_path):
    """HybridServe's live deployment: the cascade BLS model as the sidecar's one logical model (CascadeModel), its
    planner re-planning every second (the pruned AP cascade sent with every batch, R ∝ ρl as instance counts), on 4
    BLS slots of one server's emulated device, a gamma trace at 1.5x their capacity: the same queries met and
    dropped."""
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.experiments.hybridserve.demo import cascade_profile
    from scheduler_sidecar.systems.hybridserve.live import CascadeModel, HybridServeConfig, HybridServePlanner
    from scheduler_sidecar.systems.hybridserve.planner import pruned_point
    from scheduler_sidecar.systems.hybridserve.pruning import prune

    family, slowdown = hybridserve_family, 300.0
    point = pruned_point(family, prune(family.predictions("search"), family.costs, "ap"), "ap")
    profile = Profile.load(cascade_profile(tmp_path / "profile-ap.json", family, point, slowdown))
    config = HybridServeConfig(instances=8, slowdown=slowdown, period_s=1.0)
    world = World.uniform(4, "cpu")
    batch_us = round(profile.variants[0].latency["cpu"].p50_at(32) * 1000)
    slo_us = 3 * batch_us
    capacity_qps = 4 * 32 * 1e6 / batch_us  # 4 slots, batches of 32
    arrival = np.round(traces.gamma(1.5 * capacity_qps, 4.0, 5.0, seed=2).arrival_s * 1e6).astype(np.int64)
    runs = [(CascadeModel(profile), HybridServePlanner(family, point, "cascade", config, server=lambda w: "one"))
            for _ in range(2)]
    sim = Simulator(runs[0][0], world, planners=[runs[0][1]]).run(arrival, arrival + slo_us)
    assert live_ends(run_live(runs[1][0], world, arrival, arrival + slo_us, planners=[runs[1][1]])) == ends(sim)
    assert sim.count(Outcome.MET) > 0 and sim.count(Outcome.DROPPED) > 0
    assert runs[1][0].params == runs[0][0].params and "cascade_plan" in dict(runs[0][0].params)


@pytest.mark.slow
def test_a_loki_pipeline_behind_the_sidecar_is_planned_and_batched_alike():
    """Loki's live deployment: the pipeline's BLS model as the sidecar's one logical model (LokiPipeline), its
    controller re-planning every 2 s over 8 instances of the authors' traffic-analysis pipeline (tables sent with
    every batch, unplanned variants unloaded, taking 100 ms to load), 2 BLS slots, a burst: the same ends."""
    from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Variant
    from scheduler_sidecar.systems.loki.data import traffic_analysis
    from scheduler_sidecar.systems.loki.live import LivePlanner, LokiPipeline
    from scheduler_sidecar.systems.loki.planner import LokiConfig

    pipeline = traffic_analysis()
    stages = frozenset(v.id for t in pipeline.tasks for v in t.variants)
    curve = LatencyCurve((1, 2, 4, 8), (40.0, 50.0, 70.0, 110.0), (40.0, 50.0, 70.0, 110.0))
    profile = Profile("loki-pipeline", "tests", (Variant("pipeline", 1.0, Actuation(
        "pipeline", "loki_pipeline", path=tuple(t.name for t in pipeline.tasks)), {"cpu": curve}),))
    world = World(tuple(SimWorker(resident=stages | {"loki_pipeline"}) for _ in range(2)), load_ms=100.0)
    arrival = bursty_us(120.0, 8.0)
    slo_us = round(pipeline.slo_ms * 1000)
    runs = [(LokiPipeline(profile), LivePlanner(pipeline, 8, LokiConfig(period_s=2.0, min_demand_qps=1.0)))
            for _ in range(2)]
    sim = Simulator(runs[0][0], world, planners=[runs[0][1]]).run(arrival, arrival + slo_us)
    assert live_ends(run_live(runs[1][0], world, arrival, arrival + slo_us, planners=[runs[1][1]])) == ends(sim)
    assert runs[0][1].plans >= 3 and runs[1][1].plans == runs[0][1].plans
    assert sim.count(Outcome.MET) > 0 and sim.count(Outcome.DROPPED) > 0
