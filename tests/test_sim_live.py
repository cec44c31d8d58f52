"""One engine, two clocks: the simulator and the live driver on a virtual clock give every query the same end.

The same policy class, profile, world and trace go through ``Simulator.run`` and through
:func:`tests.sim_live.run_live`; each query's outcome, serving variant and finish time must be identical.
That holds only because the live run starts an arrival after every batch completion due at the same
microsecond, as the simulator does; with arrivals first, most queries of the grid trace below differ.
"""

from __future__ import annotations

import numpy as np
import pytest

from loadtest import traces
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.records import Outcome, QueryRecord
from scheduler_sidecar.sim.results import OUTCOME_CODES, SimResult
from scheduler_sidecar.sim.simulator import Simulator
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
