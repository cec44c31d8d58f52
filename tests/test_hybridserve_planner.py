"""HybridServe's live planner: a mode's pruned cascade as the plan the BLS reads, its replicas as Triton instance
counts within the budget, skips where they pay, placement over two device kinds, bad options refused; and the
sidecar's cascade policy sending each plan's cascade with every batch."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from scheduler_sidecar.core.plan import Demand, Plan
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.core.queue import EdfQueue
from scheduler_sidecar.core.records import Query, WorkerState
from scheduler_sidecar.experiments.deployment import Device, Request, deploy, instances_set, open_loop
from scheduler_sidecar.experiments.hybridserve import demo
from scheduler_sidecar.live.workers import TritonWorker
from scheduler_sidecar.server import config
from scheduler_sidecar.systems import PlannerContext
from scheduler_sidecar.systems.hybridserve.cascade import Cascade, Outcome
from scheduler_sidecar.systems.hybridserve.live import (
    CascadeModel,
    CascadePlan,
    HybridServeConfig,
    HybridServePlanner,
)
from scheduler_sidecar.systems.hybridserve.planner import OperatingPoint, pruned_point
from scheduler_sidecar.systems.hybridserve.pruning import Pruned, prune
from scheduler_sidecar.systems.hybridserve.search import SearchResult, search

BLS = "cascade"
MODEL = "digits-cascade"


@pytest.fixture(scope="module")
def pruned(hybridserve_family) -> dict[str, Pruned]:
    family = hybridserve_family
    preds = family.predictions("search")
    result = search(preds, family.costs)
    return {mode: prune(preds, family.costs, mode, searched=result) for mode in ("ap", "eo")}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ap", "eo"])
def test_the_plan_deploys_the_pruned_cascade_with_its_replicas_as_instances(hybridserve_family, pruned, mode):
    family, budget = hybridserve_family, 8
    planner = HybridServePlanner(family, pruned_point(family, pruned[mode], mode), BLS, HybridServeConfig(budget),
                                 server=lambda worker: "one")
    plan = planner.plan(0, Demand(0, 1_000_000, {MODEL: 50}, (WorkerState(0), WorkerState(1))))
    kept = [family.names[i] for i in pruned[mode].kept]
    point, skip = pruned[mode].deployed(mode)
    assert isinstance(plan.detail, CascadePlan) and plan.detail.rate_qps == 50.0
    bls = plan.detail.bls  # the BLS's plan: the models Algorithm 2 kept, the thresholds and skips deployed
    assert bls["models"] == kept and bls["skip"] == skip and bls["thresholds"] == list(point.thresholds)
    assert set(bls["temperatures"]) == set(bls["exec_ms"]) == set(kept)
    assert {family.names[r.model] for r in pruned[mode].removed}.isdisjoint(kept)
    # R ∝ ρl within the budget for the cascade's models; one instance, Triton's least, for those it dropped
    replicas = tuple(plan.instances[m] for m in kept)
    assert replicas == planner.point.replicas(family, budget) and sum(replicas) <= budget and min(replicas) >= 1
    assert plan.instances == {m: 1 for m in family.names if m not in kept} | dict(zip(kept, replicas))
    assert plan.placement == {} and plan.detail.placement is None  # one server: both workers its slots


def _outcome(accuracy: float, cost: float) -> Outcome:
    return Outcome((0.5,), accuracy, (1.0, 0.5), (0.5, 0.5), cost)


def _searched(*front: Outcome) -> SearchResult:
    return SearchResult(front, front[-1], front[0], True, len(front), 1)


def test_skips_are_deployed_where_a_skip_point_is_as_accurate_and_cheaper():
    chain = _searched(_outcome(0.90, 5.0), _outcome(0.92, 8.0))  # EO, AP
    paying = _searched(_outcome(0.91, 4.0), _outcome(0.92, 7.0), _outcome(0.93, 9.0))
    pruned = Pruned((0, 1), (), chain.ap, chain, paying)
    assert pruned.deployed("ap") == (paying.front[1], True) and pruned.deployed("eo") == (paying.front[0], True)
    # cheaper only where it loses accuracy, or as accurate only at a higher cost: the chain stays
    costly = _searched(_outcome(0.89, 3.0), _outcome(0.92, 8.5))
    pruned = Pruned((0, 1), (), chain.ap, chain, costly)
    assert pruned.deployed("ap") == (chain.ap, False) and pruned.deployed("eo") == (chain.eo, False)


@pytest.mark.slow
def test_placement_onto_two_device_kinds_follows_the_demand(hybridserve_family, pruned):
    family = hybridserve_family
    servers = {0: "fast", 1: "fast", 2: "slow", 3: "slow"}  # two Triton servers, two slots each
    workers = tuple(WorkerState(w, device="cpu" if s == "fast" else "cpu-x3") for w, s in servers.items())
    settings = HybridServeConfig(8, slowdown=100.0, device_speeds={"cpu-x3": 1 / 3})
    planner = HybridServePlanner(family, pruned_point(family, pruned["eo"], "eo"), BLS, settings,
                                 server=servers.__getitem__)
    busy_s = float(np.dot(planner.point.validation.reach, planner.service_s))  # per request, on a speed-1 device

    def plan(load: float) -> Plan:  # load: the demand's utilisation of a speed-1 device
        return planner.plan(0, Demand(0, 1_000_000, {MODEL: round(load / busy_s)}, workers))

    def serving(p: Plan) -> set[str]:
        return {servers[w] for w, models in p.placement.items() if models == {BLS}}

    light = plan(0.5)  # one device holds it all: no request crosses the network, the other server is let go
    assert light.detail.placement.feasible and light.detail.placement.cost == 0
    assert serving(light) == set(light.detail.placement.devices) and len(serving(light)) == 1
    assert set(light.placement) == set(servers)
    heavy = plan(1.2)  # more than the fast server can run; within both, the slow one at a third of the speed
    placed = heavy.detail.placement
    assert placed.feasible and set(placed.devices) == {"fast", "slow"} and serving(heavy) == {"fast", "slow"}
    on_slow = sum(s.utilisation for s, d in zip(placed.instances, placed.devices) if d == "slow")
    assert 0.2 - 1e-6 <= on_slow <= 1 / 3 + 1e-6
    over = plan(2.0)  # beyond both: no placement fits, and every server serves
    assert not over.detail.placement.feasible and serving(over) == {"fast", "slow"}
    assert light.instances == heavy.instances == over.instances  # R ∝ ρl where no placement fits
    # each serving server runs what the placement put on it (at least one of each model: its BLS calls only its own)
    models = planner.point.cascade.models
    for p in (light, heavy):
        placed = p.detail.placement
        on = Counter((models[i.model], d) for i, d in zip(placed.instances, placed.devices))
        assert set(p.server_instances) == {w for w, s in servers.items() if s in placed.devices}
        for w, counts in p.server_instances.items():
            assert counts == {m: max(1, on[m, servers[w]]) for m in models}
    assert sum(heavy.server_instances[w][m] for w in (0, 2) for m in models) >= len(heavy.detail.placement.instances)
    assert heavy.server_instances[0] != heavy.server_instances[2]  # the two kinds hold different counts
    assert over.server_instances == {}  # no placement: every server alike
    sick = planner.plan(0, Demand(0, 1_000_000, {}, (*workers[:3], WorkerState(3, healthy=False))))
    assert 3 not in sick.placement  # an unhealthy worker keeps what it has


@pytest.mark.slow
@pytest.mark.triton
def test_the_sidecar_serves_a_per_server_plan_on_two_tritons(hybridserve_family, pruned, tmp_path):
    """The sidecar in front of two Tritons, the second an emulated device 3x slower (its kind's speed 1/3 to the
    planner), under a demand the faster one alone cannot carry: the placement program's counts differ between the
    two, the sidecar sets each Triton's as the plan says (one call per server and model), each Triton then runs what
    the sidecar logged for it, and every request is answered."""
    from export.repository import write_cascade  # onnx, torch: only this test

    family, rate_qps, duration_s, bls_name = hybridserve_family, 40.0, 6.0, "cascade_on_two"
    stamp = family.folder / "cascade.json"
    point = pruned_point(family, pruned["eo"], "eo")  # the point the sidecar's planner finds from the same options
    # the emulated device on which the demand is 1.1x what the faster server alone serves (kernels one at a time)
    slowdown = 1.1 / rate_qps / float(np.dot(point.validation.reach, point.service_s(family)))
    settings = HybridServeConfig(8, slowdown=slowdown, period_s=2.0, device_speeds={"cpu-x3": 1 / 3})
    planner = HybridServePlanner(family, point, bls_name, settings)
    # a BLS of its own name, beside the family's repository (whose own is another test's)
    bls = write_cascade(tmp_path / "bls", bls_name, planner.bls_plan, family.names, max_batch_size=demo.ROWS,
                        instances=4).parent
    profile = demo.cascade_profile(tmp_path / "profile.json", family, point, slowdown, bls_name,
                                   speeds={"cpu": 1.0, "cpu-x3": 1 / 3})
    toml = demo.sidecar_config(stamp, profile, "eo", True, settings, slo_ms=60_000.0)
    images, _ = family.images("test")
    arrivals = np.arange(0, duration_s, 1 / rate_qps)
    with deploy([family.folder / "repository", bls], [*family.names, bls_name],
                [Device(slowdown, "cpu"), Device(3 * slowdown, "cpu-x3")], config=toml) as d:
        answers = asyncio.run(open_loop(d.sidecar.grpc_url, arrivals, lambda i: Request(
            demo.MODEL, {"INPUT": images[i % len(images)][None]}, {})))
        urls = [t.grpc_url for t in d.tritons]

        def logged() -> dict[str, dict[str, int]]:  # the counts the sidecar last set on each Triton
            return instances_set(d.sidecar.log_path.read_text(), urls)

        async def settle() -> tuple[dict, dict]:
            tritons = {url: TritonWorker(url) for url in urls}
            try:  # a plan may be in flight: poll until what each Triton runs is what the sidecar last said
                for _ in range(100):
                    said = logged()
                    runs = {url: {m: (await t.describe(m)).instances for m in family.names}
                            for url, t in tritons.items()}
                    if all(runs[url][m] == n for url in said for m, n in said[url].items()):
                        break
                    await asyncio.sleep(0.2)
                return said, runs
            finally:
                await asyncio.gather(*(t.close() for t in tritons.values()))

        said, runs = asyncio.run(settle())
        log = d.sidecar.log_path.read_text()
    assert all(a.result is not None for a in answers), [a.error for a in answers if a.result is None][:3]
    fast, slow = (t.grpc_url for t in d.tritons)
    assert set(said[fast]) == set(said[slow]) >= set(point.cascade.models), log[-3000:]
    assert all(runs[url][m] == n for url in said for m, n in said[url].items())
    assert said[fast] != said[slow]  # one plan, a different count of some model on each server


@pytest.fixture
def family_file(tmp_path) -> Path:
    path = tmp_path / "cascade.json"
    path.write_text("{}")  # checking the options reads no further than that it is a file
    return path


@pytest.mark.parametrize("options, message", [
    ({"family": None}, "needs 'family'"),
    ({"family": "nowhere/cascade.json"}, "is not a file"),
    ({"modes": "ap"}, r"unknown options \['modes'\]"),
    ({"mode": "fast"}, "mode must be one of"),
    ({"prune": "yes"}, "prune must be true or false"),
    ({"instances": 0}, "instances must be a whole number >= 1"),
    ({"instances": 2.5}, "instances must be a whole number >= 1"),
    ({"rounding": "ceil"}, "rounding must be"),
    ({"slowdown": -1.0}, "slowdown must be > 0"),
    ({"min_demand_qps": -1}, "min_demand_qps must be >= 0"),
    ({"device_speeds": {"cpu": 0}}, "device_speeds must map"),
])
def test_bad_options_are_refused(family_file, options, message):
    options = {k: v for k, v in {"family": str(family_file), **options}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        config.PlannerSpec("hybridserve", options)


def test_a_config_file_names_the_planner_of_its_one_cascade(tmp_path, family_file):
    path = tmp_path / "sidecar.toml"
    planner = (f'[planner]\nkind = "hybridserve"\nfamily = "{family_file}"\nmode = "eo"\ninstances = 12\n'
               'device_speeds = { "cpu-x3" = 0.5 }\n')
    cascade = f'[[models]]\nname = "{MODEL}"\nprofile = "p.json"\npolicy = "cascade"\n'
    path.write_text(f'workers = ["h:1"]\n{planner}{cascade}')
    (spec,) = config.load(path).planners
    settings = spec.settings
    assert (settings.family, settings.mode, settings.prune) == (family_file, "eo", True)
    assert settings.config == HybridServeConfig(12, device_speeds={"cpu-x3": 0.5})
    for models, message in ((cascade.replace('"cascade"', '"slackfit"'), r"plans no model: none is served by its policy 'cascade'"),
                            (cascade + cascade.replace(MODEL, "other"), "plans one model")):
        path.write_text(f'workers = ["h:1"]\n{planner}{models}')
        with pytest.raises(ValueError, match=message):
            config.load(path)


@pytest.mark.slow
def test_a_budget_below_the_cascades_models_is_refused_when_the_planner_is_built(hybridserve_family):
    spec = config.PlannerSpec("hybridserve", {"family": str(hybridserve_family.folder / "cascade.json"),
                                              "mode": "eo", "prune": False, "instances": 2})
    context = PlannerContext({MODEL: cascade_profile()}, {}, [], str)
    with pytest.raises(ValueError, match="need at least 4 instances"):
        spec.entry.build(spec.settings, context)


def cascade_profile() -> Profile:
    """The logical model of one cascade, served by the BLS model ``BLS``."""
    curve = LatencyCurve((1, 32), (10.0, 50.0), (10.0, 50.0))
    return Profile(MODEL, "test", (Variant("cascade", 0.93, Actuation("pipeline", BLS, path=("a", "b")),
                                           {"cpu": curve}),))


def test_the_cascade_policy_sends_each_plans_cascade_with_every_batch():
    policy = CascadeModel(cascade_profile())
    queue = EdfQueue()
    for i in range(3):
        queue.push(Query(1_000_000, i, i, 0, MODEL))

    def sent() -> dict:
        (dispatch,) = policy.decide(0, queue.view(), [WorkerState(0)]).dispatches
        assert dispatch.query_ids == (0, 1, 2)
        return dict(dispatch.params)

    assert set(sent()) == {"budget_ms"}  # no plan yet: the BLS's deployed one
    outcome = Outcome((0.7,), 0.93, (1.0, 0.4), (0.6, 0.4), 2.0)
    point = OperatingPoint("eo", Cascade(("a", "b"), (0.7,), True), outcome, outcome)
    bls = {"models": ["a", "b"], "thresholds": [0.7], "skip": True, "temperatures": {"a": 1.0, "b": 1.2},
           "exec_ms": {"a": 1.0, "b": 3.0}}
    policy.observe_plan(0, Plan(0, {}, CascadePlan(point, bls, {"a": 1, "b": 3}, 10.0), {"a": 1, "b": 3}))
    params = sent()
    assert json.loads(params["cascade_plan"]) == bls and params["budget_ms"] == pytest.approx(1000.0)
    policy.observe_plan(1, Plan(1))  # another planner's plan says nothing about the cascade
    assert json.loads(sent()["cascade_plan"]) == bls
