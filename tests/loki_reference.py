"""A second Loki, written from the paper's text alone (Ahmad et al., HPDC '24, §4.1 Eqs. 1-12, §5.1 Alg. 1, §5.2),
for ``test_loki_reference.py`` to hold the project's against. It shares no code with ``scheduler_sidecar``: a serial
pipeline, plans by brute force (every allocation, batch size and, for accuracy scaling, an LP over the path
shares), MostAccurateFirst as Alg. 1 lists it, and a discrete-event data path.

What the paper leaves open is decided here the plain way, and the tests say where the project decided otherwise:
- Ties between optimal plans are all returned (the paper names no tie-break).
- A worker runs min(queue, y) queries in deadline order as soon as it is free (§3: workers "form batches").
- The per-task check is the paper's: when a query has run, time at the task (queueing and processing) minus the
  budget (``factor`` x l; 1 in §4.2) is its overrun; over budget, its children are dropped (per-task) or go to
  the most accurate backup whose execution time fits the routed one's minus the overrun (rerouting), else dropped.
- A frame meets its SLO when every query it led to ran, the last by its deadline; a dropped query fails it (§6.1).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

FRONTEND = -1


@dataclass(frozen=True)
class Variant:
    name: str
    accuracy: float
    latency_ms: dict[int, float]  # batch size -> batch latency
    fanout: int = 0  # queries one query creates for the next task

    def throughput(self, batch: int) -> float:
        return batch * 1000.0 / self.latency_ms[batch]

    def run_ms(self, size: int) -> float:
        """A batch of ``size`` runs as the smallest profiled batch that holds it."""
        return self.latency_ms[min(b for b in self.latency_ms if b >= size)]


@dataclass(frozen=True)
class Serial:
    tasks: tuple[tuple[Variant, ...], ...]  # per task, most accurate first
    slo_ms: float


@dataclass(frozen=True)
class Allocation:
    counts: tuple[tuple[str, int, int], ...]  # (variant, replicas, batch), replicas > 0


@dataclass
class Plans:
    step: str  # "hardware" or "accuracy"
    value: float  # workers (hardware) or system accuracy (accuracy)
    best: list[Allocation] = field(default_factory=list)


def _multipliers(pipe: Serial, path: Sequence[Variant]) -> list[float]:
    """m(p, i, k) for each vertex of ``path``: the product of its predecessors' fan-outs (Eq. 1)."""
    out, m = [], 1.0
    for v in path:
        out.append(m)
        m *= v.fanout
    return out


def _accuracy(path: Sequence[Variant]) -> float:
    return math.prod(v.accuracy for v in path)


def plan(pipe: Serial, demand: float, workers: int, batches: Sequence[int]) -> Plans:
    """Eqs. 8-11, else Eq. 12: every allocation of at most ``workers`` replicas tried."""
    half = pipe.slo_ms / 2  # §4.1: the SLO halved for queueing
    tops = [t[0] for t in pipe.tasks]
    # hardware scaling: the top variants only, fewest replicas
    best = Plans("hardware", math.inf)
    m = _multipliers(pipe, tops)
    for ys in itertools.product(*([b for b in batches if b in v.latency_ms] for v in tops)):
        if sum(v.latency_ms[y] for v, y in zip(tops, ys)) > half:
            continue
        xs = [math.ceil(demand * mi / v.throughput(y) - 1e-9) or 1 for v, y, mi in zip(tops, ys, m)]
        if sum(xs) > workers or sum(xs) > best.value:
            continue
        alloc = Allocation(tuple((v.name, x, y) for v, x, y in zip(tops, xs, ys)))
        if sum(xs) < best.value:
            best = Plans("hardware", sum(xs))
        best.best.append(alloc)
    if best.best:
        return best
    return _accuracy_scaling(pipe, demand, workers, batches)


def _accuracy_scaling(pipe: Serial, demand: float, workers: int, batches: Sequence[int]) -> Plans:
    from scipy.optimize import linprog  # this reference's only solver

    half = pipe.slo_ms / 2
    variants = [v for t in pipe.tasks for v in t]
    task_of = {v.name: i for i, t in enumerate(pipe.tasks) for v in t}
    best = Plans("accuracy", -math.inf)
    for counts in itertools.product(range(workers + 1), repeat=len(variants)):
        if sum(counts) != workers or any(sum(c for v, c in zip(variants, counts) if task_of[v.name] == i) == 0
                                        for i in range(len(pipe.tasks))):
            continue  # more replicas never serve less: full clusters only; every task keeps one
        used = [(v, c) for v, c in zip(variants, counts) if c]
        for ys in itertools.product(*([b for b in batches if b in v.latency_ms] for v, _ in used)):
            y = {v.name: b for (v, _), b in zip(used, ys)}
            paths = [p for p in itertools.product(*([v for v, _ in used if task_of[v.name] == i]
                                                    for i in range(len(pipe.tasks))))
                     if sum(v.latency_ms[y[v.name]] for v in p) <= half]
            if not paths:
                continue
            rows, rhs = [], []
            for v, c in used:
                rows.append([demand * _multipliers(pipe, p)[task_of[v.name]] if v in p else 0.0 for p in paths])
                rhs.append(c * v.throughput(y[v.name]))
            res = linprog([-_accuracy(p) for p in paths], A_ub=rows, b_ub=rhs, A_eq=[[1.0] * len(paths)], b_eq=[1.0],
                          bounds=(0, 1), method="highs")
            if res.status != 0:
                continue
            value = -res.fun
            alloc = Allocation(tuple((v.name, c, y[v.name]) for v, c in used))
            if value > best.value + 1e-9:
                best = Plans("accuracy", value, [alloc])
            elif value > best.value - 1e-9:
                best.best.append(alloc)
    return best


