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
- Overflow, when every child worker is full: the rest is spread equally over the child's workers (the
  artifact's rule), so a table always sums to 1.
- A worker with no planned traffic (demand above the estimate reaches it anyway) routes by the child workers'
  leftover capacity, or evenly when none is left.
- Tables are keyed by worker (the paper), not by the incoming path (the artifact).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


def most_accurate_first(pipeline: Pipeline, replicas: Sequence[Replica], demand_qps: float) -> Routing:
    by_task: dict[str, list[Replica]] = {t.name: [] for t in pipeline.tasks}
    for r in replicas:
        by_task[r.task].append(r)
    for rs in by_task.values():
        rs.sort(key=lambda r: (-r.accuracy, r.worker_id))
    left = {r.worker_id: r.capacity_qps for r in replicas}
    incoming = dict.fromkeys(left, 0.0)
    tables: dict[tuple[int, str], Table] = {}

    def route(source: int, outgoing: float, child: str) -> None:
        workers = by_task[child]
        if not workers:
            return
        entries: dict[int, float] = {}
        total, rest = outgoing, outgoing
        for w in workers:
            if left[w.worker_id] > _EPS and rest > _EPS:
                routed = min(rest, left[w.worker_id])
                entries[w.worker_id] = routed
                rest -= routed
                left[w.worker_id] -= routed
                incoming[w.worker_id] += routed
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
    backups = {t: tuple((r.worker_id, left[r.worker_id]) for r in rs if left[r.worker_id] > _EPS)
               for t, rs in by_task.items()}
    return Routing({r.worker_id: r for r in replicas}, tables, backups, incoming)

