"""The offline optimal bound of SuperServe's Eq. 1 (ZILP, digest 3.2): an integer program solved by HiGHS.

NOTE on the formulation. Eq. 1 has one binary I(phi, B, n, t) per subset B of the queries, GPU n and time t:
that is exponential. We solve the same problem with an equivalent compact model on a grid of ``time_step_us``
(slot s starts at ``origin_us + s * time_step_us``; ``origin_us`` is the earliest arrival). A *config* c =
(phi, b) is a variant and a profiled batch size, and it holds a worker for L_c >= 1 whole slots (see "Two
bounds" for the rounding). The model removes two symmetries of Eq. 1, which is what makes it solve in seconds:

- Workers are identical, so we count batches instead of naming their worker. Y[t, c] in {0..workers} is the
  number of batches with config c that start at slot t. If at most ``workers`` batches overlap at every slot,
  giving the batches to free workers in start order always succeeds (interval graph colouring), so nothing is
  lost.
- Queries with the same arrival slot and deadline slot (a class k of m_k queries) are interchangeable, so we
  count them too. X[k, t, c] in {0..min(m_k, workers * b)} is the number of queries of class k in those
  batches.

Constraints, numbered as in Eq. 1:

- (1a) sum_{t, c} X[k, t, c] <= m_k: each query is served at most once.
- (1b), summed over all variants: sum of Y[t', c] over t - L_c < t' <= t is <= workers at every slot t where a
  batch may start. This is enough, because two overlapping batches overlap at the later start. With one worker
  it is the per-GPU constraint, and it implies (1d), one batch per GPU and slot.
- (1c) X[k, t, c] exists only if t >= the arrival slot of k. Every query in the batch has arrived.
- (1e) X[k, t, c] exists only if t + L_c <= the deadline slot of k. Every query in the batch finishes in time.
- Batch size: sum_k X[k, t, c] <= cap_c * Y[t, c] and X[k, t, c] <= min(m_k, cap_c) * Y[t, c], where cap_c is
  min(b, the number of queries that could be in c at t). The second row follows for integers and tightens the
  LP. A batch of fewer than b queries runs at the profiled size b (padding).

Objective: maximise sum Acc(phi_c) * X[k, t, c], which equals sum over batches of Acc(phi) * |B|, as in Eq. 1.

Two bounds. Times are measured in slots from ``origin_us``: a query has arrival A and deadline D, a config
latency L (p50, first cut to whole microseconds: down for "upper", up for "feasible").
- ``bound="feasible"`` rounds inwards: arrival slot ceil(A), deadline slot floor(D), L_c = max(1, ceil(L)).
  Every ILP schedule is then feasible in continuous time, so its optimum is a LOWER bound on the
  continuous-time optimum; halving time_step_us (a nested grid) never lowers it.
- ``bound="upper"`` rounds outwards: arrival slot floor(A), deadline slot ceil(D), L_c = floor(L), and it
  requires time_step_us <= the shortest latency in use, so that L_c >= 1. Its optimum is an UPPER bound on
  the continuous-time optimum. Proof: take a continuous-time schedule whose batches take at least L each and
  map each batch, started at S, to slot floor(S) on the same worker with the same config and queries. (1c)
  S >= A gives floor(S) >= floor(A). (1e) floor(S) + floor(L) <= floor(S + L) <= D <= ceil(D). (1b) two batches on one worker have S2 >= S1 + L1, so
  floor(S2) >= floor(S1 + L1) >= floor(S1) + floor(L1): their slot intervals stay disjoint. As every interval
  holds >= 1 slot, at most ``workers`` batches run at any slot, which also gives Y <= workers. The image is a
  feasible ILP solution with the same objective. With floor(L) = 0 this fails (two batches of one worker could
  start in the same slot, and a zero-slot batch would occupy no slot at all), hence the requirement. The same
  argument applied to a fine grid's schedule shows that a coarser nested grid never lowers the upper bound.
  The simulator rounds latencies to the nearest microsecond, never below the floor used here, so no simulated
  policy beats the upper bound. The "upper" schedule itself may be infeasible in continuous time.

Pruning, which keeps the optimum. A config c is dropped once, for all slots, when another config c' has
L_c' <= L_c, Acc' >= Acc and b' >= b (ties keep the lower index): c' can run every batch c could, as
accurately, and it frees the worker no later. At each slot the same test is repeated with b replaced by
cap_c, which drops the large batch sizes that the queries in reach cannot fill. Y[t, c] is created only if
some query could be in it.

Sizes: |Y| <= slots * configs; |X| <= classes * (slots in the class's window) * configs; rows = |X| + |Y| +
classes + start slots. Example: 30 queries, 2 workers, 4 variants x 4 batch sizes, a 20 ms SLO and 1 ms slots
give 2,000 to 4,000 integer variables and as many rows. The solve time grows with the choices of one query,
configs (after the first pruning) x start slots in its window, more than with the length of the trace, which
mostly adds independent stretches. Above MAX_CONFIG_SLOTS choices HiGHS often needs minutes, so we refuse
such a model up front and say how to cut it.

Two alternatives were tried and dropped. A per-worker model with binaries x[q, n, t] and y[n, t, phi, b] hit
60 s time limits on such instances: its LP is weaker and its workers are symmetric. Left-shift constraints
(start only when a query arrives or every worker is busy) did not speed it up.
"""

