"""INFaaS-Accuracy (§6.1.1): INFaaS' greedy autoscaler with its objective and constraint swapped.

INFaaS minimises cost subject to accuracy; the paper's variant minimises the accuracy drop
subject to the fixed cluster. Every ``period_s`` (1 s: INFaaS decides as load arrives, which the
paper credits for its fast reaction to bursts, §6.3) each query type compares its last second's
arrivals with its workers' peak capacity (the same P as Proteus, §4):

- above ``1 - slack`` (0.95) of capacity it scales up, one worker at a time, by the cheapest way
  to cover what is missing: host the type on a spare worker, or switch one of its workers to a
  faster variant; the cost of a way is the accuracy drop (from the family's best) of the variant
  it runs times the workers it needs to cover the gap (the artifact's "cost x instances needed");
- below ``downscale_slack`` (0.6) of capacity it scales down: it switches a worker to the most
  accurate variant that keeps it above that line, or gives the worker up (spare).

A spare worker is one no type needs: idle ones first, then one of a type that stays above its
``1 - slack`` line without it. Routes split each type's queries by its workers' capacities.
Batching is INFaaS' own, work-conserving up to B_max (``nexus`` here).

# Ambiguity: INFaaS' exact heuristics (its "cheapest" among batching, replication and variant
# or hardware switches) are described in the INFaaS paper, not Proteus'; this follows the
# authors' artifact's reading (digest A.7) with Proteus' capacity model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler_sidecar.core.arith import ordered_sum
from scheduler_sidecar.core.plan import Demand, Plan
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.records import Query
from scheduler_sidecar.systems.proteus import milp
from scheduler_sidecar.systems.proteus.planner import DEFAULT_CONFIG, Hosting, ProteusConfig, ProteusPlanner
from scheduler_sidecar.systems.proteus.routing import Route, Routing

SLACK = 0.05  # the artifact's infaas_slack: scale up above 95% of capacity
DOWNSCALE_SLACK = 0.6  # the artifact's infaas_downscale_slack: scale down below 60%
PERIOD_S = 1.0


class InfaasPlanner(ProteusPlanner):
    """See the module note; ``initial_demand`` and the first plan are Proteus' MILP, as the paper's baselines
    all start from it."""

    def __init__(self, types: Mapping[str, Profile], workers: Sequence[tuple[int, str]], slo_ms: Mapping[str, float],
                 config: ProteusConfig = DEFAULT_CONFIG, *, initial_demand: Mapping[str, float] | None = None,
                 period_s: float = PERIOD_S, slack: float = SLACK, downscale_slack: float = DOWNSCALE_SLACK) -> None:
        super().__init__(types, workers, slo_ms, config, initial_demand=initial_demand)
        self.period_us = round(period_s * 1e6)
        self.slack, self.downscale_slack = slack, downscale_slack
        self._option = {(o.kind, o.variant): o for o in self.options}
        self._best = {q: max(v.accuracy for v in p.variants) for q, p in self.types.items()}

    def observe_arrival(self, now_us: int, query: Query) -> bool:
        self.count(now_us, query)
        return False

    def plan(self, now_us: int, demand: Demand) -> Plan:
        if not self.plans:
            return super().plan(now_us, demand)
        with self._lock:
            self._counts.advance(now_us, list(self.types))
            last = {q: float(h[-1]) if (h := self._counts.history.get(q)) else 0.0 for q in self.types}
        placement: dict[int, frozenset[str]] = {}
        for q in sorted(self.types, key=lambda t: -last[t]):  # busiest first
            while last[q] > (1 - self.slack) * self._capacity(q):
                if not self._scale_up(q, last, placement):
                    break
        for q in self.types:
            if last[q] < self.downscale_slack * self._capacity(q):
                self._scale_down(q, last[q], placement)
        self.plans += 1
        return Plan(now_us, placement, Routing(self._capacity_routes(), last, None))

    # ------------------------------------------------------------------ the greedy steps
    def _p(self, w: Hosting) -> float:
        """Peak rate of what ``w`` hosts."""
        o = self._option.get((w.kind, w.variant)) if w.variant is not None else None
        return o.capacity_qps if o is not None else 0.0

    def _capacity(self, q: str) -> float:
        return ordered_sum(self._p(w) for w in self.workers if w.type == q)

    def _variants(self, q: str, kind: str) -> list[milp.Option]:
        return [o for o in self.options if o.type == q and o.kind == kind and o.capacity_qps > 0]

    def _spare(self, last: Mapping[str, float], q: str) -> list[Hosting]:
        idle = [w for w in self.workers if w.type is None or last.get(w.type, 0.0) == 0.0]
        donors = [w for w in self.workers if w.type not in (None, q) and last.get(w.type, 0.0) > 0 and
                  last[w.type] <= (1 - self.slack) * (self._capacity(w.type) - self._p(w))]
        return idle + donors

    def _scale_up(self, q: str, last: Mapping[str, float], placement: dict[int, frozenset[str]]) -> bool:
        gap = last[q] / (1 - self.slack) - self._capacity(q)
        ways = []  # (cost, tie-break, worker, variant)
        for w in self._spare(last, q)[:1] + [w for w in self.workers if w.type == q]:
            for o in self._variants(q, w.kind):
                gain = o.capacity_qps - (self._p(w) if w.type == q else 0.0)
                if gain <= 0:
                    continue
                needed = max(1.0, gap / gain)
                ways.append(((self._best[q] - o.accuracy) * needed, -gain, w.id, w, o.variant))
        if not ways:
            return False
        *_, w, variant = min(ways)
        self._host(w, variant, placement)
        return True

    def _scale_down(self, q: str, load: float, placement: dict[int, frozenset[str]]) -> None:
        for w in sorted((w for w in self.workers if w.type == q), key=lambda w: self._p(w)):
            rest = self._capacity(q) - self._p(w)
            if load <= self.downscale_slack * rest or (load == 0 and rest > 0):
                w.type = None  # given up: it keeps its model until another type takes it
                continue
            better = [o for o in self._variants(q, w.kind) if self._best[q] >= o.accuracy >
                      self._option[w.kind, w.variant].accuracy and load < (1 - self.slack) * (rest + o.capacity_qps)]
            if better:
                self._host(w, max(better, key=lambda o: o.accuracy).variant, placement)

    def _capacity_routes(self) -> dict[str, tuple[Route, ...]]:
        out = {}
        for q in self.types:
            mine = [w for w in self.workers if w.type == q and self._p(w) > 0]
            total = ordered_sum(self._p(w) for w in mine)
            out[q] = tuple(Route(w.id, w.variant, self._p(w) / total, self._option[w.kind, w.variant].max_batch)
                           for w in mine)
        return out
