"""Faults in any order lose nothing: for every registered policy (and Loki's per-task policy), clients that leave,
workers lost and back, workers added and removed, rolling updates (add one, then drain the oldest), batches that
fail, policy switches and plan changes arrive in any order between two decisions (Hypothesis draws the sequences),
on a fake clock. Membership reaches the engine as the live driver hands it: the full set of serving workers. Every request is answered or gets its own explicit
error, and no event makes the engine raise."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler_sidecar.core.engine import Engine, QueryType
from scheduler_sidecar.core.plan import Plan, Planner
from scheduler_sidecar.core.records import Batch, BatchResult, Outcome, Query, WorkerState
from scheduler_sidecar.errors import WorkerFailed
from scheduler_sidecar.systems import make_policy, policies
from scheduler_sidecar.systems.loki import milp
from scheduler_sidecar.systems.loki.planner import LokiPlan
from scheduler_sidecar.systems.loki.policy import DropMode, LokiTask, Router
from scheduler_sidecar.systems.loki.routing import Replica, Routing
from scheduler_sidecar.systems.proteus.routing import Route
from scheduler_sidecar.systems.proteus.routing import Routing as ProteusRouting
from scheduler_sidecar.systems.superserve.slackfit import SlackFit
from tests.builders import POLICY_OPTIONS, make_profile
from tests.test_loki_policy import PIPE

WORKERS = 2  # few workers: more events land on a busy one
TYPE = "m"
PROFILE = make_profile()
SERVED = {Outcome.MET, Outcome.LATE}


class Scripted(Planner):
    """Hands the engine the plan a test event chose (the engine asks; this answers inline), over the workers it has
    when asked: ``next`` makes the plan from the ids of the first two (the same one twice when only one is left)."""

    period_us = 10**12

    def __init__(self) -> None:
        self.next = lambda first, second: Plan(0)

    def plan(self, now_us, demand):
        ids = sorted(w.id for w in demand.workers if w.healthy) or sorted(w.id for w in demand.workers)
        return self.next(ids[0], ids[min(1, len(ids) - 1)]) if ids else Plan(now_us)


class Harness:
    """An engine over fake workers: batches run until an event completes or fails them."""

    def __init__(self, make, plans) -> None:
        self.make, self.plans = make, plans
        self.now = 0
        self.running: dict[int, Batch] = {}
        self.ends: dict[int, list] = {}
        self.cancelled: set[int] = set()
        self.planner = Scripted()
        self.device = make(0).device
        # the serving set, as the live driver's membership hands it to the engine; ids are never reused
        self.serving = {i: WorkerState(i, device=self.device) for i in range(WORKERS)}
        self.next_worker = WORKERS
        self.engine = Engine([QueryType(TYPE, make(0))], list(self.serving.values()), self, clock=lambda: self.now,
                             on_end=self._on_end)
        self.planner.next = plans[0]
        self.engine.add_planner(self.planner)  # as a deployment does: a plan is in force before any request
        self.ids = 0

    # the engine's executor
    def run_batch(self, batch: Batch) -> None:
        self.running[batch.worker_id] = batch

    def load(self, worker, model) -> int:
        return 1

    def unload(self, worker, model) -> None:
        pass

    def wake_at(self, time_us) -> None:
        pass

    def scale(self, model, instances, workers) -> None:
        pass

    def plan(self, planner, now_us, demand) -> None:
        self.engine.apply_plan(planner, planner.plan(now_us, demand))

    def _on_end(self, record, output, error) -> None:
        self.ends.setdefault(record.query_id, []).append((record.outcome, error))

    # what the test scripts
    def event(self, kind: str, k: int) -> None:
        engine, running = self.engine, sorted(self.running)
        if kind == "arrive":  # a burst of k + 1
            for _ in range(k + 1):
                self.ids += 1
                engine.arrive(Query(self.now + 20_000 + 10_000 * k, self.ids, self.ids, self.now, TYPE))
        elif kind == "cancel":
            queued = [q.id for q in engine.types[TYPE].queue.scan()]
            if queued and engine.cancel(queued[k % len(queued)], TYPE):
                self.cancelled.add(queued[k % len(queued)])
        elif kind in ("complete", "fail") and running:
            batch = self.running.pop(running[k % len(running)])
            if kind == "complete":
                engine.batch_done(batch, BatchResult())
            else:
                engine.batch_failed(batch, WorkerFailed("the model failed this batch"))
        elif kind == "lost":  # a worker running a batch, if one is (the batch goes back to the queue)
            worker = running[k % len(running)] if running else self._pick(k)
            self.running.pop(worker, None)
            if worker in self.serving:
                self.serving[worker] = replace(self.serving[worker], healthy=False)
                engine.update_workers(self.serving.values())
            else:  # a leaving worker died while finishing its batch
                engine.set_health(worker, False)
        elif kind == "back" and self.serving:
            worker = self._pick(k)
            self.serving[worker] = replace(self.serving[worker], healthy=True)
            engine.update_workers(self.serving.values())
        elif kind == "add":
            self._add()
        elif kind == "remove" and self.serving:
            del self.serving[self._pick(k)]
            engine.update_workers(self.serving.values())
        elif kind == "roll":  # a Deployment rolls one pod: the new one is admitted, then the oldest drained
            self._add()
            del self.serving[min(self.serving)]
            engine.update_workers(self.serving.values())
        elif kind == "switch":  # to a fresh policy of the same kind, or to SlackFit on the same profile
            first = self.make(k)
            engine.set_policy(TYPE, first if k % 2 else SlackFit(first.profile, device=first.device))
        elif kind == "plan":
            self.planner.next = self.plans[k % len(self.plans)]
            engine.request_plan(self.planner)
        elif kind == "tick":
            self.now += 1_000 * (k + 1)
            engine.wakeup()

    def _pick(self, k: int) -> int:
        ids = sorted(self.serving)
        return ids[k % len(ids)] if ids else -1

    def _add(self) -> None:
        self.serving[self.next_worker] = WorkerState(self.next_worker, device=self.device)
        self.next_worker += 1
        self.engine.update_workers(self.serving.values())

    def check(self) -> None:
        """The engine's books: its count of free workers, and a routing policy's queues holding what is queued."""
        engine = self.engine
        assert engine.table.free == sum(w.is_free for w in engine.workers)
        # every serving worker is in the engine, with the health it was given; the rest are draining or gone
        by_id = {w.id: w for w in engine.workers}
        assert all(by_id[wid].healthy == w.healthy for wid, w in self.serving.items())
        assert set(self.running) <= set(by_id)
        qt = engine.types[TYPE]
        if qt.routes is not None:
            assert set(qt.routes.where) == {q.id for q in qt.queue.scan()}

    def drain(self, down: int | None) -> None:
        """Every worker back but ``down``, every batch completed, time on: until nothing is queued or running (a
        query routed to the worker left down must find another)."""
        if len(self.serving) < WORKERS:  # scaled in below the deployment's size: it scales out again
            for _ in range(WORKERS - len(self.serving)):
                self._add()
        down = sorted(self.serving)[down] if down is not None else None
        self.serving = {w: replace(s, healthy=w != down) for w, s in self.serving.items()}
        self.engine.update_workers(self.serving.values())
        self.running.pop(down, None)
        for _ in range(10_000):
            if not self.running and not self.engine.queued():
                return
            for wid in sorted(self.running):
                self.engine.batch_done(self.running.pop(wid), BatchResult())
            self.now += 5_000
            self.engine.wakeup()
        raise AssertionError(f"not drained: {self.engine.queued()} queued, {len(self.running)} running")


# a plan list's entries make a plan over two worker ids (the planner's first two workers when it is asked)
def proteus_plans() -> list:
    v = [x.id for x in PROFILE.variants]
    routings = [lambda a, b: (Route(a, v[3], 0.5, 4), Route(b, v[2], 0.5, 4)),
                lambda a, b: (Route(b, v[0], 1.0, 8),), lambda a, b: ()]
    return [lambda a, b, r=r: Plan(0, {}, ProteusRouting({TYPE: r(a, b)}, {TYPE: 100.0})) for r in routings]


def loki_plans() -> list:
    def plan(replicas: tuple[Replica, ...]) -> Plan:
        routing = Routing({r.worker_id: r for r in replicas}, {}, {"cls": ((replicas[-1].worker_id, 50.0),)},
                          {r.worker_id: 10.0 for r in replicas})
        return Plan(0, {}, LokiPlan(50.0, milp.Solution("accuracy", (), {}, 1.0, 0.9, 0.0), routing))

    big, small = ("big", 0.95, 20.0), ("small", 0.8, 5.0)
    return [lambda a, b: plan((Replica(a, "cls", *big[:1], 1, big[2], 50.0, big[1]),
                               Replica(b, "cls", *small[:1], 4, small[2], 200.0, small[1]))),
            lambda a, b: plan((Replica(b, "cls", *small[:1], 1, small[2], 200.0, small[1]),))]


@pytest.fixture(scope="module")
def ramsis_dir(tmp_path_factory):
    """RAMSIS' MDP policies for 3 workers, generated once (generation takes about a second)."""
    from scheduler_sidecar.systems.ramsis.generate import generate_set
    from scheduler_sidecar.systems.ramsis.mdp import MdpSpec
    from scheduler_sidecar.systems.ramsis.model_table import MAX_QUEUE, from_profile

    out = tmp_path_factory.mktemp("ramsis")
    table = from_profile(PROFILE, "cpu", "p99_ms", MAX_QUEUE).pareto()
    generate_set(table, MdpSpec(36.0, WORKERS, 1.0, 100, min(MAX_QUEUE, 16)), [100.0], out, refine=False)
    return out