# Ambiguity (digest A15): (1c) bounds a batch by its *earliest* arrival a(B), which lets a batch start before
#   some of its queries arrive. Chosen: every query's own arrival bounds the start (the latest arrival),
#   because a batch cannot run on a query that has not arrived.
# Ambiguity (digest A15): (1b) is written per phi, so it allows two batches of different variants to overlap
#   on one GPU. Chosen: the one-batch-at-a-time constraint sums over all variants, because a GPU runs one
#   batch at a time.
# Ambiguity (digest A15): the paper gives no time discretisation. Chosen: start times on a grid of
#   time_step_us from the earliest arrival, rounded inwards ("feasible", a lower bound whose schedule runs
#   as is) or outwards ("upper", an upper bound), because a grid's optimum is exact only when every time in
#   the trace and the profile lies on it; the two bounds bracket the continuous optimum and meet there.
# Ambiguity (digest 3.2): l_phi(|B|) is only profiled at some batch sizes. Chosen: a batch of k queries runs
#   at any profiled size b >= k and is charged l_phi(b) (padding), because that is how a batching server
#   runs a batch between two profiled sizes.

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.systems.milp_solver import pick_solver, variable
from scheduler_sidecar.systems.milp_solver import solve as solve_milp

BOUNDS = ("feasible", "upper")  # see "Two bounds" above
MAX_BRUTE_FORCE_QUERIES = 10  # brute_force is exponential in the number of queries
# (config, start slot) choices of one query above which solve_optimal refuses: past it HiGHS often needs
# minutes (the 200-variant paper profile at a 36 ms SLO has 12,000; 16 of its variants 6,000)
MAX_CONFIG_SLOTS = 8_000


@dataclass(frozen=True)
class OptimalBatch:
    """One batch of the optimal schedule."""

    worker: int  # 0 .. workers - 1
    start_us: int  # on the time grid; "feasible": >= the arrival of every query in the batch
    variant_id: str
    query_ids: tuple[int, ...]  # indices into arrival_us, ascending
    batch_size: int  # profiled batch size whose latency is charged (>= len(query_ids); padding)
    finish_us: int  # start_us + the latency in whole slots; "feasible": <= every query's deadline


