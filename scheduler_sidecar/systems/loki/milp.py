"""Loki's resource manager (§4.1): the hardware-scaling MILP (Eqs. 8-11), then, when the cluster cannot serve
the demand with the top variants, the accuracy-scaling MILP (Eq. 12), over the augmented graph.

NOTE on the linear form (the paper's constraints 2, 5 and 7 multiply variables; digest §2.9). For every
variant v and batch size b: a binary z[v,b] (v runs batches of b; at most one b per variant, since all its
replicas share y(v)) and an integer n[v,b] <= S z[v,b] of replicas; x(v) = sum_b n[v,b] and l(v) =
sum_b (b / q(v,b)) z[v,b] are then linear, and so is capacity sum_b q(v,b) n[v,b]. A root-to-leaf path p
carries a share c[p] <= I[p]; its latency must fit L/2 - |p| hop_ms when I[p] = 1 (big-M with M the path's
slowest batches). This is exact: unlike the artifact's epsilon form, no flow uses a path that misses the SLO.

NOTE on trees (digest A6; the paper's MILP has no per-child branch ratio and its artifact plans only the car
branch). Decision: flow conservation over the augmented tree. Every augmented prefix pi ending at an inner
task carries a share g[pi]; for each child task j, the shares of pi's extensions to j's variants sum to
g[pi]; the root's shares sum to the served fraction (1 unless overloaded). A vertex's load is D times the
sum over the prefixes ending at it of m(prefix) x share, counted once however many leaves lie below it. The
objective is the mean over leaf tasks of sum_p c[p] Â(p), the paper's "average of the end-to-end accuracy of
all the source-to-sink paths" (§2.1). On a serial pipeline this is exactly the paper's model.

Decisions on the paper's other gaps:
- SLO: a path's latency <= L/2 - |p| x hop_ms (digest A1: the halving as §4.1, then the per-hop communication
  latency of §4.2; hop_ms defaults to 0 as the artifact).
- Every task keeps at least one replica (digest A22), so a query of any path has somewhere to go.
- Accuracy scaling infeasible too (digest A4, the paper is silent): serve the largest fraction d of the demand
  (the artifact's InferLine does this), then the best accuracy at that fraction; early dropping sheds the rest.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_sidecar.core.arith import ordered_sum
from scheduler_sidecar.systems import milp_solver
from scheduler_sidecar.systems.loki.pipeline import Path, Pipeline, StageVariant

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)  # the artifact's B (digest A8); the paper lists none
TIME_LIMIT_S = 10.0  # the paper sets none (Gurobi, ~500 ms average, §6.5); the artifact sets none either
HEADROOM = 1.0  # capacity planned per query of demand: the paper's 1 (the controller plans with LokiConfig's)
ARTIFACT_HEADROOM = 1.05  # the artifact's beta in its rerouting runs (1 in the others), on the fan-out only
_TOL = 1e-6


@dataclass(frozen=True, slots=True)
class Allocation:
    """x(i,k) replicas of a variant, all running batches of y(i,k)."""

    task: str
    variant: str
    replicas: int
    batch: int
    batch_ms: float  # l(i,k): one batch of ``batch``
    capacity_qps: float  # per replica: q(i,k,y)
    accuracy: float


@dataclass(frozen=True)
class Solution:
    step: str  # "hardware", "accuracy", "overload" (only a fraction served) or "infeasible"
    allocations: tuple[Allocation, ...]
    shares: Mapping[Path, float]  # root-to-leaf path -> c(p), fractions of the demand
    served: float  # the fraction of the demand the plan serves (1 unless overloaded)
    accuracy: float  # expected system accuracy of served queries, the objective divided by the served fraction
    solve_s: float  # wall time of every solve this took

    @property
    def workers(self) -> int:
        return sum(a.replicas for a in self.allocations)

    def task_accuracy(self, pipeline: Pipeline, task: str) -> float:
        """The mean single-model accuracy the plan gives ``task``'s queries (what Fig. 1 plots per task)."""
        load = {a.variant: 0.0 for a in self.allocations if a.task == task}
        for path, share in self.shares.items():
            for v in path:
                if v in load:
                    load[v] += share * pipeline.multiplier(path[:path.index(v) + 1])
        total = sum(load.values())
        return sum(pipeline.variant(v).accuracy * w for v, w in load.items()) / total if total > 0 else 0.0