def factory(name: str, ramsis_dir):
    """A fresh policy of kind ``name`` per call, and the plans its events may switch between."""
    if name == "loki-task":
        return (lambda k: LokiTask(PIPE, "cls", Router(PIPE, DropMode.REROUTING, budget="paper"), device="gpu"),
                loki_plans())
    options = dict(POLICY_OPTIONS.get(name, {}))
    if name == "ramsis":
        options = {"policy_dir": ramsis_dir}
    elif "workers" in options:
        options["workers"] = WORKERS
    if name in ("loki", "cascade"):
        options["max_batch"] = 4
    return (lambda k: make_policy(name, PROFILE, **options)), \
        proteus_plans() if name == "proteus" else [lambda a, b: Plan(0)]


EVENTS = st.lists(st.tuples(st.sampled_from(["arrive", "cancel", "lost", "back", "add", "remove", "roll", "complete",
                                             "fail", "switch", "plan", "tick"]),
                            st.integers(0, 7)), max_size=40)


@pytest.mark.parametrize("name", [*sorted(policies()), "loki-task"])
def test_faults_in_any_order_lose_no_request(name, ramsis_dir):
    make, plans = factory(name, ramsis_dir)

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(EVENTS)
    # the case: a client leaves while a worker running a batch is lost, then the workers go on (a policy
    # that kept a copy of its queue resynced only when the two counts differed, and here they did not)
    @example([("arrive", 5), ("cancel", 0), ("lost", 1), ("complete", 0)])
    # issue 43's rolling update: a worker leaves while serving, a new one joins, the other keeps serving
    @example([("arrive", 3), ("roll", 0), ("arrive", 3), ("roll", 0), ("complete", 0), ("complete", 1)])
    # the plan's only worker of Loki's task down and the other back: the queries it held wait for no period
    @example([("arrive", 0)] * 11 + [("lost", 1), ("plan", 0)])
    def run(events):
        h = Harness(make, plans)
        for kind, k in events:
            h.event(kind, k)
            h.check()
        h.drain(down=0 if len(events) % 2 else None)
        h.check()
        assert sorted(h.ends) == list(range(1, h.ids + 1))  # every request ended...
        for qid, ends in h.ends.items():
            assert len(ends) == 1, (qid, ends)  # ...exactly once
            outcome, error = ends[0]
            if qid in h.cancelled:
                assert outcome is Outcome.CANCELLED
            else:  # answered, or told why not
                assert outcome in SERVED or (outcome is not Outcome.CANCELLED and error is not None), (qid, ends)

    run()