@dataclass(frozen=True)
class OptimalResult:
    """The offline optimum of the discretised Eq. 1 and the schedule that reaches it.

    With ``bound="feasible"`` the schedule runs as is in continuous time and ``objective`` is a lower bound on
    the continuous optimum. With ``bound="upper"`` ``objective`` is an upper bound on it, and the schedule is
    that of the relaxed grid: a batch may start up to a slot before a query arrives, or end up to a slot
    after a deadline, and its latency is rounded down, so it need not be feasible in continuous time.
    """

    objective: float  # sum over served queries of accuracy (Acc(phi) * |B| summed over batches)
    served: int  # queries in some batch
    batches: tuple[OptimalBatch, ...]  # by start_us, then worker
    solver: str  # "HiGHS" or "PULP_CBC_CMD"
    status: str  # "optimal"; "feasible" (time limit hit, optimality not proven); "no_solution"
    # the solver's proven bound on this ILP's optimum, >= objective and equal when "optimal"; None where the
    # solver reports none (CBC). With "upper" and a time limit hit, this, not objective, bounds every policy.
    best_bound: float | None
    time_step_us: int
    bound: str  # "feasible" (lower bound, runnable schedule) or "upper" (upper bound, relaxed schedule)
    num_variables: int  # size of the ILP after pruning
    num_constraints: int


@dataclass(frozen=True)
class _Config:
    variant: int  # index into profile.variants
    batch_size: int
    latency_slots: int  # >= 1
    accuracy: float


@dataclass(frozen=True)
class _Instance:
    """The discretised problem, shared by the ILP and the brute force."""

    origin_us: int  # start time of slot 0 (the earliest arrival)
    time_step_us: int
    arrival_slot: tuple[int, ...]  # query -> first slot a batch holding it may start
    deadline_slot: tuple[int, ...]  # query -> last slot by which a batch holding it must end
    configs: tuple[_Config, ...]


def _discretise(arrival_us: Sequence[int], deadline_us: Sequence[int], profile: Profile, workers: int,
                device: str | None, batch_sizes: Sequence[int] | None, time_step_us: int,
                bound: str) -> _Instance:
    if len(arrival_us) != len(deadline_us):
        raise ValueError(f"arrival_us has {len(arrival_us)} entries but deadline_us has {len(deadline_us)}; "
                         "give one deadline per query")
    for q, (a, d) in enumerate(zip(arrival_us, deadline_us)):
        if d < a:
            raise ValueError(f"query {q}: deadline_us {d} is before arrival_us {a}")
    if isinstance(workers, bool) or not _is_integer(workers) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if isinstance(time_step_us, bool) or not _is_integer(time_step_us) or time_step_us < 1:
        raise ValueError(f"time_step_us must be an integer >= 1, got {time_step_us!r}")
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    if batch_sizes is not None and not batch_sizes:
        raise ValueError("batch_sizes is empty; leave it None to use every profiled size")
    if not profile.variants:
        raise ValueError(f"profile {profile.name!r} has no variants")
    if device is None:
        device = profile.device_kinds[0]
    if device not in profile.device_kinds:
        raise ValueError(f"profile {profile.name!r} has no device kind {device!r}; "
                         f"it has {list(profile.device_kinds)}")
    upper = bound == "upper"
    latencies = []  # (latency in whole us, variant index, batch size)
    for i, v in enumerate(profile.variants):
        curve = v.latency[device]
        sizes = curve.batch_sizes if batch_sizes is None else tuple(batch_sizes)
        for b in sizes:
            if b not in curve.batch_sizes:
                raise ValueError(f"batch size {b} is not profiled for variant {v.id!r} on {device!r} "
                                 f"(profiled: {list(curve.batch_sizes)})")
            # round to 1e-3 us first so that 1.5 ms stays 1500 us despite float error
            latency_us = round(curve.p50_at(b) * 1000.0, 3)
            latencies.append((math.floor(latency_us) if upper else math.ceil(latency_us), i, b))
    shortest_us, i, b = min(latencies)
    if upper and shortest_us < time_step_us:
        raise ValueError(f"bound='upper' needs time_step_us <= the shortest profiled latency, so that a "
                         f"batch holds a worker for at least one slot: variant {profile.variants[i].id!r} at "
                         f"batch size {b} takes {shortest_us} us but time_step_us is {time_step_us}")
    origin_us = min((int(a) for a in arrival_us), default=0)

    def slots(us: int, round_up: bool) -> int:
        return -(-us // time_step_us) if round_up else us // time_step_us

    return _Instance(
        origin_us, time_step_us,
        tuple(slots(int(a) - origin_us, round_up=not upper) for a in arrival_us),
        tuple(slots(int(d) - origin_us, round_up=upper) for d in deadline_us),
        tuple(_Config(i, b, max(1, slots(latency_us, round_up=not upper)), profile.variants[i].accuracy)
              for latency_us, i, b in latencies),
    )


def _is_integer(value: object) -> bool:
    try:
        operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def _undominated(points: Sequence[tuple[int, float, int]]) -> list[int]:
    """Indices, ascending, of the (latency, accuracy, size) points that no other point dominates.

    q dominates p if q has <= latency, >= accuracy and >= size; of equal points the first is kept. O(n log n +
    n * max size): in sorted order a point's dominators come before it, and best[s] is the highest accuracy
    kept so far with size >= s.
    """
    best = [-math.inf] * (max((s for _, _, s in points), default=0) + 1)
    kept = []
    for i in sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1], -points[i][2], i)):
        _, accuracy, size = points[i]
        if best[size] < accuracy:
            kept.append(i)
            for s in range(size + 1):
                best[s] = max(best[s], accuracy)
    return sorted(kept)


