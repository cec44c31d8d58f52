"""The policy interface: how the drivers call a policy, and what it may assume.

A policy is a plain object built from a :class:`~scheduler_sidecar.core.profile.Profile` and its
options. Drivers (the discrete-event simulator and the live sidecar) call::

    decision = policy.decide(now_us, queue, workers)

after every arrival, every completion and every requested wakeup, and call it again until
it returns an empty decision, applying each decision (:func:`scheduler_sidecar.core.records.apply`)
before the next call. ``queue`` is a read-only view of the global EDF queue;
``workers`` are :class:`~scheduler_sidecar.core.records.WorkerState` records. A policy never sleeps,
awaits, reads the clock or does I/O: the same object runs on simulated and on wall time.
``observe_arrival`` and ``observe_completion`` tell it what happened, for policies that
keep statistics (their default does nothing).

How the other systems fit without changing this interface:

- **RAMSIS** (per-worker queues, MDP lookup): the policy routes each arrival round-robin to
  a worker in ``observe_arrival`` and keeps those per-worker assignments itself; its load
  monitor counts arrivals there too (the window is measured in the ``now_us`` it is given).
  In ``decide`` it looks up (queue length, head slack) of a free worker's own queries in
  the MDP table of the current load and dispatches only those query ids.
- **Proteus / Loki** (periodic plans plus per-query routing): ``decide`` re-plans when
  ``now_us`` crosses a period boundary (the MILP runs inside, on the counts it observed),
  returns ``wakeup_us`` for the next boundary or adaptive-batching timeout, and routes
  queries to workers according to the plan; early dropping is ``Decision.dropped``.
- **Cascades** (HybridServe) and **pipelines** (Loki): a dispatch names a cascade or
  pipeline variant and carries its thresholds or per-stage budgets in ``Dispatch.params``;
  the BLS model in Triton enforces them.
"""

from __future__ import annotations

import abc
import enum
from typing import ClassVar, Sequence

from scheduler_sidecar.core.records import EMPTY, Decision, Dispatch, QueueView, Query, QueryRecord, WorkerState
from scheduler_sidecar.core.profile import Profile, Variant


class LateQueries(str, enum.Enum):
    """What a policy does with queries that no option can serve by their deadline."""

    # Ambiguity (digest A6): the paper does not say. Chosen default: DROP, because the
    # optimum SlackFit approximates (the ZILP of Eq. 1) simply leaves such queries unserved,
    # and serving them late spends capacity that queries behind them could still use.
    DROP = "drop"
    SERVE = "serve"  # serve them anyway with the fastest option


class Policy(abc.ABC):
    """Base class; subclasses implement :meth:`decide` (see the module docstring)."""

    name: ClassVar[str]

    def __init__(self, profile: Profile, *, device: str | None = None,
                 late_queries: LateQueries | str = LateQueries.DROP, overhead_us: int = 0) -> None:
        self.profile = profile
        self.device = device or profile.device_kinds[0]
        if self.device not in profile.device_kinds:
            raise ValueError(f"profile {profile.name!r} has no latency for device {self.device!r}; "
                             f"it has {list(profile.device_kinds)}")
        self.late_queries = LateQueries(late_queries)
        # Ambiguity (digest A5, A22): slack = deadline - now - overhead_us, where overhead_us
        # covers dispatch and RPC time the profile does not include (0 in simulation).
        self.overhead_us = overhead_us

    @abc.abstractmethod
    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        """Return what to do now: at most the dispatches that free workers can take."""

    def observe_arrival(self, now_us: int, query: Query) -> None:
        """A query was queued."""

    def observe_completion(self, now_us: int, records: Sequence[QueryRecord]) -> None:
        """A batch finished (its queries met or missed their deadlines)."""

    def latency_us(self, variant: Variant, batch_size: int) -> int:
        return round(variant.latency[self.device].p50_at(batch_size) * 1000)

    def slack_us(self, now_us: int, query: Query) -> int:
        return query.deadline_us - now_us - self.overhead_us

    def drop_or_serve(self, now_us: int, queue: QueueView, fastest_us: int) -> Decision | None:
        """With DROP, drop every head query whose slack is below ``fastest_us``; None if the head is fine."""
        if self.late_queries is LateQueries.SERVE:
            return None
        dropped = []
        for query in queue.scan():
            if self.slack_us(now_us, query) >= fastest_us:
                break
            dropped.append(query.id)
        return Decision(dropped=tuple(dropped)) if dropped else None


class HeadSlackPolicy(Policy):
    """A policy that decides from the earliest-deadline query's slack alone (SuperServe A.4).

    On the first free worker: drop what cannot make it (per ``late_queries``), then run
    ``choose(slack_us)`` on that many earliest-deadline queries. Subclasses set
    ``fastest_us`` (their quickest option) and implement ``choose``.
    """

    fastest_us: int

    @abc.abstractmethod
    def choose(self, slack_us: int) -> tuple[str, int] | None:
        """(variant id, batch size) within ``slack_us``; None if no option fits."""

    @abc.abstractmethod
    def fastest(self) -> tuple[str, int]:
        """The quickest option, used when LateQueries.SERVE runs a query no option fits."""

    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        worker = next((w for w in workers if w.is_free), None)
        if worker is None or not queue:
            return EMPTY
        dropped = self.drop_or_serve(now_us, queue, self.fastest_us)
        if dropped:
            return dropped
        variant_id, batch_size = self.choose(self.slack_us(now_us, queue.peek())) or self.fastest()
        ids = tuple(q.id for q in queue.head(batch_size))
        return Decision((Dispatch(worker.id, variant_id, ids),))


__all__ = ["EMPTY", "HeadSlackPolicy", "LateQueries", "Policy"]
