"""Proteus' resource manager (§4, Eqs. 1-7): variant selection, placement and query assignment as one MILP.

NOTE on the formulation. As printed, Eqs. 3 and 7 multiply the binary placement x[d,m] by the
continuous routing y[d,q], so the paper's program is bilinear (the authors ran Gurobi with its
non-convex option). Each device hosts at most one variant (Eq. 1) and each variant serves one
query type, so the products vanish in an exact linear form: v[d,m] >= 0 is the rate of m's type
that device d serves with m, v[d,m] <= P[d,m] x[d,m] (Eq. 5), the v of a type sum to its demand
(Eq. 6; with Eqs. 2 and 4 this makes served = routed), and the objective is sum A_m v[d,m]
(Eq. 7 read as accuracy-weighted served rate: its z*s product is not dimensionally a rate, and
both readings share the optimum). Identical devices are interchangeable, so devices are
aggregated into pools of one kind: integer n[p,m] workers of pool p host m, with sum_m n[p,m]
<= |p| and v[p,m] <= P[p,m] n[p,m]. A pool of one device is the per-device program itself
(:meth:`Problem.per_device`); the two have the same optimum, and the pooled one solves in a
fraction of the time. Routing weights follow: a type's replicas of (p, m) share v[p,m] evenly.

NOTE on overload (§2.5: "we solve the MILP again by decreasing s_q by a small value"; which q is not said).
Decision: "max-min" (the default): each type's demand is lowered only as far as it must be (progressive filling),
then the accuracy is best for what is served. The literal alternative, "uniform", lowers every type's demand by the
same ``step`` of the measured demand (5%) until the program is feasible, down to ``floor`` (0.2, the artifact's;
feasibility is monotone in that scale, so one extra solve finds the step; below the floor the largest feasible scale
is used). Uniform was the default until the claims of Figs. 4, 7 and 8 were checked (issue 47): under it the type the
cluster serves least caps every type's share, so Sommelier (w/o MP), whose workers keep their types, never leaves its
most accurate variants, where the paper's Sommelier "switch[es] out a high accuracy model variant for a low accuracy
variant when high throughput is needed" and drops 16%. The artifact lowers instead the share of the total demand
served (its beta), which, like max-min, lets the types the cluster can serve be served.

With a ``headroom_floor`` below the headroom (the artifact's beta: 1.05 for Proteus, 1.5 for Sommelier, given up
down to 1), the headroom is given up first, in steps of 0.05 down to the floor, as the artifact lowers its beta
before it serves less than the demand; only then is the demand lowered. Without one (the paper's Proteus, Loki's
comparisons) the headroom is kept and the demand lowered.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import pulp

from scheduler_sidecar.core.arith import ordered_sum
from scheduler_sidecar.systems.milp_solver import pick_solver, variable
from scheduler_sidecar.systems.milp_solver import solve as solve_milp

log = logging.getLogger(__name__)

TIME_LIMIT_S = 10.0  # per solve; the incumbent is kept and its gap logged
GAP_REL = 1e-9  # the search stops this close to the optimum
OVERLOAD_STEP = 0.05  # share of the measured demand taken off per step when it cannot be served
OVERLOAD_FLOOR = 0.2  # the artifact's lowest demand scale
# how an overload lowers the demand (§4: "decreasing s_q by a small value" says not which q): "uniform" lowers every
# type's by one factor, so the type the cluster serves least of sets every type's share; "max-min" (the default)
# lowers each type's only as far as it must (progressive filling: the types that cannot be served more are held at
# their share, the others raised further), then the accuracy is best for what is served. OVERLOAD_STEP and
# OVERLOAD_FLOOR are the uniform rule's
OVERLOAD_RULES = ("uniform", "max-min")
DEFAULT_OVERLOAD = "max-min"  # the module note
MAX_MIN_TOLERANCE = 1e-4  # a type whose share cannot rise above the common one by more than this is held
# the paper plans capacity equal to demand (beta = 1); the artifact asks 5% headroom (beta = 1.05)
HEADROOM = 1.0
ARTIFACT_HEADROOM = 1.05
ARTIFACT_SOMMELIER_HEADROOM = 1.5  # the artifact's Sommelier plans with beta = 1.5
ARTIFACT_HEADROOM_FLOOR = 1.0  # the artifact gives its beta up to 1 before it serves less than the demand
HEADROOM_STEP = 0.05  # headroom given up per step when a demand cannot be served with it (the artifact's beta step)


@dataclass(frozen=True)
class Option:
    """A variant on a device kind: the query type it serves, its accuracy and its peak rate (§4)."""

    type: str
    variant: str
    kind: str
    accuracy: float
    capacity_qps: float
    max_batch: int


@dataclass(frozen=True)
class Pool:
    """``count`` workers of one device kind; ``types`` limits what they may host (None: anything)."""

    kind: str
    count: int
    types: frozenset[str] | None = None

    def hosts(self, option: Option) -> bool:
        return option.kind == self.kind and option.capacity_qps > 0 and (self.types is None or option.type in self.types)


@dataclass(frozen=True)
class Problem:
    pools: tuple[Pool, ...]
    options: tuple[Option, ...]
    demand: Mapping[str, float]  # query type -> queries per second to serve
    headroom: float = HEADROOM  # planned capacity >= headroom x served rate

    def per_device(self) -> Problem:
        """The same problem with one pool per device: the paper's per-device program."""
        return replace(self, pools=tuple(replace(p, count=1) for p in self.pools for _ in range(p.count)))

    def scaled(self, factor: float) -> Problem:
        return replace(self, demand={q: s * factor for q, s in self.demand.items()})


