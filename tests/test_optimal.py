"""The offline ZILP bound (systems/superserve/optimal.py): equal to brute force, feasible, validated."""

from __future__ import annotations

import itertools
import math
import random

import pulp
import pytest

from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.systems.superserve import optimal
from scheduler_sidecar.systems.superserve.optimal import OptimalResult, brute_force, solve_optimal


def make_profile(specs: list[tuple[float, float, float]],
                 batch_sizes: tuple[int, ...] = (1, 2, 4)) -> Profile:
    """Variants (accuracy, base_ms, per_query_ms): p50 = base + per_query * batch size."""
    variants = tuple(
        Variant(f"v{i}", accuracy, Actuation("model", f"m{i}"),
                {"cpu": LatencyCurve(batch_sizes, tuple(base + per * b for b in batch_sizes),
                                     tuple(1.5 * (base + per * b) for b in batch_sizes))})
        for i, (accuracy, base, per) in enumerate(specs)
    )
    return Profile("optimal-test", "tests/test_optimal.py", variants)


# accuracy rises with latency
TWO = make_profile([(0.70, 1.2, 0.6), (0.80, 3.0, 1.4)])
FOUR = make_profile([(0.70, 2.0, 0.5), (0.73, 4.0, 0.8), (0.76, 6.0, 1.1), (0.79, 8.0, 1.4)], (1, 2, 4, 8))


def tiny_instance(seed: int) -> tuple[list[int], list[int], int]:
    """4-6 queries over 6 ms, off the 1 ms grid, slack 2-9 ms, on 1 or 2 workers."""
    rng = random.Random(seed)
    n = rng.randint(4, 6)
    arrival_us = sorted(rng.randint(0, 6000) for _ in range(n))
    deadline_us = [a + rng.randint(2000, 9000) for a in arrival_us]
    return arrival_us, deadline_us, rng.choice([1, 2])


def assert_feasible(result: OptimalResult, arrival_us: list[int], deadline_us: list[int], profile: Profile,
                    workers: int) -> None:
    """Check the schedule against the problem itself, not against the model."""
    step_us = result.time_step_us
    origin_us = min(arrival_us)
    seen: set[int] = set()
    by_worker: dict[int, list[tuple[int, int]]] = {}  # worker -> [(start_us, finish_us)]
    total = 0.0
    for b in result.batches:
        assert 0 <= b.worker < workers
        assert b.query_ids and len(b.query_ids) <= b.batch_size
        assert (b.start_us - origin_us) % step_us == 0, "starts lie on the grid"
        curve = profile.variant(b.variant_id).latency["cpu"]
        latency_us = math.ceil(round(curve.p50_at(b.batch_size) * 1000, 3))
        latency_slots = max(1, math.ceil(latency_us / step_us))
        assert b.finish_us == b.start_us + latency_slots * step_us, "latency rounded up to whole slots"
        for q in b.query_ids:
            assert q not in seen, f"query {q} served twice"
            seen.add(q)
            assert arrival_us[q] <= b.start_us, f"query {q} starts before it arrives"
            assert b.finish_us <= deadline_us[q], f"query {q} finishes after its deadline"
        by_worker.setdefault(b.worker, []).append((b.start_us, b.finish_us))
        total += profile.variant(b.variant_id).accuracy * len(b.query_ids)
    for runs in by_worker.values():
        runs.sort()
        for (_, finish_us), (start_us, _) in itertools.pairwise(runs):
            assert finish_us <= start_us, "a worker runs one batch at a time"
    assert result.served == len(seen)
    assert result.objective == pytest.approx(total, abs=1e-9)


@pytest.mark.parametrize("bound", ["feasible", "upper"])
@pytest.mark.parametrize("seed", range(16))
def test_ilp_equals_brute_force_on_tiny_instances(seed: int, bound: str) -> None:
    """The ILP optimum equals the exhaustive optimum of the discretised problem; "feasible" schedules run."""
    arrival_us, deadline_us, workers = tiny_instance(seed)
    result = solve_optimal(arrival_us, deadline_us, TWO, workers=workers, bound=bound)
    assert (result.status, result.solver, result.bound) == ("optimal", "HiGHS", bound)
    assert result.best_bound == result.objective
    expected = brute_force(arrival_us, deadline_us, TWO, workers=workers, bound=bound)
    assert result.objective == pytest.approx(expected, abs=1e-6)
    if bound == "feasible":
        assert_feasible(result, arrival_us, deadline_us, TWO, workers)
    else:
        lower = solve_optimal(arrival_us, deadline_us, TWO, workers=workers).objective
        assert result.objective >= lower - 1e-9