# ------------------------------------------------------------------------------------------------ blast radius
def _on_gpu(prefix: str):
    """PROFILE's variants on Triton models of their own (``prefix``0, ...), on the gpu device kind Loki's pipeline
    uses, so that five systems share one pool with no model in common."""
    from scheduler_sidecar.core.profile import Actuation  # this test's only

    return replace(PROFILE, name=prefix, variants=tuple(
        replace(v, id=f"{prefix}{i}", actuation=Actuation("model", f"{prefix}{i}"), latency={"gpu": v.latency["cpu"]})
        for i, v in enumerate(PROFILE.variants)))


class Fixed(Scripted):
    """One plan, for the types and workers of its scope."""

    def __init__(self, plan, scope) -> None:
        super().__init__()
        self.next, self.scope = plan, scope


def five_systems(tmp_path):
    """SuperServe (SlackFit), RAMSIS, Proteus, Loki (its classification task) and HybridServe (its cascade policy)
    on one engine, as `accscale demo all` deploys them: each system's models on workers of their own, Proteus and
    Loki planned over theirs. Returns the policies by query type, the workers and the planners."""
    from scheduler_sidecar.core.plan import Scope  # this test's only
    from scheduler_sidecar.systems.ramsis.generate import generate_set  # this test's only
    from scheduler_sidecar.systems.ramsis.mdp import MdpSpec  # this test's only
    from scheduler_sidecar.systems.ramsis.model_table import MAX_QUEUE, from_profile  # this test's only

    ramsis = _on_gpu("r")
    generate_set(from_profile(ramsis, "gpu", "p99_ms", MAX_QUEUE).pareto(), MdpSpec(36.0, 1, 1.0, 100, 16),
                 [100.0], tmp_path, refine=False)
    proteus = _on_gpu("p")
    policies = {
        "superserve": SlackFit(_on_gpu("s"), device="gpu"),
        "ramsis": make_policy("ramsis", ramsis, policy_dir=tmp_path, device="gpu"),
        "proteus": make_policy("proteus", proteus, query_type="proteus", device="gpu"),
        "cls": LokiTask(PIPE, "cls", Router(PIPE, DropMode.REROUTING, budget="paper"), device="gpu"),
        "hybridserve": make_policy("cascade", _on_gpu("h"), device="gpu", max_batch=4),
    }
    # Loki's plan (loki_plans) routes to workers 0 and 1; Proteus's to 2
    models = {t: frozenset(v.actuation.model for v in p.profile.variants) for t, p in policies.items()}
    holds = {"cls": (0, 1), "proteus": (2,), "superserve": (3,), "ramsis": (4,), "hybridserve": (5,)}
    workers = [WorkerState(w, device="gpu", resident=models[t]) for t, ws in holds.items() for w in ws]
    p = [v.id for v in proteus.variants]
    planners = [Fixed(loki_plans()[0], Scope(frozenset({"cls"}), frozenset(holds["cls"]))),
                Fixed(lambda a, b: Plan(0, {}, ProteusRouting({"proteus": (Route(a, p[3], 1.0, 4),)},
                                                              {"proteus": 100.0})),
                      Scope(frozenset({"proteus"}), frozenset(holds["proteus"])))]
    return policies, workers, planners


