"""Proteus and the systems it is compared with (§6.1.1, §6.4, §6.5), each a planner setting plus a batching
strategy, run in the simulator over a heterogeneous cluster; and the paper's metrics (§6.1.4).

| system | planner | batching |
|---|---|---|
| proteus | MILP every period and on bursts | adaptive (§5) |
| clipper-ha / clipper-ht | MILP once, most accurate SLO-feasible / least accurate variant per type, planned for the largest demand of the trace's mix it can serve | AIMD |
| sommelier (= w/o MP) | MILP, each worker keeps its type after the first plan | adaptive |
| w/o MS | MILP, most accurate SLO-feasible variants only | adaptive |
| w/o AB | MILP | batch size 1 |
| w/o QA | MILP, routing even over a type's replicas | adaptive |
| infaas-accuracy | greedy autoscaler every second (:mod:`.infaas`) | work-conserving up to B_max |
| ARTIFACT: proteus, sommelier, infaas-accuracy as the authors' code runs them | as above, every 10 s; Proteus with headroom 1.05, Sommelier 1.5, each given up to 1 before demand | as above |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.records import Outcome
from scheduler_sidecar.experiments.proteus.data import Counts, arrivals
from scheduler_sidecar.experiments.proteus.infaas import PERIOD_S as INFAAS_PERIOD_S
from scheduler_sidecar.experiments.proteus.infaas import InfaasPlanner
from scheduler_sidecar.sim.results import OUTCOME_CODES, SimResult
from scheduler_sidecar.sim.simulator import Simulator
from scheduler_sidecar.sim.world import SimWorker, World
from scheduler_sidecar.systems.proteus import milp
from scheduler_sidecar.systems.proteus.planner import (
    ProteusConfig,
    ProteusPlanner,
    least_accurate,
    most_accurate_feasible,
)
from scheduler_sidecar.systems.proteus.policy import Proteus

STATIC_DEMAND_QPS = 1e6  # Clipper plans for "as much as it can" of the trace's mix: the MILP scales this down
METRIC_WINDOW_S = 10  # the artifact's window for the maximum accuracy drop


def for_the_mix(config: ProteusConfig) -> ProteusConfig:
    """A plan for "as much as the cluster serves of a mix" (Clipper's one plan, a capacity): every type lowered by one
    factor, so the plan keeps the mix's proportions whatever rule re-plans live."""
    return replace(config, overload="uniform")


@dataclass(frozen=True)
class System:
    name: str
    batching: str = "proteus"
    variants: str = "all"  # "all", "ha" (most accurate SLO-feasible) or "ht" (least accurate)
    static: bool = False
    fixed_types: bool = False
    uniform_routing: bool = False
    planner: str = "proteus"  # or "infaas" (INFaaS-Accuracy's greedy autoscaler)
    infaas_period_s: float = INFAAS_PERIOD_S  # how often INFaaS-Accuracy's autoscaler runs (the artifact's: 10 s)
    headroom: float | None = None  # the MILP's planned capacity over demand (its beta), where not the setup's
    headroom_floor: float | None = None  # ... given up to this before demand is, under overload (milp's note)
    period_s: float | None = None  # the MILP's re-planning period, where not the setup's


SYSTEMS = {s.name: s for s in (
    System("proteus"),
    System("clipper-ha", batching="aimd", variants="ha", static=True),
    System("clipper-ht", batching="aimd", variants="ht", static=True),
    System("sommelier", fixed_types=True),
    System("infaas-accuracy", batching="nexus", planner="infaas"),
)}
# INFaaS-Accuracy at the authors' artifact's interval (its autoscaler every 10 s, digest A.7; still from the last
# second's counts), where the paper has INFaaS decide as load arrives
ARTIFACT_INFAAS = System("infaas-accuracy (artifact: every 10 s)", batching="nexus", planner="infaas",
                         infaas_period_s=10.0)
# Proteus and Sommelier as the artifact runs them (digest A.4, A.7): their MILP re-planned every 10 s with beta 1.05
# and 1.5 (headroom given up before demand when it cannot be had); with ARTIFACT_INFAAS, the authors' code's systems,
# keyed by the name the text gives each
ARTIFACT_PROTEUS = System("proteus (artifact: beta 1.05, every 10 s)", headroom=milp.ARTIFACT_HEADROOM,
                          headroom_floor=milp.ARTIFACT_HEADROOM_FLOOR, period_s=10.0)
ARTIFACT_SOMMELIER = System("sommelier (artifact: beta 1.5, every 10 s)", fixed_types=True,
                            headroom=milp.ARTIFACT_SOMMELIER_HEADROOM, headroom_floor=milp.ARTIFACT_HEADROOM_FLOOR,
                            period_s=10.0)
ARTIFACT = {"proteus": ARTIFACT_PROTEUS, "sommelier": ARTIFACT_SOMMELIER, "infaas-accuracy": ARTIFACT_INFAAS}
ABLATIONS = {s.name: s for s in (
    System("w/o MS", variants="ha"),
    System("w/o MP", fixed_types=True),
    System("w/o AB", batching="single"),
    System("w/o QA", uniform_routing=True),
)}


@dataclass(frozen=True)
class Setup:
    profiles: Mapping[str, Profile]  # query type -> its family
    cluster: Mapping[str, int]  # device kind -> workers
    slo_ms: float | Mapping[str, float]  # every query type's, or each one's
    config: ProteusConfig = field(default_factory=ProteusConfig)
    load_ms: float | None = None  # model load time; None: each profile's measured one where known, else 0 (the artifact's)
    fail_at_s: tuple[float, ...] = ()  # one worker (the lowest id still healthy) fails at each time
    latency_noise: str = "none"  # "tail": each batch's latency drawn between its p50 and p99 (World's)
    admission: bool = False  # refuse what the queue ahead makes infeasible, as the sidecar does by default

    def slo_of(self, family: str) -> float:
        return float(self.slo_ms) if isinstance(self.slo_ms, (int, float)) else float(self.slo_ms[family])


@dataclass(frozen=True)
class Run:
    system: str
    result: SimResult
    types: np.ndarray  # query type index per query
    type_names: tuple[str, ...]
    plans: int

    def metrics(self) -> dict[str, float]:
        return metrics(self.result)


def settings(name: str, system: System, setup: Setup) -> dict:
    """What ``system`` runs with under ``setup``, as :func:`simulate_queries` applies it: a comparison's settings side
    by side, read from the run's own objects."""
    c = _config(system, setup.config)
    return {"system": name, "devices": " ".join(f"{n} {k}" for k, n in setup.cluster.items()),
            "slo_ms": setup.slo_ms if isinstance(setup.slo_ms, (int, float)) else "per family",
            "planner": "none (one plan)" if system.static else system.planner,
            "period_s": system.infaas_period_s if system.planner == "infaas" else c.period_s,
            "ewma_com": c.ewma_com, "headroom": c.headroom,
            "overload": c.overload,
            "variants": {"all": "all", "ha": "most accurate feasible", "ht": "least accurate"}[system.variants],
            "batching": system.batching, "types per device": "fixed" if system.fixed_types else "any",
            "routing": "uniform" if system.uniform_routing else "planned"}


def simulate(system: System, setup: Setup, counts: Counts, *, seed: int = 0) -> Run:
    """Run ``system`` over the trace ``counts`` (Poisson arrivals within each second, seeded)."""
    if system.static:  # Clipper: one plan, for as much of the trace's mix as it can serve
        initial = {f: STATIC_DEMAND_QPS * share for f, share in counts.mean_mix().items()}
    else:  # where the artifact starts from a precomputed allocation: the trace's first 10 s
        initial = dict(zip(counts.families, counts.per_second[:10].mean(axis=0).tolist()))
    arrival_us, deadline_us, names = arrivals(counts, setup.slo_ms, seed=seed)
    return simulate_queries(system, setup, counts.families, arrival_us, deadline_us, names, initial, seed=seed)


def simulate_queries(system: System, setup: Setup, families: Sequence[str], arrival_us: np.ndarray,
                     deadline_us: np.ndarray, names: Sequence[str], initial_demand: Mapping[str, float], *,
                     seed: int = 0) -> Run:
    """Run ``system`` over given queries (``names``: each one's query type); the planner starts from
    ``initial_demand`` (q/s per type)."""
    kinds = [k for k, n in setup.cluster.items() for _ in range(n)]
    world = World(tuple(SimWorker(k, resident=frozenset()) for k in kinds), seed=seed, load_ms=setup.load_ms,
                  fail_at_s=setup.fail_at_s, latency_noise=setup.latency_noise)
    families = tuple(families)
    profiles = {f: setup.profiles[f] for f in families}
    allowed = None
    if system.variants == "ha":
        allowed = _most_accurate(setup, profiles)
    elif system.variants == "ht":
        allowed = {f: frozenset({least_accurate(p)}) for f, p in profiles.items()}
    slo = {f: setup.slo_of(f) for f in families}
    if system.planner == "infaas":
        planner: ProteusPlanner = InfaasPlanner(profiles, list(enumerate(kinds)), slo, setup.config,
                                                initial_demand=initial_demand, period_s=system.infaas_period_s)
    else:
        planner = ProteusPlanner(profiles, list(enumerate(kinds)), slo, _config(system, setup.config),
                                 initial_demand=initial_demand,
                                 allowed=allowed, fixed_types=system.fixed_types, static=system.static,
                                 uniform_routing=system.uniform_routing)
    policies = {f: Proteus(p, query_type=f, batching=system.batching, device=kinds[0]) for f, p in profiles.items()}
    result = Simulator(policies, world, planners=[planner], admission=setup.admission).run(arrival_us, deadline_us,
                                                                                          names)
    index = {f: i for i, f in enumerate(families)}
    return Run(system.name, result, np.array([index[n] for n in names], dtype=np.int64), families, planner.plans)


def _config(system: System, config: ProteusConfig) -> ProteusConfig:
    """The setup's planner settings with the system's own headroom and period, where it has them; a static system's
    one plan for the mix (:func:`for_the_mix`)."""
    own = {"headroom": system.headroom, "headroom_floor": system.headroom_floor, "period_s": system.period_s}
    config = replace(config, **{k: v for k, v in own.items() if v is not None})
    return for_the_mix(config) if system.static else config


def _most_accurate(setup: Setup, profiles: Mapping[str, Profile]) -> dict[str, frozenset[str]]:
    """Each type's most accurate SLO-feasible variant, the only one it may use (Clipper-HA, w/o MS)."""
    return {f: frozenset({most_accurate_feasible(p, setup.slo_of(f), sorted(setup.cluster), setup.config.capacity)})
            for f, p in profiles.items()}


def capacity_qps(setup: Setup, mix: Mapping[str, float], variants: str = "all") -> float:
    """The most the cluster serves of ``mix`` (type -> share) within the SLOs: the MILP's plan for far more than it
    can, on every variant ("all") or on each type's most accurate SLO-feasible one only ("ha")."""
    kinds = [k for k, n in setup.cluster.items() for _ in range(n)]
    profiles = {f: setup.profiles[f] for f in mix}
    allowed = _most_accurate(setup, profiles) if variants == "ha" else None
    planner = ProteusPlanner(profiles, list(enumerate(kinds)), {f: setup.slo_of(f) for f in profiles},
                             for_the_mix(setup.config),
                             initial_demand={f: STATIC_DEMAND_QPS * share for f, share in mix.items()},
                             allowed=allowed, static=True)
    return float(sum(planner.plan(0, None).detail.solution.served.values()))


def metrics(result: SimResult, window_s: int = METRIC_WINDOW_S) -> dict[str, float]:
    """§6.1.4 as the artifact computes it: violations = (arrived - met) / arrived (drops, late answers and
    refusals all count); accuracy over met queries; the maximum drop is 100 minus the lowest effective
    accuracy of any ``window_s`` window (by answer time); throughput is met queries per second."""
    met = result.outcome == OUTCOME_CODES[Outcome.MET]
    n = len(met)
    end_s = max(1, int(np.ceil(result.arrival_us.max(initial=0) / 1e6)))
    windows = max(1, int(np.ceil(end_s / window_s)))
    by_window = np.minimum(result.finish_us[met] // (window_s * 1_000_000), windows - 1)
    acc_sum = np.bincount(by_window, result.accuracy[met], windows)
    acc_n = np.bincount(by_window, None, windows)
    window_acc = acc_sum[acc_n > 0] / acc_n[acc_n > 0]
    return {
        "queries": n,
        "violation_ratio": float(1 - met.mean()) if n else 0.0,
        "dropped": int(np.count_nonzero(result.outcome == OUTCOME_CODES[Outcome.DROPPED])),
        "late": int(np.count_nonzero(result.outcome == OUTCOME_CODES[Outcome.LATE])),
        "rejected": int(np.count_nonzero(result.outcome == OUTCOME_CODES[Outcome.REJECTED])),
        "accuracy": float(100 * result.accuracy[met].mean()) if met.any() else 0.0,
        "max_accuracy_drop": float(100 - 100 * window_acc.min()) if len(window_acc) else 0.0,
        "throughput_qps": float(met.sum() / end_s),
    }