# a dominated variant (slower and less accurate than v1) and batch sizes the tiny instances cannot fill
PRUNABLE = make_profile([(0.65, 2.0, 1.0), (0.70, 1.2, 0.6), (0.80, 3.0, 1.4)], (1, 2, 4, 8, 16))


@pytest.mark.parametrize("bound", ["feasible", "upper"])
@pytest.mark.parametrize("seed", range(4))
def test_pruning_keeps_the_optimum(seed: int, bound: str) -> None:
    """Dropping dominated configs, once and per slot, leaves the exhaustive optimum (which prunes nothing)."""
    arrival_us, deadline_us, workers = tiny_instance(seed)
    result = solve_optimal(arrival_us, deadline_us, PRUNABLE, workers=workers, bound=bound)
    expected = brute_force(arrival_us, deadline_us, PRUNABLE, workers=workers, bound=bound)
    assert result.objective == pytest.approx(expected, abs=1e-6)


def test_undominated_matches_its_definition() -> None:
    rng = random.Random(0)
    for _ in range(200):
        points = [(rng.randint(1, 4), rng.choice([0.7, 0.75, 0.8]), rng.randint(1, 4))
                  for _ in range(rng.randint(0, 12))]
        expected = [i for i, p in enumerate(points)
                    if not any(q[0] <= p[0] and q[1] >= p[1] and q[2] >= p[2] and (q != p or j < i)
                               for j, q in enumerate(points) if j != i)]
        assert optimal._undominated(points) == expected


def test_tiny_instances_cover_the_interesting_cases() -> None:
    """The seeds above include dropped queries, multi-query batches, and both variants in one schedule."""
    results = [(solve_optimal(a, d, TWO, workers=w), len(a)) for a, d, w in map(tiny_instance, range(16))]
    assert any(r.served < n for r, n in results)
    assert any(len(b.query_ids) > 1 for r, _ in results for b in r.batches)
    assert any(len({b.variant_id for b in r.batches}) == 2 for r, _ in results)


def test_batching_is_what_serves_everyone() -> None:
    """Four queries due in 5 ms fit as one batch (3.6 ms: 4 slots); one at a time (2 slots each), two do."""
    arrival_us, deadline_us = [0, 0, 0, 0], [5000] * 4
    result = solve_optimal(arrival_us, deadline_us, TWO, workers=1)
    assert result.served == 4
    assert [(b.variant_id, b.batch_size, len(b.query_ids)) for b in result.batches] == [("v0", 4, 4)]
    assert result.objective == pytest.approx(4 * 0.70)
    assert brute_force(arrival_us, deadline_us, TWO, workers=1) == pytest.approx(4 * 0.70)
    assert solve_optimal(arrival_us, deadline_us, TWO, workers=1, batch_sizes=[1]).served == 2


def test_overload_drops_queries_and_more_workers_serve_them() -> None:
    """Six simultaneous queries due in 5 ms: one worker fits a batch of four; two workers serve all six."""
    arrival_us, deadline_us = [100] * 6, [5100] * 6
    one = solve_optimal(arrival_us, deadline_us, TWO, workers=1)
    two = solve_optimal(arrival_us, deadline_us, TWO, workers=2)
    assert (one.served, two.served) == (4, 6)
    assert_feasible(one, arrival_us, deadline_us, TWO, 1)
    assert_feasible(two, arrival_us, deadline_us, TWO, 2)
    for workers, result in ((1, one), (2, two)):
        assert result.objective == pytest.approx(brute_force(arrival_us, deadline_us, TWO, workers=workers))


def test_slack_buys_accuracy() -> None:
    """With room to spare every query gets the accurate variant; with none, the fast one."""
    relaxed = solve_optimal([0, 1000], [20000, 21000], TWO, workers=1)
    assert {b.variant_id for b in relaxed.batches} == {"v1"} and relaxed.served == 2
    tight = solve_optimal([0], [2000], TWO, workers=1)
    assert [b.variant_id for b in tight.batches] == ["v0"]


def test_nothing_servable() -> None:
    result = solve_optimal([0, 500], [1000, 1500], TWO, workers=2)
    assert (result.objective, result.served, result.batches, result.status) == (0.0, 0, (), "optimal")
    assert solve_optimal([], [], TWO, workers=1).served == 0


