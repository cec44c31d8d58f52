"""Loki's replicas over several Triton servers: which server runs how many instances of each variant.

Loki's resource manager plans one cluster of S workers (§4.2); live, the cluster is the Triton servers' instance
slots, each server's budget summed. A frame's stages run in its server's BLS model, which calls only that
server's models, so a server that serves must hold every task.

Decision: the MILP plans the whole cluster, as the paper's resource manager does (:func:`deal` then only places
its replicas). They go to the fewest servers whose budgets hold them (hardware scaling across servers: a server
left out holds no variant), each task's replicas spread evenly over those, most accurate first. A server left
without some task (the task has fewer replicas than there are servers serving) gets one replica of the task's
most accurate planned variant, in a free slot of its budget or, where it has none, in place of a replica of the
task it holds most of: a deviation from the MILP's counts, which the plan's per-server counts show. Each server's
load-balancer tables are Loki's own (most accurate first, :func:`.routing.most_accurate_first`) over its replicas,
at its share of the demand: its root task's capacity over the whole cluster's (the sidecar sends frames to
whichever server has a free BLS slot, so each gets frames as fast as it finishes them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from scheduler_sidecar.systems.loki.milp import Allocation
from scheduler_sidecar.systems.loki.pipeline import Pipeline
from scheduler_sidecar.systems.loki.routing import Replica, Routing, most_accurate_first


def deal(allocations: Sequence[Allocation], servers: Sequence[str], budget: int) -> dict[str, dict[str, int]]:
    """Server -> variant -> instances, for the servers that serve (see the module notes); ``servers`` in the order
    they are preferred, each with ``budget`` instance slots."""
    if not allocations or not servers:
        return {}
    used = sum(a.replicas for a in allocations)
    serving = list(servers[:min(len(servers), max(1, -(-used // budget)))])
    task_of = {a.variant: a.task for a in allocations}
    accuracy = {a.variant: a.accuracy for a in allocations}
    tasks = list(dict.fromkeys(a.task for a in allocations))
    held: dict[str, Counter[str]] = {s: Counter() for s in serving}

    def on(server: str, task: str) -> int:
        return sum(n for v, n in held[server].items() if task_of[v] == task)

    ranked = sorted(allocations, key=lambda a: (tasks.index(a.task), -a.accuracy, a.variant))
    for a in ranked:
        for _ in range(a.replicas):
            s = min(serving, key=lambda s: (on(s, a.task), sum(held[s].values()), serving.index(s)))
            held[s][a.variant] += 1
    best = {}  # task -> its most accurate planned variant
    for a in ranked:
        best.setdefault(a.task, a.variant)
    for s in serving:
        for task in tasks:
            if on(s, task):
                continue
            if sum(held[s].values()) >= budget:  # full: some task has two here (budget >= the tasks)
                most = max(tasks, key=lambda t: (on(s, t), -tasks.index(t)))
                least = min((v for v, n in held[s].items() if n > 0 and task_of[v] == most), key=accuracy.get)
                held[s][least] -= 1
            held[s][best[task]] += 1
    return {s: {v: n for v, n in c.items() if n > 0} for s, c in held.items()}


def routings(pipeline: Pipeline, allocations: Sequence[Allocation], dealt: Mapping[str, Mapping[str, int]],
             demand_qps: float, *, utilisation: float) -> dict[str, Routing]:
    """Each serving server's load-balancer tables over its own replicas, at its share of ``demand_qps``."""
    by_variant = {a.variant: a for a in allocations}
    replicas: dict[str, list[Replica]] = {}
    for server, counts in dealt.items():
        own = replicas[server] = []
        for variant, n in counts.items():
            a = by_variant[variant]
            own.extend(Replica(len(own), a.task, variant, a.batch, a.batch_ms, a.capacity_qps, a.accuracy)
                       for _ in range(n))
    root = pipeline.root.name
    capacity = {s: sum(r.capacity_qps for r in rs if r.task == root) for s, rs in replicas.items()}
    whole = sum(capacity.values()) or 1.0
    return {s: most_accurate_first(pipeline, rs, demand_qps * capacity[s] / whole, utilisation=utilisation)
            for s, rs in replicas.items()}


__all__ = ["deal", "routings"]
