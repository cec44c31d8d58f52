"""Plans: what a periodic planner (Proteus' and Loki's MILPs) decides for the whole pool.

A :class:`Planner` is a plain object like a policy: it never sleeps, does I/O or reads the clock.
The engine counts arrivals per query type and asks for a plan every ``period_us`` and whenever
``observe_arrival`` says a burst needs one. The simulator solves inline (and records how long
the solve took); the live sidecar solves in a thread, so a long solve never blocks requests,
and hands the plan to the engine when it is done. The engine moves each worker to the plan's
placement make before break: a model the worker lacks is loaded while it keeps serving what it
holds, and what the plan no longer wants is unloaded between two batches once the new model is
in. It gives the plan to every policy, which routes by it.

Several planners may share one pool (a deployment serving several systems at once): each has a
:class:`Scope`, the query types it plans and the workers it owns. It counts only its types' arrivals,
sees only its workers, places only on them, and its plans go only to its types' policies.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler_sidecar.core.records import Query, WorkerState


@dataclass(frozen=True, slots=True)
class Demand:
    """Arrivals per query type observed since the previous plan."""

    since_us: int
    until_us: int
    arrivals: Mapping[str, int]  # query type -> queries that arrived in [since_us, until_us)
    workers: tuple[WorkerState, ...] = ()  # the pool as the engine sees it when the plan is asked for

    def rate_qps(self, query_type: str) -> float:
        span_us = self.until_us - self.since_us
        return self.arrivals.get(query_type, 0) * 1e6 / span_us if span_us > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Plan:
    created_us: int
    # worker id -> the Triton models it should hold; workers not named keep what they have
    placement: Mapping[int, frozenset[str]] = field(default_factory=dict)
    detail: object = None  # what the policies route by (e.g. per-type worker weights); the planner's own type
    # Triton model -> the instances each worker should run (Loki's replicas); models not named keep theirs
    instances: Mapping[str, int] = field(default_factory=dict)
    # worker id -> Triton model -> the instances that worker's server should run, where they differ from
    # ``instances`` (HybridServe's placement: its servers hold different counts); every worker of a server alike
    server_instances: Mapping[int, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Scope:
    """What one planner plans: its query types and the workers it owns (None: every one)."""

    types: frozenset[str] | None = None
    workers: frozenset[int] | None = None

    def has_type(self, name: str) -> bool:
        return self.types is None or name in self.types

    def has_worker(self, worker_id: int) -> bool:
        return self.workers is None or worker_id in self.workers


class Planner(abc.ABC):
    """How the engine calls a planner; see the module docstring."""

    period_us: int  # plan at least this often
    scope: Scope = Scope()  # the whole pool, unless the deployment gives it a part (see the module docstring)

    @abc.abstractmethod
    def plan(self, now_us: int, demand: Demand) -> Plan:
        """The plan for the demand seen; may take long (it runs off the event loop live)."""

    def observe_arrival(self, now_us: int, query: Query) -> bool:
        """A query arrived; return True to ask for a plan now (a burst), on top of the period."""
        return False
