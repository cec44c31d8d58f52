"""Admission: whether a query that arrives is queued or refused at once, with the error that says why.

Refused: a type with no healthy worker, a full queue, a client's SLO below the quickest option on any worker, and,
for a type that asks for it (``TypeLimits.admission``), a query that the queries queued ahead of it already make
infeasible. Under sustained overload an EDF queue otherwise grows until every query in it waits almost its whole
SLO, and nearly all end late or dropped after they queued (issue 26: 3.6% of capacity met at 3x load); refused at
once, a client can try elsewhere, and the queries admitted are the ones that can make it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler_sidecar.core.records import Query
from scheduler_sidecar.core.worker_table import WorkerTable
from scheduler_sidecar.errors import Overloaded, RequestError, SloInfeasible, Unavailable

if TYPE_CHECKING:  # the engine's record of a type; the engine imports this module
    from scheduler_sidecar.core.engine import QueryType

CAPACITY_CACHE = 4096  # cached (type, device, latency version, slack) bounds before the cache starts again


class Admission:
    """See the module docstring; it reads the worker table and the types' policies, and changes neither."""

    def __init__(self, table: WorkerTable) -> None:
        self.table = table
        self._quickest: dict[str, tuple[int, int]] = {}  # query type -> (latency version, quickest us)
        # (query type, device kind, latency version, slack in ms) -> queries one worker can serve in that slack
        self._capacity: dict[tuple[str, str, int, int], int] = {}

    def refusal(self, qt: QueryType, query: Query) -> RequestError | None:
        """Why ``query`` is refused on arrival, or None to queue it."""
        if not self.table.view(qt.name, qt.model_set)[1]:
            return Unavailable("no healthy worker")
        limit = qt.limits.queue_limit
        if limit is not None and len(qt.queue) >= limit:
            return Unavailable(f"queue full ({limit} requests queued)")
        if query.stage == 0:  # a client's SLO below the quickest option on any worker cannot be met
            cached = self._quickest.get(qt.name)  # quickest_us(), inline: it is asked on every arrival
            quickest = cached[1] if cached is not None and cached[0] == qt.policy.latency.version else \
                self.quickest_us(qt)
            if query.deadline_us - query.arrival_us < quickest:
                return SloInfeasible(f"slo_us {query.deadline_us - query.arrival_us} is below the fastest variant's "
                                     f"batch-1 latency ({quickest} us): no variant can meet it")
            if qt.limits.admission and qt.queue:
                return self._infeasible(qt, query)
        return None

    def _infeasible(self, qt: QueryType, query: Query) -> RequestError | None:
        """Refuse a query that the queries queued ahead of it (earlier deadlines) already make infeasible.

        The bound is optimistic, so that only a query no schedule could serve is refused: every healthy
        worker of the type starts at once (the batches running now are ignored) and runs, back to back,
        the option (variant, batch size) that serves the most queries by the deadline.
        """
        slack_us = query.deadline_us - query.arrival_us
        if query.deadline_us >= qt.latest_deadline_us:
            ahead = len(qt.queue)  # the usual case (one SLO): every queued query is ahead
        else:
            ahead = qt.queue.count_due_by(query.deadline_us)
        capacity = sum(n * self._served_within(qt, device, slack_us)
                       for device, n in self.table.devices(qt.name, qt.model_set).items())
        if ahead < capacity:
            return None
        return Overloaded(f"{ahead} requests are queued ahead of this one, and the workers can serve at most "
                          f"{capacity} in its slo_us of {slack_us}: it cannot be met")

    def _served_within(self, qt: QueryType, device: str, slack_us: int) -> int:
        """The most queries one worker of ``device`` can finish within ``slack_us``, or a little more (cached per
        millisecond, rounded up, so that the bound stays optimistic)."""
        latency = qt.policy.latency
        window_ms = -(-slack_us // 1000)
        key = (qt.name, device, latency.version, window_ms)
        served = self._capacity.get(key)
        if served is None:
            window_us = window_ms * 1000
            served = max((b * (window_us // us) for v in qt.policy.profile.variants if device in v.latency
                          for b in v.latency[device].batch_sizes
                          if 0 < (us := latency.us(v.id, b, device)) <= window_us), default=0)
            if len(self._capacity) > CAPACITY_CACHE:  # many SLOs or latency versions: start again
                self._capacity.clear()
            self._capacity[key] = served
        return served

    def quickest_us(self, qt: QueryType) -> int:
        """The quickest option of a query type on any device kind in the pool (batch 1)."""
        version = qt.policy.latency.version
        cached = self._quickest.get(qt.name)
        if cached is None or cached[0] != version:
            devices = {w.device for w in self.table.workers} or {qt.policy.device}
            cached = self._quickest[qt.name] = (version, min(qt.policy.quickest_us(d) for d in devices))
        return cached[1]

    def forget(self, name: str) -> None:
        """A type's policy changed."""
        self._quickest.pop(name, None)


__all__ = ["Admission"]