class Pool:
    """An engine as the live driver builds it (a fault handler, so a fault stays in its model), over fake workers
    that run a batch until the test completes it."""

    def __init__(self, policies, workers, planners) -> None:
        self.now = 0
        self.running: dict[int, Batch] = {}
        self.ends: dict[str, list] = {t: [] for t in policies}
        self.faults: list[tuple[str, str]] = []
        self.engine = Engine([QueryType(t, p) for t, p in policies.items()], workers, self, clock=lambda: self.now,
                             on_end=lambda record, output, error: self.ends[record.query_type].append(
                                 (record.outcome, error)),
                             on_fault=lambda name, culprit, exc: self.faults.append((name, culprit)))
        for planner in planners:
            self.engine.add_planner(planner)

    run_batch = Harness.run_batch
    load, unload, wake_at, scale = Harness.load, Harness.unload, Harness.wake_at, Harness.scale

    def plan(self, planner, now_us, demand) -> None:
        self.engine.apply_plan(planner, planner.plan(now_us, demand))

    def serve(self, arrivals: int) -> None:
        """``arrivals`` rounds of one query of every type every 2 ms, completing what runs as the clock moves on."""
        ids = 0
        for _ in range(arrivals):
            for name in self.ends:
                ids += 1
                self.engine.arrive(Query(self.now + 200_000, ids, ids, self.now, name))
            self.now += 2_000
            for wid in sorted(self.running):
                self.engine.batch_done(self.running.pop(wid), BatchResult())
            self.engine.wakeup()
        for _ in range(200):
            for wid in sorted(self.running):
                self.engine.batch_done(self.running.pop(wid), BatchResult())
            self.now += 2_000
            self.engine.wakeup()