def test_coarser_grid_never_beats_a_finer_one() -> None:
    """A 3 ms grid's schedules are feasible on the 1 ms grid (nested starts, longer rounded latencies)."""
    arrival_us, deadline_us, workers = tiny_instance(3)
    fine = solve_optimal(arrival_us, deadline_us, TWO, workers=workers, time_step_us=1000)
    coarse = solve_optimal(arrival_us, deadline_us, TWO, workers=workers, time_step_us=3000)
    assert coarse.time_step_us == 3000
    assert coarse.objective <= fine.objective + 1e-9
    assert_feasible(coarse, arrival_us, deadline_us, TWO, workers)


@pytest.mark.parametrize("seed", range(4))
def test_the_bounds_tighten_on_finer_grids(seed: int) -> None:
    """feasible(1 ms) <= feasible(0.5 ms) <= upper(0.5 ms) <= upper(1 ms)."""
    arrival_us, deadline_us, workers = tiny_instance(seed)
    objective = {(bound, step): solve_optimal(arrival_us, deadline_us, TWO, workers=workers,
                                              time_step_us=step, bound=bound).objective
                 for bound in ("feasible", "upper") for step in (500, 1000)}
    chain = [objective["feasible", 1000], objective["feasible", 500], objective["upper", 500],
             objective["upper", 1000]]
    assert all(x <= y + 1e-9 for x, y in itertools.pairwise(chain)), chain


def test_medium_instance_is_feasible_and_optimal() -> None:
    """16 queries, 2 workers, 4 variants x batch sizes {1, 2, 4, 8}: solved to optimality within the limit."""
    rng = random.Random(7)
    arrival_us, now_us = [], 0.0
    for _ in range(16):
        now_us += rng.expovariate(1 / 500)
        arrival_us.append(int(now_us))
    deadline_us = [a + 15000 for a in arrival_us]
    result = solve_optimal(arrival_us, deadline_us, FOUR, workers=2, time_limit_s=30)
    assert result.status == "optimal"
    assert_feasible(result, arrival_us, deadline_us, FOUR, 2)
    assert result.served == 16