def plan(pipeline: Pipeline, demand_qps: float, workers: int, *, batch_sizes: Sequence[int] = BATCH_SIZES,
         hop_ms: float = 0.0, top_only: bool = False, headroom: float = HEADROOM,
         time_limit_s: float = TIME_LIMIT_S) -> Solution:
    """Hardware scaling, else accuracy scaling, else the largest servable fraction (see the module notes).

    ``top_only`` is InferLine (§6.1): hardware scaling alone, then the largest fraction with the top variants.
    """
    started = time.perf_counter()
    model = _Model(pipeline, demand_qps * headroom, workers, batch_sizes, hop_ms)
    # decision: a task's top variant, for hardware scaling and InferLine, is its most accurate one that can meet the
    # SLO at all (batch 1 within it): the social-media pipeline's large CLIP variants take 287 and 695 ms at batch 1
    # against its 250 ms SLO, and no plan of them serves a query
    top = {t.name: (next((v for v in t.variants if v.latency.p50_at(1) <= pipeline.slo_ms), t.top),)
           for t in pipeline.tasks}
    for step, allowed, objective in (("hardware", top, "workers"),
                                     *(() if top_only else (("accuracy", None, "accuracy"),))):
        solution = model.solve(step, allowed, objective, served=1.0, time_limit_s=time_limit_s)
        if solution is not None:
            return _timed(solution, started)
    allowed = top if top_only else None
    fraction = model.solve("overload", allowed, "served", served=None, time_limit_s=time_limit_s)
    if fraction is None or fraction.served <= _TOL:
        return Solution("infeasible", (), {}, 0.0, 0.0, time.perf_counter() - started)
    best = model.solve("overload", allowed, "accuracy", served=fraction.served * (1 - 1e-7),
                       time_limit_s=time_limit_s)
    return _timed(best or fraction, started)


def _timed(solution: Solution, started: float) -> Solution:
    return Solution(solution.step, solution.allocations, solution.shares, solution.served, solution.accuracy,
                    time.perf_counter() - started)


class _Model:
    """The augmented graph of one pipeline, demand and cluster, turned into PuLP models on request."""

    def __init__(self, pipeline: Pipeline, demand_qps: float, workers: int, batch_sizes: Sequence[int],
                 hop_ms: float) -> None:
        if demand_qps < 0 or workers < len(pipeline.tasks):
            raise ValueError(f"need demand >= 0 and at least one worker per task ({len(pipeline.tasks)}), got "
                             f"{demand_qps} q/s and {workers} workers")
        self.p, self.demand, self.workers, self.hop_ms = pipeline, float(demand_qps), workers, hop_ms
        self.batches = {v.id: tuple(b for b in batch_sizes if b in v.latency.batch_sizes)
                        for t in pipeline.tasks for v in t.variants}
        # every augmented prefix, by the task it ends at
        self.prefixes = {t.name: pipeline.paths(t.name) for t in pipeline.tasks}
        self.leaf_paths = [p for t in pipeline.leaves for p in self.prefixes[t.name]]

    def solve(self, step: str, allowed: Mapping[str, tuple[StageVariant, ...]] | None, objective: str,
              served: float | None, time_limit_s: float) -> Solution | None:
        import pulp  # type: ignore[import-untyped, unused-ignore]

        p = self.p
        prob = pulp.LpProblem("loki", pulp.LpMaximize if objective != "workers" else pulp.LpMinimize)
        ok = {v.id for t in p.tasks for v in (allowed[t.name] if allowed else t.variants)}
        var = milp_solver.variable
        z, n = {}, {}
        for vid in sorted(ok):
            for b in self.batches[vid]:
                z[vid, b] = var(prob, f"z_{len(z)}", 0, 1, "Integer")
                n[vid, b] = var(prob, f"n_{len(n)}", 0, self.workers, "Integer")
                prob += n[vid, b] <= self.workers * z[vid, b]
            if self.batches[vid]:
                prob += pulp.lpSum(z[vid, b] for b in self.batches[vid]) <= 1
        share = {}  # every usable augmented prefix -> its share of the demand
        for prefixes in self.prefixes.values():
            for pre in prefixes:
                if all(v in ok and self.batches[v] for v in pre):
                    share[pre] = var(prob, f"c_{len(share)}", 0, 1)
        d = served if served is not None else var(prob, "served", 0, 1)
        root = p.root.name
        prob += pulp.lpSum(share[pre] for pre in self.prefixes[root] if pre in share) == d
        for t in p.tasks:
            for child in t.children:
                for pre in self.prefixes[t.name]:
                    if pre in share:
                        prob += pulp.lpSum(share[e] for e in self._extensions(pre, child) if e in share) == share[pre]
        # load (Eq. 2) and cluster size (Eq. 3)
        for vid in sorted(ok):
            arriving = [self.demand * p.multiplier(pre) * share[pre] for pre in self.prefixes[p.task_of(vid).name]
                        if pre[-1] == vid and pre in share]
            capacity = pulp.lpSum(p.variant(vid).throughput_qps(b) * n[vid, b] for b in self.batches[vid])
            prob += pulp.lpSum(arriving) <= capacity
        prob += pulp.lpSum(n.values()) <= self.workers
        for t in p.tasks:  # digest A22: every task keeps a replica
            prob += pulp.lpSum(n[vid, b] for vid, b in n if p.task_of(vid).name == t.name) >= 1
        # path latency (Eqs. 5-7) for every leaf path that may carry flow
        usable = [pre for pre in self.leaf_paths if pre in share]
        for i, path in enumerate(usable):
            on = var(prob, f"I_{i}", 0, 1, "Integer")
            prob += share[path] <= on
            slowest = sum(max(p.variant(v).batch_ms(b) for b in self.batches[v]) for v in path)
            budget = p.slo_ms / 2 - len(path) * self.hop_ms
            prob += pulp.lpSum(p.variant(v).batch_ms(b) * z[v, b] for v in path for b in self.batches[v]) \
                <= budget + slowest * (1 - on)
        accuracy = pulp.lpSum(p.accuracy(path) * share[path] for path in usable) / len(p.leaves)
        prob += {"workers": pulp.lpSum(n.values()), "accuracy": accuracy, "served": d}[objective]
        solver, _ = milp_solver.pick_solver(time_limit_s)
        milp_solver.solve(prob, solver)
        if pulp.LpStatus[prob.status] != "Optimal" or prob.objective is None:
            return None
        fraction = float(pulp.value(d)) if served is None else served
        allocations = []
        for vid, b in n:
            count = round(n[vid, b].value() or 0)
            if count:
                v = p.variant(vid)
                allocations.append(Allocation(p.task_of(vid).name, vid, count, b, v.batch_ms(b),
                                              v.throughput_qps(b), v.accuracy))
        shares = {path: max(0.0, share[path].value() or 0.0) for path in usable}
        shares = {path: s for path, s in shares.items() if s > _TOL}
        value = ordered_sum(p.accuracy(path) * s for path, s in shares.items()) / len(p.leaves)
        return Solution(step, tuple(sorted(allocations, key=lambda a: (a.task, -a.accuracy))), shares, fraction,
                        value / fraction if fraction > 0 else 0.0, 0.0)

    def _extensions(self, prefix: Path, child: str) -> list[Path]:
        return [prefix + (v.id,) for v in self.p.task(child).variants]