@dataclass(frozen=True)
class _Model:
    prob: Any  # pulp.LpProblem
    batches: dict[tuple[int, int], Any]  # (slot, config) -> Y: number of batches started
    served: dict[tuple[int, int, int], Any]  # (class, slot, config) -> X: queries of the class in them
    members: list[tuple[int, ...]]  # class -> its queries (same arrival and deadline slot), by arrival_us


def _build(inst: _Instance, workers: int, arrival_us: Sequence[int], deadline_us: Sequence[int]) -> _Model:
    import pulp  # type: ignore[import-untyped, unused-ignore]

    windows = list(zip(inst.arrival_slot, inst.deadline_slot))
    kept = _undominated([(c.latency_slots, c.accuracy, c.batch_size) for c in inst.configs])
    lengths = sorted({inst.configs[ci].latency_slots for ci in kept})
    # the slots at which some query could start
    slots = sorted({t for a, d in windows for t in range(a, d - lengths[0] + 1)})
    window = max((d - lengths[0] + 1 - a for a, d in windows), default=0)  # most start slots of one query
    if len(kept) * window > MAX_CONFIG_SLOTS:
        raise ConfigError(
            f"a query could go in {len(kept)} undominated configs (variant, batch size) x {window} start slots "
            f"= {len(kept) * window:,} > {MAX_CONFIG_SLOTS:,}: the ILP would take minutes; cut the profile to "
            "a few variants (`accscale simulate --variants N`: Profile.spread), pass fewer batch sizes "
            "(--batch-sizes) or a coarser time grid (--time-step-us)")

    prob = pulp.LpProblem("zilp", pulp.LpMaximize)
    by_window: dict[tuple[int, int], list[int]] = {}
    for q, window in enumerate(windows):
        by_window.setdefault(window, []).append(q)
    members = [tuple(sorted(qs, key=lambda q: (int(arrival_us[q]), int(deadline_us[q]), q)))
               for _, qs in sorted(by_window.items())]
    class_of = {q: k for k, qs in enumerate(members) for q in qs}
    batch_cat = pulp.LpBinary if workers == 1 else pulp.LpInteger

    Y: dict[tuple[int, int], Any] = {}
    X: dict[tuple[int, int, int], Any] = {}
    served_of_class: dict[int, list[Any]] = {}  # class -> its X
    objective = []
    for t in slots:
        arrived = [q for q, (a, _) in enumerate(windows) if a <= t]
        # queries that may be in a batch started at t that holds a worker for `length` slots
        reach = {length: [q for q in arrived if t + length <= windows[q][1]] for length in lengths}
        rows = []  # (config, cap) of the configs some query could be in
        for ci in kept:
            if n := len(reach[inst.configs[ci].latency_slots]):
                rows.append((ci, min(inst.configs[ci].batch_size, n)))
        useful = _undominated([(inst.configs[ci].latency_slots, inst.configs[ci].accuracy, cap)
                               for ci, cap in rows])
        for ci, cap in (rows[j] for j in useful):
            y = Y[t, ci] = variable(prob, f"Y_{t}_{ci}", 0, workers, batch_cat)
            xs = []
            # a class is either wholly in reach or not
            for k in sorted({class_of[q] for q in reach[inst.configs[ci].latency_slots]}):
                most = min(len(members[k]), cap)  # of class k in one batch
                top = min(len(members[k]), workers * cap)  # of class k in all batches at (t, c)
                x = X[k, t, ci] = variable(prob, f"X_{k}_{t}_{ci}", 0, top,
                                            pulp.LpBinary if top == 1 else pulp.LpInteger)
                xs.append(x)
                served_of_class.setdefault(k, []).append(x)
                objective.append(inst.configs[ci].accuracy * x)
                prob += x <= most * y, f"fill_{k}_{t}_{ci}"
            prob += pulp.lpSum(xs) <= cap * y, f"size_{t}_{ci}"
    for k, xs in served_of_class.items():
        prob += pulp.lpSum(xs) <= len(members[k]), f"once_{k}"  # (1a), for a class of interchangeable queries
    # (1b), summed over all variants: at most `workers` batches run at each slot where one may start
    running: dict[int, list[Any]] = {t: [] for t, _ in Y}
    for (t0, ci), y in Y.items():
        for t in range(t0, t0 + inst.configs[ci].latency_slots):
            if t in running:
                running[t].append(y)
    for t, ys in sorted(running.items()):
        prob += pulp.lpSum(ys) <= workers, f"busy_{t}"
    prob += pulp.lpSum(objective)
    return _Model(prob, Y, X, members)