def test_cbc_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without HiGHS the bundled CBC solves the same model, and the result says so."""
    arrival_us, deadline_us, workers = tiny_instance(0)
    expected = solve_optimal(arrival_us, deadline_us, TWO, workers=workers).objective
    monkeypatch.setattr(pulp.HiGHS, "available", lambda self: False)
    result = solve_optimal(arrival_us, deadline_us, TWO, workers=workers)
    assert result.solver == "PULP_CBC_CMD"
    assert result.objective == pytest.approx(expected, abs=1e-6)
    assert_feasible(result, arrival_us, deadline_us, TWO, workers)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"arrival_us": [0, 1], "deadline_us": [5000]}, "one deadline per query"),
    ({"deadline_us": [5000, 500]}, "query 1: deadline_us 500 is before arrival_us 1000"),
    ({"workers": 0}, "workers must be an integer >= 1"),
    ({"workers": 1.5}, "workers must be an integer >= 1"),
    ({"device": "gpu"}, "no device kind 'gpu'"),
    ({"batch_sizes": [3]}, "batch size 3 is not profiled"),
    ({"time_step_us": 0}, "time_step_us must be an integer >= 1"),
    ({"time_step_us": 0.5}, "time_step_us must be an integer >= 1"),
    ({"batch_sizes": []}, "batch_sizes is empty"),
    ({"bound": "exact"}, "bound must be one of"),
    ({"bound": "upper", "time_step_us": 2000}, "'v0' at batch size 1 takes 1800 us but time_step_us is 2000"),
])
def test_invalid_inputs(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"arrival_us": [0, 1000], "deadline_us": [5000, 6000], "workers": 1} | kwargs
    with pytest.raises(ValueError, match=match):
        solve_optimal(profile=TWO, **args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=match):
        brute_force(profile=TWO, **args)  # type: ignore[arg-type]


def test_invalid_solver_and_search_limits() -> None:
    with pytest.raises(ValueError, match="time_limit_s must be > 0"):
        solve_optimal([0], [5000], TWO, workers=1, time_limit_s=0)
    with pytest.raises(ValueError, match="at most 10 queries"):
        brute_force([0] * 11, [5000] * 11, TWO, workers=1)


def test_a_model_too_large_fails_fast_and_says_how_to_cut_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optimal, "MAX_CONFIG_SLOTS", 50)
    with pytest.raises(ValueError, match=r"configs .* x 18 start slots .* > 50: .* cut the profile .*spread"):
        solve_optimal([0, 1000], [20000, 21000], FOUR, workers=1)


def test_a_time_limit_still_gives_a_valid_best_bound() -> None:
    arrival_us, deadline_us = [0, 300, 600, 900] * 3, [14000] * 12
    optimum = solve_optimal(arrival_us, deadline_us, FOUR, workers=2, bound="upper").objective
    hurried = solve_optimal(arrival_us, deadline_us, FOUR, workers=2, bound="upper", time_limit_s=1e-6)
    assert hurried.best_bound is not None and hurried.best_bound >= optimum - 1e-9
    assert hurried.objective <= optimum + 1e-9


def grid_profile():
    """Integer-millisecond latencies at batch sizes 1, 2, 4, 8, so simulated schedules lie on a 1 ms grid."""
    sizes = (1, 2, 4, 8)
    variants = tuple(
        Variant(f"g{i}", 0.70 + 0.05 * i, Actuation("model", f"g{i}"),
                {"cpu": LatencyCurve(sizes, tuple(float(2 + 2 * i + b) for b in sizes),
                                     tuple(float(2 + 2 * i + b) for b in sizes))})
        for i in range(3))
    return Profile("grid", "tests/test_optimal.py", variants)


@pytest.mark.parametrize("seed", range(6))
def test_slackfit_never_beats_the_optimum(seed):
    """On small random traces SlackFit's objective (accuracy summed over met queries) is at most the ZILP's."""
    from scheduler_sidecar.core.records import Outcome
    from scheduler_sidecar.sim.results import OUTCOME_CODES
    from scheduler_sidecar.sim.simulator import SimConfig, Simulator
    from scheduler_sidecar.systems import make_policy

    rng = random.Random(seed)
    profile = grid_profile()
    arrival = sorted(rng.randrange(0, 25) * 1000 for _ in range(rng.randrange(8, 16)))
    deadline = [a + rng.choice((8, 12, 16)) * 1000 for a in arrival]
    workers = rng.choice((1, 2))
    sim = Simulator(make_policy("slackfit", profile), SimConfig(workers=workers)).run(arrival, deadline)
    met = sim.outcome == OUTCOME_CODES[Outcome.MET]
    slackfit = float(sim.accuracy[met].sum())
    optimum = solve_optimal(arrival, deadline, profile, workers=workers, time_step_us=1000).objective
    assert slackfit <= optimum + 1e-9


# latencies, arrivals and deadlines off the 1 ms grid
OFF_GRID = make_profile([(0.70, 1.37, 0.61), (0.75, 2.93, 0.87), (0.80, 4.41, 1.29)], (1, 2, 4, 8))


@pytest.mark.parametrize("seed", range(8))
def test_no_policy_beats_the_upper_bound_off_the_grid(seed: int) -> None:
    """Simulated in continuous time, no policy's objective exceeds the "upper" optimum of a 1 ms grid.

    The "feasible" optimum is no such limit: on seeds 2 and 4 MaxAcc beats it.
    """
    from scheduler_sidecar.core.records import Outcome
    from scheduler_sidecar.sim.results import OUTCOME_CODES
    from scheduler_sidecar.sim.simulator import SimConfig, Simulator
    from scheduler_sidecar.systems import make_policy, policies
    from tests.builders import POLICY_OPTIONS

    rng = random.Random(seed)
    arrival = sorted(rng.randrange(0, 20_000) for _ in range(rng.randrange(8, 16)))
    deadline = [a + rng.randrange(4_000, 16_000) for a in arrival]
    workers = rng.choice((1, 2))
    upper = solve_optimal(arrival, deadline, OFF_GRID, workers=workers, bound="upper")
    assert upper.status == "optimal"
    for name in policies():
        policy = make_policy(name, OFF_GRID, **POLICY_OPTIONS.get(name, {}))
        sim = Simulator(policy, SimConfig(workers=workers)).run(arrival, deadline)
        objective = float(sim.accuracy[sim.outcome == OUTCOME_CODES[Outcome.MET]].sum())
        assert objective <= upper.objective + 1e-9, name