@dataclass(frozen=True)
class Solution:
    replicas: Mapping[tuple[int, str], int]  # (pool index, variant) -> workers hosting it
    served: Mapping[tuple[int, str], float]  # (pool index, variant) -> queries per second served there
    demand: Mapping[str, float]  # what was planned for (the measured demand, lowered under overload)
    scale: float  # planned over measured demand (1 unless overloaded)
    objective: float  # sum of accuracy x served rate
    optimal: bool  # False: the time limit stopped the search; ``gap`` says how far the incumbent may be
    gap: float
    solve_s: float
    headroom: float = HEADROOM  # the planned capacity over the served rate it was planned with

    @property
    def accuracy(self) -> float:
        """Effective accuracy (§6.1.4): the mean accuracy over the planned queries."""
        total = sum(self.demand.values())
        return self.objective / total if total > 0 else math.nan


def _build(problem: Problem, objective: str, accuracy: float = 0.0, held: Mapping[str, float] | None = None
           ) -> tuple[pulp.LpProblem, dict, dict, pulp.LpVariable | None]:
    """The pooled program. ``objective``: "accuracy" serves the demand at the best accuracy (Eq. 7);
    "scale" serves the largest common share of it (at most all); "spread" serves the largest multiple
    of it at a mean accuracy of at least ``accuracy`` per query served (the headroom of a plan). ``held``: types
    served at a given share of their demand whatever the scale."""
    lp = pulp.LpProblem("proteus", pulp.LpMaximize)
    n, v = {}, {}
    for p, pool in enumerate(problem.pools):
        for o in problem.options:
            if pool.hosts(o):
                n[p, o.variant] = variable(lp, f"n_{p}_{len(n)}", 0, pool.count, pulp.LpInteger)
                v[p, o.variant] = variable(lp, f"v_{p}_{len(v)}", 0, None)
    option = {(p, o.variant): o for p, pool in enumerate(problem.pools) for o in problem.options if pool.hosts(o)}
    for p, pool in enumerate(problem.pools):  # Eq. 1: one variant per device
        mine = [n[k] for k in n if k[0] == p]
        if mine:
            lp += pulp.lpSum(mine) <= pool.count
    for k, var in v.items():  # Eq. 5: served within peak capacity
        lp += problem.headroom * var <= option[k].capacity_qps * n[k]
    scale = variable(lp, "scale", 0, None) if objective != "accuracy" else None
    held = held or {}
    for q, s in problem.demand.items():  # Eq. 6: the demand is served (a held type: its share of it)
        served = pulp.lpSum(var for k, var in v.items() if option[k].type == q)
        lp += served == (s * held[q] if q in held else s * scale if scale is not None else s)
    weighted = pulp.lpSum(option[k].accuracy * var for k, var in v.items())
    if objective == "accuracy":
        lp.setObjective(weighted)
    elif objective == "scale":
        lp += scale <= 1
        lp.setObjective(scale)
    else:
        lp += weighted >= accuracy * scale * ordered_sum(problem.demand.values())
        lp.setObjective(scale)
    return lp, n, v, scale