@pytest.mark.parametrize("culprit", ["superserve", "ramsis", "proteus", "cls", "hybridserve"])
def test_a_policy_that_raises_fails_only_its_own_model(culprit, tmp_path):
    """Five systems on one pool; one policy's decide() starts raising after its tenth call. Its model's requests
    after that get InternalError, and the fault handler names it; every request of the other four is served."""
    from scheduler_sidecar.errors import InternalError  # this test's only

    policies, workers, planners = five_systems(tmp_path)
    planted, calls = policies[culprit], []
    healthy_decide = planted.decide

    def decide(now_us, queue, workers):
        calls.append(now_us)
        if len(calls) > 10:
            raise RuntimeError("a planted bug")
        return healthy_decide(now_us, queue, workers)

    planted.decide = decide
    pool = Pool(policies, workers, planners)
    pool.serve(100)
    for name, ends in pool.ends.items():
        outcomes = [outcome for outcome, _ in ends]
        assert len(ends) == 100, name  # every request ended, once
        if name == culprit:
            failed = [error for outcome, error in ends if outcome is Outcome.FAILED]
            assert failed and all(isinstance(e, InternalError) and "a planted bug" in str(e) for e in failed)
            assert len(failed) + sum(o in SERVED for o in outcomes) == 100
        else:
            assert all(o in SERVED for o in outcomes), (name, sorted({o.value for o in outcomes}))
    assert pool.faults and {name for name, _ in pool.faults} == {culprit}
    assert {who for _, who in pool.faults} == {planted.name}


class Everywhere(Scripted):
    """Places its type's models on both of its first workers whatever it is told, and keeps the demands it gets."""

    def __init__(self, scope, models) -> None:
        super().__init__()
        self.scope, self.models, self.demands = scope, models, []

    def plan(self, now_us, demand):
        self.demands.append(demand)
        return Plan(now_us, {0: self.models, 1: self.models})


def test_a_worker_draining_its_batch_is_no_stray_of_a_plan_made_while_it_was_its_planners():
    """A planner owns workers 0 and 1; worker 1 leaves while it runs a batch (a rolling update drains it), then the
    driver narrows the planner's scope to worker 0. The plans made meanwhile still place on 1: they are applied with 1
    skipped, the next demand leaves the draining worker out, no query fails, and every query is answered (before,
    the plan was refused as placing on a worker its planner does not own, failing the type's queued queries)."""
    from scheduler_sidecar.core.plan import Scope  # this test's only

    family = _on_gpu("s")
    models = frozenset(v.actuation.model for v in family.variants)
    planner = Everywhere(Scope(frozenset({"s"}), frozenset({0, 1})), models)
    pool = Pool({"s": SlackFit(family, device="gpu")}, [WorkerState(w, device="gpu", resident=models) for w in (0, 1)],
                [planner])
    engine = pool.engine
    for i in range(6):
        engine.arrive(Query(200_000, i, i, 0, "s"))
    assert sorted(pool.running) == [0, 1]
    engine.update_workers([engine.workers[0]])  # 1 leaves, still running its batch
    engine.set_scope(planner, [0])
    assert pool.faults == [] and engine.has_worker(1)
    assert {w.id for w in planner.demands[-1].workers} == {0}
    for _ in range(20):
        pool.now += 10_000
        for wid in sorted(pool.running):
            engine.batch_done(pool.running.pop(wid), BatchResult())
        engine.wakeup()
    assert not engine.has_worker(1) and [o for o, _ in pool.ends["s"]] == [Outcome.MET] * 6
