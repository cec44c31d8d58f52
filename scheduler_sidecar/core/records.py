"""The records that cross the engine's boundaries: queries, outcomes, worker states, decisions, batches.

Time is integer microseconds everywhere in the core (clients send ``slo_us``). A policy reads
``now_us``, a queue view and the :class:`WorkerState` of every worker it may use, and returns a
:class:`Decision`; the engine carries it out and records exactly one :class:`QueryRecord` per query.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from scheduler_sidecar.errors import AccscaleError, PolicyError

__all__ = ["Batch", "BatchResult", "DROP", "Decision", "Dispatch", "Drop", "EMPTY", "Load", "Outcome", "PolicyError",
           "Query", "QueryRecord", "Unload", "WorkerState"]


@dataclass(frozen=True, slots=True, order=True)
class Query:
    """One single-sample request; ordered by (deadline, seq) for EDF with a stable tie-break."""

    deadline_us: int
    seq: int  # arrival order; breaks deadline ties deterministically
    id: int
    arrival_us: int
    type: str = field(default="", compare=False)  # query type: the logical model the client called
    parent: int | None = field(default=None, compare=False)  # the query whose result created this one
    stage: int = field(default=0, compare=False)  # 0 for a client's query; +1 per follow-up step


class Outcome(enum.Enum):
    MET = "met"  # answered by its deadline
    LATE = "late"  # answered after its deadline
    DROPPED = "dropped"  # a policy gave up on it (its slack was gone)
    REJECTED = "rejected"  # refused on arrival (queue full, SLO below the fastest option, no worker)
    FAILED = "failed"  # its worker failed and it could not be retried, or the worker answered an error
    CANCELLED = "cancelled"  # its client left while it was queued


class QueryRecord(NamedTuple):
    """How one query ended; every query produces exactly one (a named tuple: one is made per query, and a tuple is
    made three times quicker than a frozen dataclass, which the simulator's speed feels)."""

    query_id: int
    arrival_us: int
    deadline_us: int
    finish_us: int  # answer, drop or refusal time
    outcome: Outcome
    variant_id: str | None = None  # None unless served: the variant that actually served it
    accuracy: float | None = None  # profiled accuracy of that variant
    batch_size: int = 0
    query_type: str = ""
    parent: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerState:
    """What a policy may know about a worker; the engine replaces it when it changes."""

    id: int
    busy_until_us: int | None = None  # expected completion of the running batch; None when idle
    healthy: bool = True
    device: str = "cpu"  # device kind: which latency curve of a profile applies
    # Triton models loaded on it (a supernet model makes all its subnets resident); None: every model
    resident: frozenset[str] | None = None
    loading_model: str | None = None  # the model a load in progress brings; it serves nothing until then
    loading_until_us: int | None = None  # expected end of that load
    # a model a plan is loading beside the ones the worker keeps serving (make before break); it joins
    # ``resident`` when the load completes, and what the plan no longer wants leaves only then
    staging_model: str | None = None

    @property
    def is_free(self) -> bool:
        return self.healthy and self.busy_until_us is None and self.loading_until_us is None

    def holds(self, model: str) -> bool:
        return self.resident is None or model in self.resident


@dataclass(frozen=True, slots=True)
class Dispatch:
    worker_id: int
    variant_id: str  # profile variant: control row, model name or pipeline path
    query_ids: tuple[int, ...]  # EDF order; len() is the batch size
    params: tuple[tuple[str, object], ...] = ()  # per-batch settings for the worker (cascade thresholds, budgets)


class Drop(enum.Enum):
    """A routing policy's answer for a query it gives up on as it arrives (Loki's early dropping)."""

    DROP = "drop"


DROP = Drop.DROP


@dataclass(frozen=True, slots=True)
class Load:
    """Load a Triton model on a worker; it serves nothing until the load completes."""

    worker_id: int
    model: str


@dataclass(frozen=True, slots=True)
class Unload:
    worker_id: int
    model: str


@dataclass(frozen=True, slots=True)
class Decision:
    dispatches: tuple[Dispatch, ...] = ()
    dropped: tuple[int, ...] = ()  # query ids given up on (their slack was gone)
    wakeup_us: int | None = None  # call decide() again at this time even if nothing happens
    loads: tuple[Load, ...] = ()
    unloads: tuple[Unload, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (self.dispatches or self.dropped or self.loads or self.unloads)


EMPTY = Decision()


@dataclass(frozen=True, slots=True)
class Batch:
    """A dispatch carried out: its queries left the queue and its worker is busy."""

    dispatch: Dispatch
    queries: tuple[Query, ...]
    start_us: int
    expected_latency_us: int  # what the policy's latency table says it takes on this worker
    device: str
    # variant id -> accuracy, of the profile of the policy that dispatched it (a switch may come before it ends)
    accuracy: Mapping[str, float] = field(default_factory=dict)

    @property
    def worker_id(self) -> int:
        return self.dispatch.worker_id

    @property
    def variant_id(self) -> str:
        return self.dispatch.variant_id

    @property
    def query_ids(self) -> tuple[int, ...]:
        return self.dispatch.query_ids


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What a worker did with a batch: by default the dispatched variant served every query."""

    # query id -> the variant that actually served it, where a worker chose (a cascade that stopped early)
    served_by: Mapping[int, str] = field(default_factory=dict)
    # query id -> the driver's payload for its answer (live: the query's output rows)
    outputs: Mapping[int, object] = field(default_factory=dict)
    # new queries this batch created: a pipeline's next stage, a cascade's escalation
    follow_ups: tuple[Query, ...] = ()
    # query id -> why the worker could not serve that query alone (the rest of the batch was served)
    failed: Mapping[int, AccscaleError] = field(default_factory=dict)