def _run(lp: pulp.LpProblem, time_limit_s: float) -> tuple[bool, bool, float, float]:
    """(feasible, optimal, gap, seconds)."""
    # HiGHS stops at a 1e-4 relative gap by default: that hides accuracy differences of 0.01 points
    solver, name = pick_solver(time_limit_s, gapRel=GAP_REL)
    started = time.perf_counter()
    solve_milp(lp, solver)
    seconds = time.perf_counter() - started
    if pulp.LpStatus[lp.status] != "Optimal" or lp.sol_status not in (pulp.LpSolutionOptimal,
                                                                       pulp.LpSolutionIntegerFeasible):
        return False, False, math.inf, seconds
    optimal = lp.sol_status == pulp.LpSolutionOptimal
    gap = 0.0 if optimal or name != "HiGHS" else float(lp.solverModel.getInfo().mip_gap)
    return True, optimal, gap, seconds


def solve(problem: Problem, *, time_limit_s: float = TIME_LIMIT_S, spread: bool = True) -> Solution | None:
    """The optimum for exactly ``problem.demand``; None if no placement can serve it.

    Decision: many placements share the optimum (whatever capacity the demand leaves unused can sit
    anywhere), and a solver's pick may load a few workers to their peak while others idle. With
    ``spread``, a second solve keeps the optimal mean accuracy (to 1e-7) and picks the placement that
    could serve the largest multiple of the demand; routes follow its rates scaled back to the demand,
    so every replica runs at the same share of its capacity.
    """
    if any(s < 0 or not math.isfinite(s) for s in problem.demand.values()):
        raise ValueError(f"demand must be finite and >= 0, got {dict(problem.demand)}")
    lp, n, v, _ = _build(problem, "accuracy")
    feasible, optimal, gap, seconds = _run(lp, time_limit_s)
    if not feasible:
        return None
    if not optimal:
        log.warning("proteus MILP: time limit %.1f s reached; keeping the incumbent (relative gap %.3g)",
                    time_limit_s, gap)
    objective = float(pulp.value(lp.objective) or 0.0)
    total = ordered_sum(problem.demand.values())
    factor = 1.0
    if spread and total > 0:
        wide, wide_n, wide_v, scale = _build(problem, "spread", objective / total * (1 - 1e-7))
        ok, _, _, more_s = _run(wide, time_limit_s)
        seconds += more_s
        if ok and (scale.value() or 0) >= 1:
            n, v, factor = wide_n, wide_v, float(scale.value())
    values = {k: var.value() or 0.0 for k, var in n.items()}
    replicas = {k: round(x) for k, x in values.items()}
    used = [sum(c for (p, _), c in replicas.items() if p == i) for i in range(len(problem.pools))]
    if any(abs(x - replicas[k]) > 1e-6 for k, x in values.items()) or any(
            u > pool.count for u, pool in zip(used, problem.pools)):
        log.warning("proteus MILP: the solver stopped without a whole placement; treating it as infeasible")
        return None
    served = {k: max(0.0, var.value() or 0.0) / factor for k, var in v.items()}
    return Solution({k: c for k, c in replicas.items() if c}, {k: s for k, s in served.items() if s > 1e-9},
                    dict(problem.demand), 1.0, objective, optimal, gap, seconds, problem.headroom)


def max_scale(problem: Problem, *, time_limit_s: float = TIME_LIMIT_S,
              held: Mapping[str, float] | None = None) -> float:
    """The largest share of the demand (at most 1) that some placement serves for every type at once (every type
    not ``held`` at its own share)."""
    lp, _, _, scale = _build(problem, "scale", held=held)
    feasible, _, _, _ = _run(lp, time_limit_s)
    return float(scale.value() or 0.0) if feasible else 0.0


