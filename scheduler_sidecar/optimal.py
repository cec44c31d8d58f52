"""The offline optimal bound of SuperServe's Eq. 1 (ZILP, digest 3.2): an integer program solved by HiGHS.

NOTE on the formulation. Eq. 1 has one binary I(phi, B, n, t) per subset B of the queries, GPU n and time t:
that is exponential. We solve the same problem with an equivalent compact model on a grid of ``time_step_us``
(slot s starts at ``origin_us + s * time_step_us``; ``origin_us`` is the earliest arrival). A *config* c =
(phi, b) is a variant and a profiled batch size, and it holds a worker for L_c = ceil(l_phi(b) / step) slots
(at least 1). The model removes two symmetries of Eq. 1, and this is what makes it solve in seconds:

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

Pruning, which keeps the optimum. Y[t, c] is created only if some query could be in it. It is also skipped
when another config c' at the same slot is at least as good on all of (L_c, Acc, cap_c); ties keep the lower
index. Then c' can serve every batch c could, as accurately, and it frees the worker no later.

Sizes: |Y| <= slots * configs; |X| <= classes * (slots in the class's window) * configs; rows = |X| + |Y| +
classes + start slots. Example: 30 queries, 2 workers, 4 variants x 4 batch sizes, a 20 ms SLO and 1 ms slots
give 2,000 to 4,000 integer variables and as many rows.

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
#   time_step_us from the earliest arrival, and latencies (profile p50) rounded UP to whole slots, at least
#   one, because then every ILP schedule is feasible in continuous time. The result is the exact optimum of
#   the discretised problem and a lower bound on the continuous optimum; halving time_step_us (a nested grid)
#   never lowers it. A policy simulated in continuous time can therefore beat a coarse grid's bound: compare
#   at a fine time_step_us.
# Ambiguity (digest 3.2): l_phi(|B|) is only profiled at some batch sizes. Chosen: a batch of k queries runs
#   at any profiled size b >= k and is charged l_phi(b) (padding), because that is how a batching server
#   runs a batch between two profiled sizes.

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from scheduler_sidecar.profile import Profile

MAX_BRUTE_FORCE_QUERIES = 10  # brute_force is exponential in the number of queries


@dataclass(frozen=True)
class OptimalBatch:
    """One batch of the optimal schedule."""

    worker: int  # 0 .. workers - 1
    start_us: int  # on the time grid, >= the arrival of every query in the batch
    variant_id: str
    query_ids: tuple[int, ...]  # indices into arrival_us, ascending
    batch_size: int  # profiled batch size whose latency is charged (>= len(query_ids); padding)
    finish_us: int  # start_us + latency rounded up to whole slots; <= every query's deadline


@dataclass(frozen=True)
class OptimalResult:
    """The offline optimum of the discretised Eq. 1 and the schedule that reaches it."""

    objective: float  # sum over served queries of accuracy (Acc(phi) * |B| summed over batches)
    served: int  # queries in some batch
    batches: tuple[OptimalBatch, ...]  # by start_us, then worker
    solver: str  # "HiGHS" or "PULP_CBC_CMD"
    status: str  # "optimal"; "feasible" (time limit hit, optimality not proven); "no_solution"
    time_step_us: int
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
                device: str | None, batch_sizes: Sequence[int] | None, time_step_us: int) -> _Instance:
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
    if batch_sizes is not None and not batch_sizes:
        raise ValueError("batch_sizes is empty; leave it None to use every profiled size")
    if not profile.variants:
        raise ValueError(f"profile {profile.name!r} has no variants")
    if device is None:
        device = profile.device_kinds[0]
    if device not in profile.device_kinds:
        raise ValueError(f"profile {profile.name!r} has no device kind {device!r}; "
                         f"it has {list(profile.device_kinds)}")
    configs = []
    for i, v in enumerate(profile.variants):
        curve = v.latency[device]
        sizes = curve.batch_sizes if batch_sizes is None else tuple(batch_sizes)
        for b in sizes:
            if b not in curve.batch_sizes:
                raise ValueError(f"batch size {b} is not profiled for variant {v.id!r} on {device!r} "
                                 f"(profiled: {list(curve.batch_sizes)})")
            # round to 1e-3 us first so that 1.5 ms stays 1500 us despite float error
            latency_us = math.ceil(round(curve.p50_at(b) * 1000.0, 3))
            configs.append(_Config(i, b, max(1, -(-latency_us // time_step_us)), v.accuracy))
    origin_us = min((int(a) for a in arrival_us), default=0)
    return _Instance(
        origin_us, time_step_us,
        tuple(-(-(int(a) - origin_us) // time_step_us) for a in arrival_us),
        tuple((int(d) - origin_us) // time_step_us for d in deadline_us),
        tuple(configs),
    )


def _is_integer(value: object) -> bool:
    try:
        operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def _candidates(inst: _Instance, t: int, c: _Config) -> list[int]:
    """Queries that may be in a batch started at slot t with config c."""
    return [q for q, (a, d) in enumerate(zip(inst.arrival_slot, inst.deadline_slot))
            if a <= t and t + c.latency_slots <= d]


def _useful_configs(inst: _Instance, t: int) -> list[tuple[int, list[int], int]]:
    """(config index, candidate queries, capacity) of the configs at slot t that no other config dominates."""
    rows = []
    for ci, c in enumerate(inst.configs):
        cand = _candidates(inst, t, c)
        if cand:
            rows.append((ci, cand, min(c.batch_size, len(cand))))
    kept = []
    for ci, cand, cap in rows:
        c = inst.configs[ci]
        key = (c.latency_slots, -c.accuracy, -cap)
        dominated = False
        for cj, _, cap_j in rows:
            o = inst.configs[cj]
            other = (o.latency_slots, -o.accuracy, -cap_j)
            if cj != ci and all(x <= y for x, y in zip(other, key)) and (other != key or cj < ci):
                dominated = True
                break
        if not dominated:
            kept.append((ci, cand, cap))
    return kept


def _pick_solver(time_limit_s: float) -> tuple[Any, str]:
    # imported where used: it costs about 0.2 s, and the serving path never needs it
    import pulp  # type: ignore[import-untyped, unused-ignore]

    # zero gaps: accuracies differ by a few hundredths, and HiGHS's default 1e-4 relative gap could hide that
    highs = pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=0.0, gapAbs=1e-9)
    if highs.available():
        return highs, "HiGHS"
    with warnings.catch_warnings():
        # PuLP 3.3 deprecates its bundled CBC for 4.0; it is only the fallback here
        warnings.filterwarnings("ignore", message="PULP_CBC_CMD is deprecated", category=DeprecationWarning)
        cbc = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=0.0)
    if not cbc.available():
        raise RuntimeError("neither HiGHS (pip install highspy) nor PuLP's bundled CBC is available")
    return cbc, "PULP_CBC_CMD"


@dataclass(frozen=True)
class _Model:
    prob: Any  # pulp.LpProblem
    batches: dict[tuple[int, int], Any]  # (slot, config) -> Y: number of batches started
    served: dict[tuple[int, int, int], Any]  # (class, slot, config) -> X: queries of the class in them
    members: list[tuple[int, ...]]  # class -> its queries (same arrival and deadline slot), by arrival_us


def _build(inst: _Instance, workers: int, arrival_us: Sequence[int], deadline_us: Sequence[int]) -> _Model:
    import pulp  # type: ignore[import-untyped, unused-ignore]

    prob = pulp.LpProblem("zilp", pulp.LpMaximize)
    windows = list(zip(inst.arrival_slot, inst.deadline_slot))
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
    shortest = min(c.latency_slots for c in inst.configs)
    # the slots at which some query could start
    slots = sorted({t for a, d in windows for t in range(a, d - shortest + 1)})
    for t in slots:
        for ci, cand, cap in _useful_configs(inst, t):
            y = Y[t, ci] = _variable(prob, f"Y_{t}_{ci}", 0, workers, batch_cat)
            xs = []
            for k in sorted({class_of[q] for q in cand}):  # a class is either wholly in cand or not
                most = min(len(members[k]), cap)  # of class k in one batch
                top = min(len(members[k]), workers * cap)  # of class k in all batches at (t, c)
                x = X[k, t, ci] = _variable(prob, f"X_{k}_{t}_{ci}", 0, top,
                                            pulp.LpBinary if top == 1 else pulp.LpInteger)
                xs.append(x)
                served_of_class.setdefault(k, []).append(x)
                objective.append(inst.configs[ci].accuracy * x)
                prob += x <= most * y, f"fill_{k}_{t}_{ci}"
            prob += pulp.lpSum(xs) <= cap * y, f"size_{t}_{ci}"
    for k, xs in served_of_class.items():
        prob += pulp.lpSum(xs) <= len(members[k]), f"once_{k}"  # (1a), for a class of interchangeable queries
    # (1b), summed over all variants: at most `workers` batches run at each slot where one may start
    max_latency_slots = max((c.latency_slots for c in inst.configs), default=1)
    starts = sorted({t for t, _ in Y})
    for t in starts:
        running = [y for t0 in range(t - max_latency_slots + 1, t + 1) for ci in range(len(inst.configs))
                   if (y := Y.get((t0, ci))) is not None and t0 + inst.configs[ci].latency_slots > t]
        prob += pulp.lpSum(running) <= workers, f"busy_{t}"
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
                  time_step_us: int = 1000, time_limit_s: float = 60.0) -> OptimalResult:
    """The accuracy-weighted number of queries an oracle serves within their deadlines (Eq. 1, discretised).

    Query q arrives at ``arrival_us[q]`` and must finish by ``deadline_us[q]``. ``workers`` identical workers
    run one batch at a time, with the p50 latency of ``device`` (default: the profile's first device kind), at
    ``batch_sizes`` (default: every profiled size). ``time_limit_s`` bounds the solver, and ``status`` says
    whether optimality was proven.
    """
    import pulp  # type: ignore[import-untyped, unused-ignore]

    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
    inst = _discretise(arrival_us, deadline_us, profile, workers, device, batch_sizes, time_step_us)
    solver, solver_name = _pick_solver(time_limit_s)
    model = _build(inst, workers, arrival_us, deadline_us)
    num_variables, num_constraints = model.prob.numVariables(), model.prob.numConstraints()
    if not model.batches:  # no query can be served at all
        return OptimalResult(0.0, 0, (), solver_name, "optimal", time_step_us, num_variables, num_constraints)
    model.prob.solve(solver)

    sol_status = model.prob.sol_status
    status = ("optimal" if sol_status == pulp.LpSolutionOptimal
              else "feasible" if sol_status == pulp.LpSolutionIntegerFeasible else "no_solution")
    batches = _schedule(model, inst, profile, workers) if status != "no_solution" else []
    accuracy = {v.id: v.accuracy for v in profile.variants}
    return OptimalResult(
        objective=sum(accuracy[b.variant_id] * len(b.query_ids) for b in batches),
        served=sum(len(b.query_ids) for b in batches),
        batches=tuple(sorted(batches, key=lambda b: (b.start_us, b.worker))),
        solver=solver_name,
        status=status,
        time_step_us=time_step_us,
        num_variables=num_variables,
        num_constraints=num_constraints,
    )


def _variable(prob: Any, name: str, low: float, up: float | None, cat: str) -> Any:
    """A new PuLP variable; PuLP >= 3.3 deprecates ``LpVariable(...)`` in favour of ``prob.add_variable``."""
    import pulp  # type: ignore[import-untyped, unused-ignore]

    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat)


def brute_force(arrival_us: Sequence[int], deadline_us: Sequence[int], profile: Profile, *, workers: int,
                device: str | None = None, batch_sizes: Sequence[int] | None = None,
                time_step_us: int = 1000) -> float:
    """The optimal objective of the same discretised problem by exhaustive search, for tiny instances.

    Independent of the ILP: it builds schedules batch by batch. Each step picks a worker, a subset of the
    unserved queries and a config with batch size >= the subset, and starts the batch as early as possible
    (when the worker is free and every query has arrived). Starting later never helps, so left-shifted
    schedules are enough.
    """
    inst = _discretise(arrival_us, deadline_us, profile, workers, device, batch_sizes, time_step_us)
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
