"""The policy interface: how the engine calls a policy, and what it may assume.

A policy is a plain object built from a :class:`~scheduler_sidecar.core.profile.Profile` and its
options; it serves one query type (one logical model). The engine calls::

    decision = policy.decide(now_us, queue, workers)

after every arrival, completion, worker change, load, plan and requested wakeup while the type has
queued queries and some worker of the pool is free (every decision starts a batch, drops or loads
on a free worker), and calls it again until it returns an empty decision, applying each decision
before the next call. ``queue`` is a read-only view of the query type's EDF queue; ``workers``
are the :class:`~scheduler_sidecar.core.records.WorkerState` of the pool's workers that hold one
of the type's models. Several query types share the pool: a worker one type's policy dispatched
to is busy when the next type's policy looks. A policy never sleeps, awaits, reads the clock or
does I/O: the same object runs on simulated and on wall time. ``observe_arrival``,
``observe_completion`` and ``observe_plan`` tell it what happened, for policies that keep state
(their default does nothing).

Routing. A policy that sends each query to one worker's queue (``routes = True``: RAMSIS,
Proteus, Loki) says where in :meth:`Policy.route`; the engine keeps the queue of every worker
(``queue.at(worker_id)``, ``queue.at(None)`` for queries not routed yet) and is the only owner
of queued queries. When a query must go somewhere else (its batch is retried after a worker was
lost, its worker no longer ``keeps`` it after a worker change or a plan, the policy is switched)
the engine asks :meth:`Policy.reroute`. A policy keeps no copy of queued queries, so no order of
cancels, retries, failures and plans can leave its view stale.

Latency comes from ``self.latency`` (:class:`~scheduler_sidecar.core.latency.LatencyTable`),
per (variant, batch size, device kind of the worker); the live driver rescales it in place.

How the other systems fit:

- **RAMSIS** (per-worker queues, MDP lookup): routes each arrival round-robin, and in ``decide``
  looks up a free worker's (queue length, head slack).
- **Proteus / Loki** (periodic plans plus per-query routing): a :class:`~scheduler_sidecar.core.plan.Planner`
  places variants on workers; ``observe_plan`` hands its routing to the policy, which routes
  queries to workers by it and returns ``wakeup_us`` for an adaptive-batching timeout; early
  dropping is ``Decision.dropped`` (or :data:`~scheduler_sidecar.core.records.DROP` from ``route``);
  a policy may also load and unload models itself.
- **Pipelines and cascades**: a batch's result creates follow-up queries (the next stage, an
  escalation) of another query type; a dispatch may carry per-batch settings in ``Dispatch.params``.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from typing import ClassVar, Generic, Protocol, TypeVar

from scheduler_sidecar.core.latency import LatencyTable
from scheduler_sidecar.core.plan import Plan
from scheduler_sidecar.core.profile import Profile, Variant
from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import EMPTY, Decision, Dispatch, Drop, Query, QueryRecord, WorkerState
from scheduler_sidecar.errors import ConfigError


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
    # options that name files on the sidecar's machine: an operator's, set in the config file, never
    # over the network (the admin switch refuses them)
    file_options: ClassVar[frozenset[str]] = frozenset()
    # True: every query goes to one worker's queue, where route() says (see the module docstring)
    routes: ClassVar[bool] = False
    # what the paper does with late queries, where it differs from the project's default (``accscale simulate``
    # follows the paper unless told otherwise; the sidecar keeps the default)
    paper_late_queries: ClassVar[LateQueries | None] = None

    def __init__(self, profile: Profile, *, device: str | None = None,
                 late_queries: LateQueries | str = LateQueries.DROP, overhead_us: int = 0) -> None:
        self.profile = profile
        # the device kind offline choices are made for (RAMSIS' MDPs); decide() reads each worker's own
        self.device = device or profile.device_kinds[0]
        if self.device not in profile.device_kinds:
            raise ConfigError(f"profile {profile.name!r} has no latency for device {self.device!r}; "
                              f"it has {list(profile.device_kinds)}")
        self.latency = LatencyTable(profile)
        self.late_queries = LateQueries(late_queries)
        # Ambiguity (digest A5, A22): slack = deadline - now - overhead_us, where overhead_us
        # covers dispatch and RPC time the profile does not include (0 in simulation).
        if isinstance(overhead_us, bool) or not isinstance(overhead_us, int) or overhead_us < 0:
            raise ConfigError(f"overhead_us must be a whole number of microseconds >= 0, got {overhead_us!r}")
        self.overhead_us = overhead_us

    @abc.abstractmethod
    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        """Return what to do now: at most the dispatches that free workers can take."""

    def route(self, now_us: int, query: Query, queue: QueueView, workers: Sequence[WorkerState]) -> int | Drop | None:
        """A routing policy's choice for an arriving query: a worker id, None to hold it until a worker can take it,
        or DROP. ``queue`` holds the queries queued so far (``queue.at(worker_id)``)."""
        raise NotImplementedError(f"{self.name} routes but has no route()")

    def reroute(self, now_us: int, query: Query, queue: QueueView,
                workers: Sequence[WorkerState]) -> int | Drop | None:
        """Where a queued query goes when its worker no longer keeps it, or its batch is retried; as an arrival by
        default."""
        return self.route(now_us, query, queue, workers)

    def keeps(self, worker: WorkerState) -> bool:
        """Whether the queries routed to ``worker`` stay there (asked after worker changes and plans)."""
        return worker.healthy

    def observe_arrival(self, now_us: int, query: Query) -> None:
        """A query was queued."""

    def observe_completion(self, now_us: int, records: Sequence[QueryRecord]) -> None:
        """A batch finished (its queries met or missed their deadlines)."""

    def observe_plan(self, now_us: int, plan: Plan) -> None:
        """A new plan is in force (its placement is being carried out)."""

    def latency_us(self, variant: Variant, batch_size: int, device: str | None = None) -> int:
        return self.latency.us(variant.id, batch_size, device or self.device)

    def quickest_us(self, device: str | None = None) -> int:
        """The quickest option on ``device``: some variant at batch 1."""
        return min(self.latency_us(v, 1, device) for v in self.profile.variants)

    def slack_us(self, now_us: int, query: Query) -> int:
        return query.deadline_us - now_us - self.overhead_us

    def drop_or_serve(self, now_us: int, queue: QueueView, fastest_us: int) -> Decision | None:
        """With DROP, drop every head query whose slack is below ``fastest_us``; None if the head is fine."""
        if self.late_queries is LateQueries.SERVE:
            return None
        return self.drop_below(now_us, queue, fastest_us)

    def drop_below(self, now_us: int, queue: QueueView, floor_us: int) -> Decision | None:
        """Drop the head queries whose slack is below ``floor_us`` (the EDF head up to the first above it)."""
        dropped = []
        for query in queue.scan():
            if self.slack_us(now_us, query) >= floor_us:
                break
            dropped.append(query.id)
        return Decision(dropped=tuple(dropped)) if dropped else None


class Menu(Protocol):
    """A head-slack policy's options on one device kind, derived from the latency table."""

    fastest_us: int  # latency of the quickest option

    def choose(self, slack_us: int) -> tuple[str, int] | None:
        """(variant id, batch size) within ``slack_us``; None if no option fits."""

    def fastest(self) -> tuple[str, int]:
        """The quickest option, used when LateQueries.SERVE runs a query no option fits."""