def max_min_shares(problem: Problem, *, time_limit_s: float = TIME_LIMIT_S) -> dict[str, float]:
    """Each type's share of its demand under progressive filling: the largest common share, then, holding the types
    that cannot rise above it, the largest common share of the rest, and so on (at most 1 each)."""
    shares: dict[str, float] = {q: 1.0 for q, s in problem.demand.items() if s <= 0}
    while len(shares) < len(problem.demand):
        common = max_scale(problem, time_limit_s=time_limit_s, held=shares)
        free = [q for q in problem.demand if q not in shares]
        if common >= 1 - MAX_MIN_TOLERANCE:
            shares.update((q, 1.0) for q in free)
            break
        # a type is held where it cannot rise above the common share while the others stay at it
        stuck = [q for q in free if max_scale(problem, time_limit_s=time_limit_s, held={
            **shares, **{o: common for o in free if o != q}}) <= common + MAX_MIN_TOLERANCE]
        shares.update((q, common) for q in (stuck or free))
    return shares


def plan(problem: Problem, *, step: float = OVERLOAD_STEP, floor: float = OVERLOAD_FLOOR,
         time_limit_s: float = TIME_LIMIT_S, overload: str = DEFAULT_OVERLOAD,
         headroom_floor: float | None = None) -> Solution:
    """:func:`solve`; where the demand cannot all be served, the headroom given up first down to ``headroom_floor``
    (if any), then the demand lowered: in ``step``s of every type's (``overload`` "uniform"), or each type's as far as
    it must ("max-min"; module note)."""
    started = time.perf_counter()
    solution = solve(problem, time_limit_s=time_limit_s)
    if solution is not None:
        return solution
    if headroom_floor is not None and problem.headroom > headroom_floor:
        lowest = replace(problem, headroom=headroom_floor)
        grid = [problem.headroom - HEADROOM_STEP * j for j in
                range(1, math.ceil((problem.headroom - headroom_floor) / HEADROOM_STEP - 1e-9))] + [headroom_floor]
        # feasibility is monotone as the headroom falls: bisect for the first feasible step (the floor's is known)
        if len(grid) == 1 or solve(lowest, time_limit_s=time_limit_s, spread=False) is not None:
            lo, hi = 0, len(grid) - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if solve(replace(problem, headroom=grid[mid]), time_limit_s=time_limit_s, spread=False) is None:
                    lo = mid + 1
                else:
                    hi = mid
            solution = solve(replace(problem, headroom=grid[lo]), time_limit_s=time_limit_s) or (
                solve(lowest, time_limit_s=time_limit_s) if lo < len(grid) - 1 else None)
            if solution is not None:
                log.info("proteus MILP: headroom %.2f cannot be had; planned with %.2f", problem.headroom,
                         solution.headroom)
                return replace(solution, solve_s=time.perf_counter() - started)
        problem = lowest
    if overload == "max-min":
        shares = max_min_shares(problem, time_limit_s=time_limit_s)
        # the shares a hair lower for the solver's tolerance, as the uniform rule's last resort is
        lowered = replace(problem, demand={q: s * shares[q] * (1 - 1e-6) for q, s in problem.demand.items()})
        solution = solve(lowered, time_limit_s=time_limit_s) or solve(problem.scaled(0.0), time_limit_s=time_limit_s)
        if solution is None:
            raise RuntimeError("proteus MILP: no demand scale is feasible, not even zero")
        total = sum(problem.demand.values())
        factor = sum(lowered.demand.values()) / total if total else 0.0
        log.info("proteus MILP: demand %.0f q/s cannot be served; planned %.0f q/s (max-min shares %s)", total,
                 factor * total, ", ".join(f"{q} {shares[q]:.2f}" for q in sorted(shares)))
        return replace(solution, scale=factor, solve_s=time.perf_counter() - started)
    best = max_scale(problem, time_limit_s=time_limit_s)
    k = math.ceil((1 - best) / step - 1e-9)
    grid = [1 - j * step for j in (k, k + 1) if 1 - j * step >= floor - 1e-12]  # k + 1: the solver's tolerance
    for factor in (*grid, best * (1 - 1e-6), 0.0):
        solution = solve(problem.scaled(factor), time_limit_s=time_limit_s)
        if solution is not None:
            break
    if solution is None:
        raise RuntimeError("proteus MILP: no demand scale is feasible, not even zero")
    log.info("proteus MILP: demand %.0f q/s cannot be served; planned %.0f q/s (%.3g of it)",
             sum(problem.demand.values()), factor * sum(problem.demand.values()), factor)
    return replace(solution, scale=factor, solve_s=time.perf_counter() - started)
