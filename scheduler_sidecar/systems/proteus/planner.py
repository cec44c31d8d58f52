"""Proteus' controller (§3, §4): demand per query type, the MILP every period and on a burst, placements and routes.

NOTE on the loop. Demand is an exponentially weighted mean over the last ``ewma_window_s``
one-second arrival counts of each type (the artifact's pandas ``ewm(com=1.6)``; the paper leaves
the estimator open). A plan is made every ``period_s`` (30 s, §6.1.5; the artifact's 10 s is a
parameter) and, since the paper names no burst detector, whenever a type's arrivals exceeded
``burst_factor`` (1.2) x its planned rate in each of the last ``burst_s`` (2) seconds, at most
once per ``cooldown_s`` (2 s). Decision (``burst_window``): "sliding", the default, counts those
seconds back from each arrival and asks at the arrival that tips them, so a few ms of jitter in
the arrivals move a plan by a few ms; "whole-seconds", the rule before it, counts whole seconds
and asks only as one closes, where the same jitter can move a plan by a whole second (live
against simulated, bench fidelity proteus). The MILP's (pool, variant) counts become workers: a worker
already hosting a variant the plan keeps stays as it is, so a plan moves as few workers as it
can; a worker the plan leaves idle keeps its variant (and gets no traffic). Each replica of
(pool, variant) gets an equal share of that pair's planned rate; a type's router splits its
queries by those shares (the query assignment y[d,q]).

NOTE on the baselines (§6.1.1, §6.5), which are this planner restricted:
- ``allowed``: the variants each type may use (Clipper-HA: the most accurate one feasible on
  some device kind within SLO/2; Clipper-HT: the least accurate; "w/o MS": the most accurate,
  re-placed as demand moves).
- ``fixed_types`` (Sommelier, "w/o MP"): after the first plan every worker stays with its query
  type; only the variant on it may change.
- ``static`` (Clipper): the first plan is the only one.
- ``uniform_routing`` ("w/o QA"): a type's queries are spread evenly over its replicas, whatever
  their capacity.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_sidecar.core.arith import ordered_sum
from scheduler_sidecar.core.plan import Demand, Plan, Planner
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.records import Query, WorkerState
from scheduler_sidecar.systems.demand import SecondCounts, ewma
from scheduler_sidecar.systems.proteus import milp
from scheduler_sidecar.systems.proteus.capacity import PAPER, CapacityRule
from scheduler_sidecar.systems.proteus.routing import Route, Routing

log = logging.getLogger(__name__)

NEVER_US = 1 << 62
BURST_WINDOWS = ("sliding", "whole-seconds")


@dataclass(frozen=True)
class ProteusConfig:
    period_s: float = 30.0  # §6.1.5 ("30 seconds as it works well"); the artifact re-solves every 10 s
    ewma_com: float = 1.6  # the artifact's centre of mass over one-second counts
    ewma_window_s: int = 20  # the artifact's window of counts
    burst_factor: float = 1.2  # decision: a type above this x its planned rate ...
    burst_s: int = 2  # ... in each of this many seconds asks for a plan
    cooldown_s: float = 2.0  # ... unless a plan was made this recently
    burst_window: str = "sliding"  # decision: seconds counted back from each arrival, or "whole-seconds" of the clock
    # decision: a type is planned for at least this rate, so one that went quiet keeps a replica and its next
    # query is served (the paper's plans only ever see positive demand)
    min_demand_qps: float = 1.0
    capacity: CapacityRule = PAPER
    headroom: float = milp.HEADROOM
    headroom_floor: float | None = None  # under overload the headroom falls to this before demand does (milp's note)
    overload_step: float = milp.OVERLOAD_STEP
    overload_floor: float = milp.OVERLOAD_FLOOR
    overload: str = milp.DEFAULT_OVERLOAD  # milp.OVERLOAD_RULES: how an overload lowers the demand (its module note)
    time_limit_s: float = milp.TIME_LIMIT_S


    def __post_init__(self) -> None:
        positive = ("period_s", "burst_factor", "headroom", "time_limit_s")
        for key in positive:
            if not getattr(self, key) > 0:
                raise ValueError(f"proteus: {key} must be > 0, got {getattr(self, key)!r}")
        for key in ("ewma_com", "cooldown_s", "min_demand_qps"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"proteus: {key} must be >= 0, got {getattr(self, key)!r}")
        for key in ("ewma_window_s", "burst_s"):
            if not (isinstance(getattr(self, key), int) and getattr(self, key) >= 1):
                raise ValueError(f"proteus: {key} must be a whole number >= 1, got {getattr(self, key)!r}")
        if self.headroom_floor is not None and not 0 < self.headroom_floor <= self.headroom:
            raise ValueError(f"proteus: headroom_floor must be in (0, headroom], got {self.headroom_floor!r}")
        if self.overload not in milp.OVERLOAD_RULES:
            raise ValueError(f"proteus: overload must be one of {milp.OVERLOAD_RULES}, got {self.overload!r}")
        if self.burst_window not in BURST_WINDOWS:
            raise ValueError(f"proteus: burst_window must be one of {BURST_WINDOWS}, got {self.burst_window!r}")
        if not 0 < self.overload_step < 1 or not 0 <= self.overload_floor <= 1:
            raise ValueError(f"proteus: overload_step must be in (0, 1) and overload_floor in [0, 1], got "
                             f"{self.overload_step!r} and {self.overload_floor!r}")


DEFAULT_CONFIG = ProteusConfig()


@dataclass
class Hosting:
    """A worker and what it hosts (the planner's view)."""

    id: int
    kind: str
    variant: str | None = None
    type: str | None = None
    healthy: bool = True


class ProteusPlanner(Planner):
    """See the module notes. ``types`` maps query type -> profile; ``workers`` are (id, device kind)."""

    def __init__(self, types: Mapping[str, Profile], workers: Sequence[tuple[int, str]], slo_ms: Mapping[str, float],
                 config: ProteusConfig = DEFAULT_CONFIG, *, initial_demand: Mapping[str, float] | None = None,
                 allowed: Mapping[str, frozenset[str]] | None = None, fixed_types: bool = False,
                 static: bool = False, uniform_routing: bool = False) -> None:
        self.types = dict(types)
        ids = [v.id for p in self.types.values() for v in p.variants]
        if len(set(ids)) != len(ids):
            raise ValueError("proteus: query types must not share variant ids (each variant serves one type); "
                             f"shared: {sorted({i for i in ids if ids.count(i) > 1})}")
        self.config = config
        self.slo_ms = {q: float(slo_ms[q]) for q in self.types}
        self.workers = [Hosting(wid, kind) for wid, kind in workers]
        if not self.workers:
            raise ValueError("proteus: no workers to plan for")
        self.kinds = sorted({w.kind for w in self.workers})
        self.initial_demand = dict(initial_demand or {})
        self.fixed_types, self.static, self.uniform_routing = fixed_types, static, uniform_routing
        self.period_us = NEVER_US if static else round(config.period_s * 1e6)
        self.options = self._options(allowed)
        self.model = {v.id: v.actuation.model for p in self.types.values() for v in p.variants}
        self._accuracy = {v.id: v.accuracy for p in self.types.values() for v in p.variants}
        self._type = {v.id: q for q, p in self.types.items() for v in p.variants}  # variant -> its query type
        self._unservable: set[str] = set()
        self._counts = SecondCounts(config.ewma_window_s)
        # the sliding burst rule: each type's arrival times within the last burst_s seconds, and the first arrival
        self._recent: dict[str, deque[int]] = {q: deque() for q in self.types}
        self._first_us: int | None = None
        # live, plan() runs in a thread while arrivals are counted on the event loop
        self._lock = threading.Lock()
        self._planned: dict[str, float] = {}
        self._last_plan_us: int | None = None
        self.plans = 0

    def _options(self, allowed: Mapping[str, frozenset[str]] | None) -> tuple[milp.Option, ...]:
        out = []
        for q, profile in self.types.items():
            for v in profile.variants:
                if allowed is not None and v.id not in allowed.get(q, frozenset()):
                    continue
                for kind in self.kinds:
                    curve = v.latency[kind]
                    out.append(milp.Option(q, v.id, kind, v.accuracy, self.config.capacity.capacity_qps(
                        curve, self.slo_ms[q]), self.config.capacity.max_batch(curve, self.slo_ms[q])))
        return tuple(out)

    # ------------------------------------------------------------------ demand
    def count(self, now_us: int, query: Query) -> bool:
        """Count an arrival; True if a whole second closed before it."""
        with self._lock:
            closed = self._counts.advance(now_us, list(self.types))
            self._counts.current[query.type] += 1
            return closed

    def observe_arrival(self, now_us: int, query: Query) -> bool:
        closed = self.count(now_us, query)
        with self._lock:
            if self.static or self._last_plan_us is None:
                return False
            if self.config.burst_window == "sliding":
                self._first_us = now_us if self._first_us is None else self._first_us
                times = self._recent[query.type]
                times.append(now_us)
                while times[0] <= now_us - self.config.burst_s * 1_000_000:  # kept for the rule's seconds only
                    times.popleft()
            if self.config.burst_window == "whole-seconds":
                if not closed or now_us - self._last_plan_us < self.config.cooldown_s * 1e6:
                    return False
                return any(self._bursting(q) for q in self.types)
            if now_us - self._last_plan_us < self.config.cooldown_s * 1e6:
                return False
            if now_us - self._first_us < self.config.burst_s * 1_000_000:  # not yet burst_s seconds counted
                return False
            return any(self._bursting_since(q, now_us) for q in self.types)

    def _bursting(self, q: str) -> bool:
        """The whole-seconds rule: each of the last ``burst_s`` closed seconds (from the planner's start) counted over the limit."""
        recent = list(self._counts.history.get(q, ()))[-self.config.burst_s:]
        limit = self.config.burst_factor * self._planned.get(q, 0.0)
        return len(recent) == self.config.burst_s and all(c > limit for c in recent)

    def _bursting_since(self, q: str, now_us: int) -> bool:
        """The sliding rule: each of the ``burst_s`` seconds before ``now_us``, (now - k - 1 s, now - k s], counted
        over the limit."""
        times = self._recent[q]
        horizon = now_us - self.config.burst_s * 1_000_000
        while times and times[0] <= horizon:
            times.popleft()
        limit = self.config.burst_factor * self._planned.get(q, 0.0)
        if len(times) <= limit * self.config.burst_s:  # too few in all for every second to be over it
            return False
        for k in range(self.config.burst_s):
            high = bisect_right(times, now_us - k * 1_000_000)
            if high - bisect_right(times, now_us - (k + 1) * 1_000_000, 0, high) <= limit:
                return False
        return True

    def demand(self, now_us: int) -> dict[str, float]:
        """The EWMA of each type's one-second counts (``initial_demand`` before the first whole second)."""
        with self._lock:
            self._counts.advance(now_us, list(self.types))
            history = {q: list(self._counts.history.get(q, ())) for q in self.types}
        return {q: ewma(history[q], self.config.ewma_com) if history[q] else float(self.initial_demand.get(q, 0.0))
                for q in self.types}

    # ------------------------------------------------------------------ plans
    def plan(self, now_us: int, demand: Demand) -> Plan:
        if self.static and self.plans:
            raise RuntimeError("a static allocation is planned once")
        self._sync(demand.workers if demand is not None else ())
        measured = self.demand(now_us)
        pools, pool_of = self.pools()
        floor = self.config.min_demand_qps
        # a type no worker here can serve within its SLO would make every plan infeasible: it is left out
        servable = {o.type for o in self.options if o.capacity_qps > 0 and o.kind in {p.kind for p in pools}}
        for q in sorted(set(self.types) - servable - self._unservable):
            log.warning("proteus: no variant of %s fits SLO/2 on the healthy workers' kinds; it is not planned", q)
        self._unservable = set(self.types) - servable
        problem = milp.Problem(pools, self.options, {q: max(s, floor) for q, s in measured.items() if q in servable},
                               self.config.headroom)
        solution = milp.plan(problem, step=self.config.overload_step, floor=self.config.overload_floor,
                             time_limit_s=self.config.time_limit_s, overload=self.config.overload,
                             headroom_floor=self.config.headroom_floor)
        placement = self._place(pools, pool_of, solution)
        with self._lock:
            self._planned, self._last_plan_us = measured, now_us
        self.plans += 1
        return Plan(now_us, placement, Routing(self._routes(problem.pools, solution), measured, solution))

    def _sync(self, states: Sequence[WorkerState]) -> None:
        """Take the workers as the engine sees them: health, what is really loaded, workers added since."""
        mine = {w.id: w for w in self.workers}
        for state in states:
            w = mine.get(state.id)
            if w is None:
                if state.device not in self.kinds:
                    log.warning("proteus: worker %d is of kind %r, which the plan has no latency for; not planned",
                                state.id, state.device)
                    continue
                w = Hosting(state.id, state.device)
                self.workers.append(w)
            w.healthy = state.healthy
            if state.resident is None:
                continue
            held = [v for v, m in self.model.items() if m in state.resident or m == state.staging_model]
            if w.variant not in held:  # a load failed, or a model left: what it holds, the most accurate first
                w.variant = max(held, key=lambda v: self._accuracy[v], default=None)
                w.type = self._type[w.variant] if w.variant is not None else None

    def pools(self) -> tuple[tuple[milp.Pool, ...], list[int | None]]:
        """The MILP's pools and each worker's pool (None: unhealthy, not planned): one per device kind, or per
        (kind, type) once types are fixed."""
        key = (lambda w: (w.kind, w.type or "")) if self.fixed_types and self.plans else (lambda w: (w.kind, ""))
        healthy = [w for w in self.workers if w.healthy]
        keys = sorted({key(w) for w in healthy})
        counts = Counter(key(w) for w in healthy)
        pools = tuple(milp.Pool(kind, counts[kind, q], frozenset({q}) if q else None) for kind, q in keys)
        return pools, [keys.index(key(w)) if w.healthy else None for w in self.workers]

    def _place(self, pools: Sequence[milp.Pool], pool_of: Sequence[int],
               solution: milp.Solution) -> dict[int, frozenset[str]]:
        """Workers for each (pool, variant) of the solution, moving as few as possible."""
        wanted = Counter(solution.replicas)
        self._replicas: dict[tuple[int, str], list[int]] = {}
        free: dict[int, list[Hosting]] = {}
        for w, p in zip(self.workers, pool_of):  # a worker whose variant the plan keeps stays
            if p is None:
                continue
            if w.variant is not None and wanted[p, w.variant] > 0:
                wanted[p, w.variant] -= 1
                self._replicas.setdefault((p, w.variant), []).append(w.id)
            else:
                free.setdefault(p, []).append(w)
        placement = {}
        for (p, variant), n in sorted(wanted.items()):
            if n <= 0:
                continue
            for w in free[p][:n]:
                self._host(w, variant, placement)
                self._replicas.setdefault((p, variant), []).append(w.id)
            free[p] = free[p][n:]
        if not self.plans:  # the artifact's start: a worker no variant needs hosts its kind's best of some type
            order = sorted(self.types, key=lambda q: -solution.demand.get(q, 0.0))
            idle = [w for ws in free.values() for w in ws if w.variant is None]
            for i, w in enumerate(idle):
                best = self._best_on(w.kind, order[i % len(order):] + order[:i % len(order)])
                if best is not None:
                    self._host(w, best, placement)
        # every worker is named, so that a model it holds beside its variant leaves (at the start, every one);
        # a worker the plan leaves idle keeps its variant (and gets no traffic)
        for w in self.workers:
            if w.healthy and w.variant is not None:
                placement.setdefault(w.id, frozenset({self.model[w.variant]}))
        return placement

    def _host(self, w: Hosting, variant: str, placement: dict[int, frozenset[str]]) -> None:
        w.variant, w.type = variant, self._type[variant]
        placement[w.id] = frozenset({self.model[variant]})

    def _best_on(self, kind: str, types: Sequence[str]) -> str | None:
        """The most accurate variant feasible on ``kind`` of the first of ``types`` that has one."""
        for q in types:
            fits = [o for o in self.options if o.type == q and o.kind == kind and o.capacity_qps > 0]
            if fits:
                return max(fits, key=lambda o: (o.accuracy, o.variant)).variant
        return None

    def _routes(self, pools: Sequence[milp.Pool], solution: milp.Solution) -> dict[str, tuple[Route, ...]]:
        batch = {(o.kind, o.variant): o.max_batch for o in self.options}
        routes: dict[str, list[Route]] = {q: [] for q in self.types}
        for (p, variant), ids in sorted(self._replicas.items()):
            served = solution.served.get((p, variant), 0.0)
            if served <= 0:
                continue
            q = self._type[variant]
            for wid in ids:
                routes[q].append(Route(wid, variant, served / len(ids), batch[pools[p].kind, variant]))
        out = {}
        for q, rs in routes.items():
            total = ordered_sum(r.share for r in rs) if not self.uniform_routing else len(rs)
            out[q] = tuple(Route(r.worker_id, r.variant, (1.0 if self.uniform_routing else r.share) / total,
                                 r.max_batch) for r in rs) if rs else ()
        return out


def most_accurate_feasible(profile: Profile, slo_ms: float, kinds: Sequence[str],
                           rule: CapacityRule = PAPER) -> str:
    """Clipper-HA's variant: the most accurate one that some device kind serves within SLO/2 (§6.1.1)."""
    feasible = [v for v in profile.variants if any(rule.max_batch(v.latency[k], slo_ms) for k in kinds)]
    if not feasible:
        raise ValueError(f"{profile.name}: no variant fits SLO/2 = {slo_ms / 2:g} ms on {list(kinds)}")
    return max(feasible, key=lambda v: (v.accuracy, v.id)).id


def least_accurate(profile: Profile) -> str:
    """Clipper-HT's variant."""
    return min(profile.variants, key=lambda v: (v.accuracy, v.id)).id


__all__ = ["NEVER_US", "ProteusConfig", "ProteusPlanner", "Route", "Routing", "least_accurate",
           "most_accurate_feasible"]