def enumerate_plans(pipeline: Pipeline, demand_qps: float, workers: int, *,
                    batch_sizes: Sequence[int] = BATCH_SIZES, hop_ms: float = 0.0) -> tuple[float, int | None]:
    """Exhaustive reference for small serial pipelines: (the best accuracy over every allocation and batch choice,
    each with an LP over the path shares; the fewest workers that serve the demand with the top variants, or
    None). Used by the tests to check the MILP."""
    from scipy.optimize import linprog  # lazy: scipy

    if len(pipeline.tasks) != len(pipeline.leaves) + 1 and len(pipeline.tasks) > 1:
        raise ValueError("enumeration covers serial pipelines")
    variants = [v for t in pipeline.tasks for v in t.variants]
    batches = [[b for b in batch_sizes if b in v.latency.batch_sizes] for v in variants]
    paths = [p for t in pipeline.leaves for p in pipeline.paths(t.name)]
    index = {v.id: i for i, v in enumerate(variants)}
    budget = {path: pipeline.slo_ms / 2 - len(path) * hop_ms for path in paths}
    best, fewest = -1.0, None
    for counts in _compositions(workers, len(variants)):
        if any(sum(counts[index[v.id]] for v in t.variants) == 0 for t in pipeline.tasks):
            continue
        used = [i for i, c in enumerate(counts) if c]
        for choice in itertools.product(*(batches[i] for i in used)):
            y = dict(zip(used, choice))
            cap = {i: counts[i] * variants[i].throughput_qps(y[i]) for i in used}
            ok = [path for path in paths if all(index[v] in y for v in path)
                  and sum(variants[index[v]].batch_ms(y[index[v]]) for v in path) <= budget[path] + 1e-9]
            if not ok:
                continue
            if all(counts[index[t.top.id]] == sum(counts[index[v.id]] for v in t.variants) for t in pipeline.tasks):
                top_path = tuple(t.top.id for t in pipeline.chain(pipeline.leaves[0].name))
                if top_path in ok and all(demand_qps * pipeline.multiplier(top_path[:k + 1]) <= cap[index[v]] + 1e-9
                                          for k, v in enumerate(top_path)):
                    fewest = sum(counts) if fewest is None else min(fewest, sum(counts))
            if sum(counts) < workers:
                continue  # one more replica of a used variant serves at least as well: only full clusters
            if max(pipeline.accuracy(path) for path in ok) <= best:
                continue  # the LP's value is a mix of these paths' accuracies: it cannot beat the best so far
            # LP: max sum Â c  s.t.  sum c = 1, per-variant load <= capacity
            rows, rhs = [], []
            for i in used:
                rows.append([demand_qps * pipeline.multiplier(path[:path.index(variants[i].id) + 1])
                             if variants[i].id in path else 0.0 for path in ok])
                rhs.append(cap[i])
            res = linprog([-pipeline.accuracy(path) for path in ok], A_ub=rows, b_ub=rhs,
                          A_eq=[[1.0] * len(ok)], b_eq=[1.0], bounds=(0, 1), method="highs")
            if res.status == 0:
                best = max(best, -res.fun)
    return best, fewest


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to give at most ``total`` workers to ``parts`` variants."""
    return [c for c in itertools.product(range(total + 1), repeat=parts) if sum(c) <= total]
