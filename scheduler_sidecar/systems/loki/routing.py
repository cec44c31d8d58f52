"""Loki's load balancer (§5.1, Alg. 1): MostAccurateFirst routing tables and the backup tables of leftover
capacity that opportunistic rerouting draws on (§5.2).

Starting from the frontend with the estimated demand, each task's workers are visited in non-increasing
accuracy; a worker's outgoing queries to a child task (its planned incoming rate times its variant's fan-out
to that child) fill that child's workers most accurate first, each up to its capacity q(i,k,y) at its planned
batch size. A table entry is the probability of sending a query to that worker.

Decisions on what Alg. 1 leaves open (digest A13):
- The fan-out is the variant's own (the text), not the task's (the pseudo-code's ``task.multFactor``); the
  paper's non-increasing accuracy order (the artifact sorts ascending, which the paper contradicts); ties by
  worker id, so a table is deterministic.
- Replicas of one variant are one step of the order: they share its traffic by leftover capacity (evenly on
  a fresh table) rather than filling one after another, which would run all but the last at 100% load, where
  any burst queues without bound.
- Latency: Alg. 1 ignores it, so a slow detector's crops may fill a classifier whose planned batch size fits
  only a fast detector's path (the MILP's constraint 7 binds its path shares c(p), which the load balancer
  does not use). Kept as the paper has it: routing only along paths that fit SLO/2 was measured (Loki, 20
  workers, 150 to 1,200 frames/s) and changed violations by at most 0.1 point (6.83% against 6.94% at 700).
- Overflow, when every child worker is full: the rest is spread equally over the child's workers (the
  artifact's rule), so a table always sums to 1.
- A worker with no planned traffic (demand above the estimate reaches it anyway) routes by the child workers'
  leftover capacity, or evenly when none is left.
- Tables are keyed by worker (the paper), not by the incoming path (the artifact).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_sidecar.core.arith import ordered_sum
from scheduler_sidecar.systems.loki.pipeline import Pipeline

FRONTEND = -1  # the source of the root task's queries
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Replica:
    """One worker serving one variant of one task at a planned batch size."""

    worker_id: int
    task: str
    variant: str
    batch: int
    batch_ms: float  # l(i,k) at that batch size
    capacity_qps: float  # q(i,k,y)
    accuracy: float


Table = tuple[tuple[int, float], ...]  # (worker id, probability), most accurate first


@dataclass(frozen=True)
class Routing:
    replicas: Mapping[int, Replica]  # worker id -> what it serves
    tables: Mapping[tuple[int, str], Table]  # (source worker or FRONTEND, child task) -> where its queries go
    backups: Mapping[str, tuple[tuple[int, float], ...]]  # task -> (worker id, leftover q/s), most accurate first
    incoming: Mapping[int, float]  # worker id -> the q/s the tables send it

    def workers_of(self, task: str) -> list[Replica]:
        return [r for r in self.replicas.values() if r.task == task]


def most_accurate_first(pipeline: Pipeline, replicas: Sequence[Replica], demand_qps: float, *,
                        utilisation: float = 1.0) -> Routing:
    """The tables for ``demand_qps`` frames per second. Each worker is filled up to ``utilisation`` of its
    capacity (1 in Alg. 1; the planner's 1/headroom); the backup tables list what is left of the whole of it."""
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation!r}")
    by_task: dict[str, list[Replica]] = {t.name: [] for t in pipeline.tasks}
    for r in replicas:
        by_task[r.task].append(r)
    for rs in by_task.values():
        rs.sort(key=lambda r: (-r.accuracy, r.variant, r.worker_id))
    groups = {t: [list(g) for _, g in itertools.groupby(rs, key=lambda r: r.variant)] for t, rs in by_task.items()}
    by_id = {r.worker_id: r for r in replicas}
    left = {r.worker_id: r.capacity_qps * utilisation for r in replicas}
    incoming = dict.fromkeys(left, 0.0)
    tables: dict[tuple[int, str], Table] = {}

    def route(source: int, outgoing: float, child: str) -> None:
        workers = by_task[child]
        if not workers:
            return
        entries: dict[int, float] = {}
        total, rest = outgoing, outgoing
        for group in groups[child]:  # replicas of one variant share what they take, by leftover capacity
            room = ordered_sum(left[w.worker_id] for w in group)
            if room <= _EPS or rest <= _EPS:
                continue
            routed = min(rest, room)
            for w in group:
                part = routed * left[w.worker_id] / room
                if part > _EPS:
                    entries[w.worker_id] = part
                    left[w.worker_id] -= part
                    incoming[w.worker_id] += part
            rest -= routed
        if rest > _EPS:  # every child worker is full: spread the rest equally
            for w in workers:
                entries[w.worker_id] = entries.get(w.worker_id, 0.0) + rest / len(workers)
                incoming[w.worker_id] += rest / len(workers)
        if total <= _EPS:  # nothing planned: by leftover capacity, or evenly
            spare = {w.worker_id: left[w.worker_id] for w in workers if left[w.worker_id] > _EPS}
            entries, total = (spare, sum(spare.values())) if spare else \
                ({w.worker_id: 1.0 for w in workers}, float(len(workers)))
        tables[source, child] = tuple((w.worker_id, entries[w.worker_id] / total) for w in workers
                                      if w.worker_id in entries)

    route(FRONTEND, demand_qps, pipeline.root.name)
    for task in pipeline.tasks:
        for w in by_task[task.name]:
            fanout = pipeline.variant(w.variant).fanout
            for child in task.children:
                route(w.worker_id, incoming[w.worker_id] * fanout[child], child)
    spare = {r.worker_id: r.capacity_qps - incoming[r.worker_id] for r in replicas}
    backups = {t: tuple((r.worker_id, spare[r.worker_id]) for r in rs if spare[r.worker_id] > _EPS)
               for t, rs in by_task.items()}
    return Routing(by_id, tables, backups, incoming)