@dataclass(frozen=True)
class Replica:
    worker: int
    task: int
    variant: Variant
    batch: int


def most_accurate_first(pipe: Serial, replicas: Sequence[Replica], demand: float):
    """Alg. 1: (tables: (source worker or FRONTEND) -> [(worker, probability)], backups: task -> [(worker, left)])."""
    cap = {r.worker: r.variant.throughput(r.batch) for r in replicas}
    incoming = dict.fromkeys(cap, 0.0)
    by_task = [sorted((r for r in replicas if r.task == i), key=lambda r: (-r.variant.accuracy, r.worker))
               for i in range(len(pipe.tasks))]
    tables: dict[int, list[tuple[int, float]]] = {}

    def route(source: int, outgoing: float, task: int) -> None:
        total, table = outgoing, []
        for r in by_task[task]:
            if cap[r.worker] > 0 and outgoing > 0:
                routed = min(outgoing, cap[r.worker])
                table.append((r.worker, routed / total))
                outgoing -= routed
                cap[r.worker] -= routed
                incoming[r.worker] += routed
        tables[source] = table

    route(FRONTEND, demand, 0)
    for i in range(len(pipe.tasks) - 1):
        for r in by_task[i]:
            route(r.worker, incoming[r.worker] * r.variant.fanout, i + 1)
    backups = {i: [(r.worker, cap[r.worker]) for r in rs if cap[r.worker] > 1e-9] for i, rs in enumerate(by_task)}
    return tables, backups, incoming


@dataclass
class Frames:
    met: list[bool]
    dropped: list[bool]
    finish_us: list[int]  # when its last query finished (-1 if dropped)


def simulate(pipe: Serial, replicas: Sequence[Replica], demand: float, arrivals_us: Sequence[int], *,
             drop: str = "rerouting", factor: float = 1.0) -> Frames:
    """Frames through one plan. Tables must route each source to one worker (the comparison's scenarios do), so the
    run is deterministic: sampling a table with several entries is left out rather than drawn."""
    tables, backups, _ = most_accurate_first(pipe, replicas, demand)
    by_worker = {r.worker: r for r in replicas}
    n = len(arrivals_us)
    slo_us = round(pipe.slo_ms * 1000)
    deadline = [a + slo_us for a in arrivals_us]
    dropped, finish, pending = [False] * n, [-1] * n, [1] * n  # pending: queries of the frame not yet finished
    queues: dict[int, list] = {r.worker: [] for r in replicas}
    busy: set[int] = set()
    events: list = [(a, 0, i, "arrive", i) for i, a in enumerate(arrivals_us)]
    heapq.heapify(events)
    order = itertools.count(n)  # queries of later tasks, numbered in the order they are made

    def target(source: int) -> int:
        table = tables[source]
        if len(table) != 1:
            raise ValueError(f"source {source}'s table has {len(table)} entries; this reference does not sample")
        return table[0][0]

    while events:
        now, _, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            heapq.heappush(queues[target(FRONTEND)], (deadline[payload], payload, payload, now))
        else:
            worker, batch = payload
            busy.discard(worker)
            r = by_worker[worker]
            last = r.task == len(pipe.tasks) - 1
            for _, _, frame, reached in batch:
                pending[frame] -= 1
                if last:
                    finish[frame] = max(finish[frame], now)
                    continue
                overrun_ms = (now - reached) / 1000 - factor * r.variant.latency_ms[r.batch]
                for _ in range(r.variant.fanout):
                    to = target(worker)
                    if overrun_ms > 0 and drop in ("per-task", "rerouting"):
                        routed_ms = by_worker[to].variant.latency_ms[by_worker[to].batch]
                        fits = [w for w, _ in backups[r.task + 1] if drop == "rerouting" and
                                by_worker[w].variant.latency_ms[by_worker[w].batch] <= routed_ms - overrun_ms]
                        if not fits:
                            dropped[frame] = True
                            continue
                        to = max(fits, key=lambda w: by_worker[w].variant.accuracy)
                    pending[frame] += 1
                    heapq.heappush(queues[to], (deadline[frame], next(order), frame, now))
        for worker in sorted(queues):  # every free worker starts a batch at once
            if worker in busy or not queues[worker]:
                continue
            r = by_worker[worker]
            batch = [heapq.heappop(queues[worker]) for _ in range(min(r.batch, len(queues[worker])))]
            busy.add(worker)
            done = now + round(r.variant.run_ms(len(batch)) * 1000)
            heapq.heappush(events, (done, 1, next(order), "done", (worker, batch)))
    met = [not d and p == 0 and f <= dl for d, p, f, dl in zip(dropped, pending, finish, deadline)]
    return Frames(met, dropped, [f if not d else -1 for f, d in zip(finish, dropped)])
