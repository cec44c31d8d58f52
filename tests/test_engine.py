"""The engine in the simulator: several query types on one pool, loads, wakeups and plans."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler_sidecar.core.placement import Placement
from scheduler_sidecar.core.plan import Demand, Plan, Planner, Scope
from scheduler_sidecar.core.profile import Actuation
from scheduler_sidecar.core.records import BatchResult, Decision, Query, WorkerState
from scheduler_sidecar.core.worker_table import WorkerTable
from scheduler_sidecar.errors import PolicyError
from scheduler_sidecar.sim.simulator import Simulator
from scheduler_sidecar.sim.world import SimWorker, World
from scheduler_sidecar.systems.proteus.policy import Proteus
from scheduler_sidecar.systems.superserve.slackfit import SlackFit
from tests.builders import make_mover, make_profile, make_queries, make_queue


def test_two_query_types_share_workers_without_double_booking():
    """Both types are served on one worker, and its batches never overlap in time."""
    sim = Simulator({"x": SlackFit(make_profile()), "y": SlackFit(make_profile())}, World.uniform(1))
    arrivals = list(range(0, 200_000, 2_000))
    result = sim.run(arrivals, [a + 100_000 for a in arrivals], ["x", "y"] * (len(arrivals) // 2))
    assert result.summary()["met"] == len(arrivals)
    spans = sorted((b.start_us, b.batch_size) for b in result.batches)
    ends = [s for s, _ in spans]
    assert ends == sorted(set(ends))  # one batch start per instant on the single worker


@pytest.mark.parametrize("stated", ["world", "profile"])
def test_a_loading_worker_serves_nothing_until_the_load_completes(stated):
    """Load time 50 ms, set for the world or measured in the profile (the world's default): no batch starts
    before it; every query is served after it."""
    profile = make_profile()
    if stated == "profile":
        profile = replace(profile, variants=tuple(replace(v, load_ms=50.0) for v in profile.variants))
    world = World((SimWorker(resident=frozenset({"m3"})),), load_ms=50.0 if stated == "world" else None)
    result = Simulator(make_mover(profile), world).run([0, 1_000, 2_000], [10**7] * 3)
    assert min(b.start_us for b in result.batches) >= 50_000
    assert result.summary()["met"] == 3 and set(result.variant) == {"v2"}


class Recorder(Planner):
    """Plans every 100 ms, and at once when an arrival finds 10 or more queries since the last plan."""

    period_us = 100_000

    def __init__(self) -> None:
        self.calls: list[tuple[int, Demand]] = []
        self.since = 0

    def plan(self, now_us, demand):
        self.calls.append((now_us, demand))
        self.since = 0
        return Plan(now_us)

    def observe_arrival(self, now_us, query):
        self.since += 1
        return self.since >= 10


def test_plans_come_at_the_period_and_on_a_demand_jump():
    planner = Recorder()
    slow = list(range(0, 300_000, 50_000))  # 2 queries per period
    burst = [310_000 + i for i in range(10)]  # 10 queries at once
    arrivals = slow + burst
    result = Simulator(SlackFit(make_profile()), World.uniform(4), planners=[planner]).run(
        arrivals, [a + 1_000_000 for a in arrivals])
    times = [t for t, _ in planner.calls]
    assert times[:4] == [0, 100_000, 200_000, 300_000]  # the period
    assert 310_009 in times  # the burst's tenth arrival asked for a plan at once
    jump = dict(planner.calls)[310_009]
    assert jump.arrivals[""] == 10 and jump.rate_qps("") == pytest.approx(10 / 0.010009)  # 10 queries since the 300 ms plan
    assert result.summary()["plans"] == len(planner.calls)


def test_arrivals_while_the_engine_counts_no_demand_reach_no_planner():
    """The live sidecar's warm-up requests at start: served, but no planner counts them as demand."""
    from scheduler_sidecar.core.engine import Engine, QueryType

    class Inline:  # plans at once; runs nothing (every worker is busy), so the queries stay queued
        def __init__(self) -> None:
            self.engine: Engine | None = None

        def plan(self, planner, now_us, demand):
            self.engine.apply_plan(planner, planner.plan(now_us, demand))

        def wake_at(self, time_us):
            pass

    planner, executor = Recorder(), Inline()
    engine = Engine([QueryType("", SlackFit(make_profile()))], [WorkerState(0, busy_until_us=10**12)], executor,
                    clock=lambda: 0, on_end=lambda *a: None)
    executor.engine = engine
    engine.add_planner(planner)
    engine.counting_demand = False
    engine.arrive(*make_queries(12))  # past the Recorder's burst of 10: a plan, had it counted them
    engine.counting_demand = True
    assert planner.since == 0 and len(planner.calls) == 1 and len(engine.types[""].queue) == 12
    engine.arrive(*(Query(10**6, i, i, 0) for i in range(12, 24)))
    assert planner.since == 2 and len(planner.calls) == 2  # the tenth counted asked for a plan
    assert planner.calls[1][1].arrivals == {"": 10}  # and its demand is those ten alone


def test_a_policy_is_asked_at_its_wakeup_and_never_with_nothing_queued():
    """A policy that holds its query until 5 ms is asked again then; once the query is served, it is not asked
    after the batch's completion (its type's queue is empty)."""
    calls = []

    class Waker(SlackFit):
        def decide(self, now_us, queue, workers):
            calls.append((now_us, len(queue)))
            return Decision(wakeup_us=5_000) if now_us < 5_000 else super().decide(now_us, queue, workers)

    result = Simulator(Waker(make_profile()), World.uniform(1)).run([0], [1_000_000])
    assert result.summary()["met"] == 1
    assert calls[0] == (0, 1) and (5_000, 1) in calls
    assert all(queued for _, queued in calls)


class PlaceOnce(Planner):
    """One plan at the start: worker 0 should hold m3 only."""

    period_us = 10**9

    def plan(self, now_us, demand):
        return Plan(now_us, {0: frozenset({"m3"})})


def test_a_plan_moves_a_worker_make_before_break():
    """While m3 loads (50 ms) the worker keeps serving m1; m1 leaves only once m3 is in."""
    world = World((SimWorker(resident=frozenset({"m1"})),), load_ms=50.0)
    arrivals = list(range(0, 100_000, 5_000))
    policy = Proteus(make_profile(), query_type="", batching="nexus")  # it runs only what a worker holds
    result = Simulator(policy, world, planners=[PlaceOnce()]).run(arrivals, [a + 1_000_000 for a in arrivals])
    assert result.summary()["met"] == len(arrivals)
    before = [b for b in result.batches if b.start_us < 50_000]
    after = [b for b in result.batches if b.start_us >= 50_001]
    assert before and {b.variant_id for b in before} == {"v1"}  # served by what it held while loading
    assert after and {b.variant_id for b in after} == {"v3"}  # and only by the new model once it is in


def test_a_query_removed_from_deep_in_the_queue_and_queued_again_is_queued_once():
    """A retry re-queues a query that a routing policy's dispatch took from deep in the type's queue (removed
    lazily there), and it is taken again before the queue is read: it is gone, not seen once more."""
    queue = make_queue(make_queries(6))
    assert [q.id for q in queue.head(2)] == [0, 1]  # 0 and 1 are at the front, the rest deep in the heap
    retried = queue.remove([4])[0]
    queue.push(retried)  # its worker was lost: back in the queue
    queue.remove([4])  # dispatched again, from deep in the heap again
    assert [q.id for q in queue.scan()] == [0, 1, 2, 3, 5] and 4 not in queue
    queue.push(retried)
    assert [q.id for q in queue.scan()] == [0, 1, 2, 3, 4, 5]


def test_admission_refuses_only_what_the_queue_ahead_makes_infeasible():
    """One worker; a burst of 200 queries at once with a 40 ms SLO. The first starts at once; behind it, the
    profile's best option (variant v0 at batch 16: 9 ms) serves at most 4 x 16 = 64 within 40 ms (the running
    batch is not counted: the bound is optimistic), so with admission the 66th and later are refused at arrival;
    without it they queue and are dropped later. Admission loses no query that could be met."""
    arrivals, deadlines = [0] * 200, [40_000] * 200
    runs = {admission: Simulator(SlackFit(make_profile()), World.uniform(1), admission=admission).run(
        arrivals, deadlines) for admission in (False, True)}
    shed, queued = runs[True].summary(), runs[False].summary()
    assert shed["rejected"] == 200 - 65 and queued["rejected"] == 0
    assert shed["met"] >= queued["met"] and shed["met"] + shed["late"] + shed["dropped"] == 65


def test_admission_counts_only_the_queries_with_earlier_deadlines():
    """Queries with a tight SLO arriving behind a long queue of lax ones are admitted: EDF serves them first."""
    lax = [(0, 10_000_000)] * 300
    tight = [(1, 40_001)] * 10
    arrivals, deadlines = zip(*(lax + tight))
    result = Simulator(SlackFit(make_profile()), World.uniform(1), admission=True).run(list(arrivals), list(deadlines))
    assert result.summary()["rejected"] == 0 and result.summary()["met"] == 310


def _family(prefix: str):
    """make_profile's variants on Triton models of their own: ``prefix``0, ``prefix``1, ..."""
    profile = make_profile()
    return replace(profile, name=prefix, variants=tuple(
        replace(v, id=f"{prefix}{i}", actuation=Actuation("model", f"{prefix}{i}")) for i, v in enumerate(profile.variants)))


class Told(SlackFit):
    """SlackFit that keeps the plans it is given."""

    def __init__(self, profile, **options) -> None:
        super().__init__(profile, **options)
        self.plans: list[object] = []

    def observe_plan(self, now_us, plan):
        self.plans.append(plan.detail)


class Owner(Planner):
    """Plans every 50 ms over its scope: its first worker should hold every model of its family (SlackFit, which
    the test's types use, takes any free worker for any variant)."""

    period_us = 50_000

    def __init__(self, name: str, scope: Scope) -> None:
        self.name, self.scope = name, scope
        self.demands: list[Demand] = []

    def plan(self, now_us, demand):
        self.demands.append(demand)
        return Plan(now_us, {min(self.scope.workers): frozenset(f"{self.name}{i}" for i in range(4))}, detail=self.name)


def test_planners_plan_their_own_types_on_their_own_workers_beside_an_unplanned_type():
    """Two planners and an unplanned type on one pool: each planner counts only its type's arrivals, sees and places
    only its workers, and its plans reach only its type's policy; every query is served, on the workers that hold
    its type's models."""
    policies = {name: Told(_family(name)) for name in ("a", "b", "s")}
    holds = {"a": (0, 1), "b": (2, 3), "s": (4,)}
    world = World(tuple(SimWorker(resident=frozenset(f"{name}{i}" for i in range(4)))
                        for name, workers in holds.items() for _ in workers), load_ms=5.0)
    planners = [Owner(name, Scope(frozenset({name}), frozenset(holds[name]))) for name in ("a", "b")]
    arrivals = list(range(0, 300_000, 1_000))
    types = ["a", "b", "s"] * (len(arrivals) // 3)
    result = Simulator(policies, world, planners=planners).run(arrivals, [a + 100_000 for a in arrivals], types)
    assert result.summary()["met"] == len(arrivals)
    for planner in planners:
        assert len(planner.demands) >= 6  # the first plan, then every 50 ms
        assert all({w.id for w in d.workers} == set(holds[planner.name]) for d in planner.demands)
        assert sum(d.arrivals.get(planner.name, 0) for d in planner.demands) > 0
        assert all(set(d.arrivals) <= {planner.name} for d in planner.demands)
        assert set(policies[planner.name].plans) == {planner.name}
    assert policies["s"].plans == []


def test_planners_may_not_share_a_type_or_a_worker_nor_place_beyond_their_own():
    policies = {name: SlackFit(_family(name)) for name in ("a", "b")}
    world = World.uniform(4)
    shared = [Owner("a", Scope(frozenset({"a"}), frozenset({0, 1}))), Owner("b", Scope(frozenset({"b"}), frozenset({1, 2})))]
    with pytest.raises(ValueError, match="same worker"):
        Simulator(policies, world, planners=shared).run([0], [10**6], ["a"])
    everything = [Owner("a", Scope(frozenset({"a"}), frozenset({0}))), Owner("b", Scope())]
    with pytest.raises(ValueError, match="same query type"):
        Simulator(policies, world, planners=everything).run([0], [10**6], ["a"])

    class Trespasser(Owner):
        def plan(self, now_us, demand):
            return Plan(now_us, {3: frozenset({"a0"})})

    with pytest.raises(PolicyError, match=r"worker\(s\) \[3\], which its planner does not own"):
        Simulator(policies, world, planners=[Trespasser("a", Scope(frozenset({"a"}), frozenset({0})))]).run(
            [0], [10**6], ["a"])


def test_a_batchs_follow_ups_all_queue_before_the_next_stage_decides():
    """Each batch of stage "a" creates one query of stage "b" per query, and b's one worker is idle when it ends:
    they reach b's queue together and run as one batch, so b's batches are a's (an event admits what it brings, then
    the policies decide once; before, the first follow-up of each batch ran alone: b ran 1, 1, 1 after a's 1, 2)."""

    def follow_up(batch, now_us, new_id):
        if batch.queries[0].type != "a":
            return BatchResult()
        return BatchResult(follow_ups=tuple(Query(q.deadline_us, (i := new_id()), i, now_us, "b", parent=q.id,
                                                  stage=1) for q in batch.queries))

    a, b = _family("a"), _family("b")
    world = World((SimWorker(resident=frozenset(v.actuation.model for v in a.variants)),
                   SimWorker(resident=frozenset(v.actuation.model for v in b.variants))))
    result = Simulator({"a": SlackFit(a), "b": SlackFit(b)}, world, result_model=follow_up).run(
        [0, 0, 0], [1_000_000] * 3, ["a"] * 3)
    sizes = {stage: [r.batch_size for r in result.batches if r.variant_id.startswith(stage)] for stage in "ab"}
    assert sizes["a"] == [1, 2] and sizes["b"] == sizes["a"]
    assert result.summary()["met"] == 3 and len(result.follow_ups) == 3


def test_a_plans_instance_counts_go_to_each_server_once_per_change():
    """``Plan.instances`` is every server's count; ``Plan.server_instances`` a server's own (HybridServe's placement):
    each worker's count is sent when it changes, the workers of one count together."""
    calls: list[tuple[str, int, list[int]]] = []

    class Executor:
        def scale(self, model, instances, workers) -> None:
            calls.append((model, instances, [w.id for w in workers]))

    table = WorkerTable([WorkerState(i) for i in range(4)])  # servers A (0, 1) and B (2, 3)
    placement = Placement(table, Executor(), {}, set, lambda: None)
    own = {0: {"a": 3, "b": 1}, 1: {"a": 3, "b": 1}}
    placement.place(Plan(0, instances={"a": 2, "b": 2}, server_instances=own), Scope())
    assert sorted(calls) == [("a", 2, [2, 3]), ("a", 3, [0, 1]), ("b", 1, [0, 1]), ("b", 2, [2, 3])]
    calls.clear()
    placement.place(Plan(1, instances={"a": 2, "b": 2}, server_instances=own), Scope())
    assert calls == []  # nothing changed
    placement.place(Plan(2, instances={"a": 2, "b": 2}), Scope(workers=frozenset({0, 2})))
    assert sorted(calls) == [("a", 2, [0]), ("b", 2, [0])]  # back to every server's count, in the planner's scope