M = TypeVar("M", bound=Menu)


class HeadSlackPolicy(Policy, Generic[M]):
    """A policy that decides from the earliest-deadline query's slack alone (SuperServe A.4).

    On the first free worker: drop what cannot make it (per ``late_queries``), then run the
    menu's choice for the slack on that many earliest-deadline queries. Subclasses build the
    menu of one device kind (:meth:`build_menu`); it is cached until the latency table changes.
    """

    def __init__(self, profile: Profile, **options) -> None:
        super().__init__(profile, **options)
        self._menus: dict[str, tuple[int, M]] = {}  # device kind -> (latency table version, menu)

    @abc.abstractmethod
    def build_menu(self, device: str) -> M:
        """The options on ``device`` from ``self.latency``."""

    def menu(self, device: str | None = None) -> M:
        device = device or self.device
        cached = self._menus.get(device)
        if cached is None or cached[0] != self.latency.version:
            cached = self._menus[device] = (self.latency.version, self.build_menu(device))
        return cached[1]

    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        if not queue:
            return EMPTY
        worker = next((w for w in workers if w.is_free), None)
        if worker is None:
            return EMPTY
        menu = self.menu(worker.device)
        dropped = self.drop_or_serve(now_us, queue, menu.fastest_us)
        if dropped:
            return dropped
        variant_id, batch_size = menu.choose(self.slack_us(now_us, queue.peek())) or menu.fastest()
        ids = tuple(q.id for q in queue.head(batch_size))
        return Decision((Dispatch(worker.id, variant_id, ids),))


__all__ = ["EMPTY", "HeadSlackPolicy", "LateQueries", "Menu", "Policy"]