def _schedule(model: _Model, inst: _Instance, profile: Profile, workers: int) -> list[OptimalBatch]:
    """Turn counts back into batches of query ids on workers."""
    unassigned = [list(qs) for qs in model.members]  # class -> queries not yet in a batch
    runs = []  # (slot, config, query ids)
    for (t, ci), y in sorted(model.batches.items()):
        num_batches = round(y.varValue or 0.0)
        if num_batches == 0:
            continue
        ids: list[int] = []
        for k in range(len(model.members)):
            x = model.served.get((k, t, ci))
            take = 0 if x is None else round(x.varValue or 0.0)
            ids += unassigned[k][:take]
            del unassigned[k][:take]
        size = inst.configs[ci].batch_size
        assert len(ids) <= num_batches * size, "solver returned more queries than its batches hold"
        runs += [(t, ci, tuple(sorted(ids[i:i + size]))) for i in range(0, len(ids), size)]
    # at most `workers` batches overlap at any start, so assigning in start order always finds a free worker
    free_slot = [0] * workers  # worker -> first slot it is free
    batches = []
    for t, ci, query_ids in sorted(runs):
        c = inst.configs[ci]
        free = [n for n in range(workers) if free_slot[n] <= t]
        assert free, f"more than {workers} batches overlap at slot {t}"
        n = free[0]
        free_slot[n] = t + c.latency_slots
        start_us = inst.origin_us + t * inst.time_step_us
        batches.append(OptimalBatch(n, start_us, profile.variants[c.variant].id, query_ids, c.batch_size,
                                    start_us + c.latency_slots * inst.time_step_us))
    return batches


def solve_optimal(arrival_us: Sequence[int], deadline_us: Sequence[int], profile: Profile, *, workers: int,
                  device: str | None = None, batch_sizes: Sequence[int] | None = None,
                  time_step_us: int = 1000, time_limit_s: float = 60.0,
                  bound: str = "feasible") -> OptimalResult:
    """The accuracy-weighted number of queries an oracle serves within their deadlines (Eq. 1, discretised).

    Query q arrives at ``arrival_us[q]`` and must finish by ``deadline_us[q]``. ``workers`` identical workers
    run one batch at a time, with the p50 latency of ``device`` (default: the profile's first device kind), at
    ``batch_sizes`` (default: every profiled size). ``bound`` picks the rounding to the grid: "feasible" gives
    a runnable schedule and a lower bound on the continuous-time optimum, "upper" an upper bound (it needs
    ``time_step_us`` <= the shortest latency). ``time_limit_s`` bounds the solver, and ``status`` says whether
    optimality was proven. Raises ValueError on bad input and on a model too large (MAX_CONFIG_SLOTS).
    """
    import pulp  # type: ignore[import-untyped, unused-ignore]

    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
    inst = _discretise(arrival_us, deadline_us, profile, workers, device, batch_sizes, time_step_us, bound)
    # zero gaps: accuracies differ by a few hundredths, and HiGHS's default 1e-4 relative gap could hide that
    solver, solver_name = pick_solver(time_limit_s, gapRel=0.0, gapAbs=1e-9)
    model = _build(inst, workers, arrival_us, deadline_us)
    num_variables, num_constraints = model.prob.numVariables(), model.prob.numConstraints()
    if not model.batches:  # no query can be served at all
        return OptimalResult(0.0, 0, (), solver_name, "optimal", 0.0, time_step_us, bound, num_variables,
                             num_constraints)
    solve_milp(model.prob, solver)

    sol_status = model.prob.sol_status
    status = ("optimal" if sol_status == pulp.LpSolutionOptimal
              else "feasible" if sol_status == pulp.LpSolutionIntegerFeasible else "no_solution")
    batches = _schedule(model, inst, profile, workers) if status != "no_solution" else []
    accuracy = {v.id: v.accuracy for v in profile.variants}
    objective = sum((accuracy[b.variant_id] * len(b.query_ids) for b in batches), 0.0)
    best_bound: float | None = None
    if status == "optimal":
        best_bound = objective
    elif solver_name == "HiGHS":
        dual = -model.prob.solverModel.getInfo().mip_dual_bound  # HiGHS minimises the negated objective
        # before its root LP is solved HiGHS may report little better than the sum of the variables' bounds
        best_bound = min(dual, len(arrival_us) * max(accuracy.values()))
    return OptimalResult(
        objective=objective,
        served=sum(len(b.query_ids) for b in batches),
        batches=tuple(sorted(batches, key=lambda b: (b.start_us, b.worker))),
        solver=solver_name,
        status=status,
        best_bound=best_bound,
        time_step_us=time_step_us,
        bound=bound,
        num_variables=num_variables,
        num_constraints=num_constraints,
    )


def brute_force(arrival_us: Sequence[int], deadline_us: Sequence[int], profile: Profile, *, workers: int,
                device: str | None = None, batch_sizes: Sequence[int] | None = None,
                time_step_us: int = 1000, bound: str = "feasible") -> float:
    """The optimal objective of the same discretised problem by exhaustive search, for tiny instances.

    Independent of the ILP, its pruning included: it builds schedules batch by batch. Each step picks a
    worker, a subset of the unserved queries and a config with batch size >= the subset, and starts the batch
    as early as possible (when the worker is free and every query has arrived). Starting later never helps,
    so left-shifted schedules are enough.
    """
    inst = _discretise(arrival_us, deadline_us, profile, workers, device, batch_sizes, time_step_us, bound)
    num_queries = len(inst.arrival_slot)
    if num_queries > MAX_BRUTE_FORCE_QUERIES:
        raise ValueError(f"brute_force is for at most {MAX_BRUTE_FORCE_QUERIES} queries, got {num_queries}")
    subsets = [(mask, [q for q in range(num_queries) if mask >> q & 1])
               for mask in range(1, 1 << num_queries)]

    @cache
    def best(unserved: int, free_slots: tuple[int, ...]) -> float:
        value = 0.0  # serve nothing more
        for w, free in enumerate(free_slots):
            if free in free_slots[:w]:
                continue  # workers are identical: one with the same free slot was tried
            for mask, queries in subsets:
                if mask & unserved != mask:
                    continue
                start = max([free] + [inst.arrival_slot[q] for q in queries])
                due = min(inst.deadline_slot[q] for q in queries)
                for c in inst.configs:
                    if c.batch_size >= len(queries) and start + c.latency_slots <= due:
                        finish = start + c.latency_slots
                        after = tuple(sorted(free_slots[:w] + (finish,) + free_slots[w + 1:]))
                        value = max(value, c.accuracy * len(queries) + best(unserved & ~mask, after))
        return value

    return best((1 << num_queries) - 1, (0,) * workers)
