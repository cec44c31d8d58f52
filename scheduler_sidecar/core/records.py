"""The records a policy sees and returns, the EDF queue, and the bookkeeping both drivers share.

Time is integer microseconds everywhere in the core (clients send ``slo_us``). A policy reads
``now_us``, a :class:`QueueView` and the :class:`WorkerState` of every worker, and returns a
:class:`Decision`; :func:`apply` carries a decision out on the queue and the workers, the
same way in the simulator and in the live sidecar.
"""

from __future__ import annotations

import bisect
import enum
import heapq
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, MutableSequence


class PolicyError(RuntimeError):
    """A decision that cannot be carried out (a bug in the policy, not bad input)."""


@dataclass(frozen=True, slots=True, order=True)
class Query:
    """One single-sample request; ordered by (deadline, seq) for EDF with a stable tie-break."""

    deadline_us: int
    seq: int  # arrival order; breaks deadline ties deterministically
    id: int
    arrival_us: int


class Outcome(enum.Enum):
    MET = "met"  # answered by its deadline
    LATE = "late"  # answered after its deadline
    DROPPED = "dropped"  # a policy gave up on it (its slack was gone)
    REJECTED = "rejected"  # refused on arrival (queue full, SLO below the fastest variant)
    FAILED = "failed"  # its worker failed and it could not be retried


@dataclass(frozen=True, slots=True)
class QueryRecord:
    """How one query ended; every query produces exactly one."""

    query_id: int
    arrival_us: int
    deadline_us: int
    finish_us: int  # answer or drop time
    outcome: Outcome
    variant_id: str | None = None  # None unless served
    accuracy: float | None = None  # profiled accuracy of the variant that served it
    batch_size: int = 0


@dataclass(frozen=True, slots=True)
class WorkerState:
    """What a policy may know about a worker; drivers replace it when it changes."""

    id: int
    busy_until_us: int | None = None  # expected completion of the running batch; None when idle
    healthy: bool = True
    device: str = "cpu"  # latency curve of the profile to use for this worker

    @property
    def is_free(self) -> bool:
        return self.healthy and self.busy_until_us is None


@dataclass(frozen=True, slots=True)
class Dispatch:
    worker_id: int
    variant_id: str  # profile variant: control row, model name or pipeline path
    query_ids: tuple[int, ...]  # EDF order; len() is the batch size
    params: tuple[tuple[str, object], ...] = ()  # per-batch settings for the worker (cascade thresholds, budgets)


@dataclass(frozen=True, slots=True)
class Decision:
    dispatches: tuple[Dispatch, ...] = ()
    dropped: tuple[int, ...] = ()  # query ids given up on (their slack was gone)
    wakeup_us: int | None = None  # call decide() again at this time even if nothing happens

    @property
    def is_empty(self) -> bool:
        return not self.dispatches and not self.dropped


EMPTY = Decision()


class EdfQueue:
    """Earliest-deadline-first queue: a heap plus a small sorted front.

    ``head(n)`` moves the n earliest queries from the heap into the sorted front, so a policy
    can look at the next batch in O(n log N) without popping, and removing that batch is a
    slice of the front. Removal of other queries (a client that left) is lazy.
    """

    def __init__(self) -> None:
        self._heap: list[Query] = []
        self._front: list[Query] = []  # sorted; every query here precedes every query in the heap
        self._removed: set[int] = set()
        self._by_id: dict[int, Query] = {}
        self._view = QueueView(self)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, query_id: int) -> bool:
        return query_id in self._by_id

    def push(self, query: Query) -> None:
        if query.id in self._by_id:
            raise PolicyError(f"query {query.id} is already queued")
        self._by_id[query.id] = query
        if self._front and query < self._front[-1]:
            bisect.insort(self._front, query)
        else:
            heapq.heappush(self._heap, query)

    def _fill(self, n: int) -> None:
        front, heap, removed = self._front, self._heap, self._removed
        while len(front) < n and heap:
            q = heapq.heappop(heap)
            if q.id in removed:
                removed.discard(q.id)
            else:
                front.append(q)

    def peek(self) -> Query:
        self._fill(1)
        if not self._front:
            raise IndexError("peek from an empty queue")
        return self._front[0]

    def scan(self) -> Iterator[Query]:
        """Queries in EDF order, fetched lazily; do not modify the queue while scanning."""
        i = 0
        while True:
            self._fill(i + 1)
            if i >= len(self._front):
                return
            yield self._front[i]
            i += 1

    def head(self, n: int) -> list[Query]:
        """The ``n`` earliest-deadline queries (fewer if the queue is shorter), not removed."""
        self._fill(n)
        return self._front[:n]

    def remove(self, query_ids: Iterable[int]) -> list[Query]:
        """Remove queued queries by id and return them; unknown ids raise PolicyError."""
        ids = list(query_ids)
        out = []
        for qid in ids:
            query = self._by_id.pop(qid, None)
            if query is None:
                raise PolicyError(f"query {qid} is not queued")
            out.append(query)
        k = len(ids)
        if self._front[:k] and [q.id for q in self._front[:k]] == ids:
            del self._front[:k]  # the usual case: a policy took the head of the queue
        else:
            gone = set(ids)
            kept = [q for q in self._front if q.id not in gone]
            self._removed.update(gone - {q.id for q in self._front})
            self._front = kept
        return out

    def view(self) -> "QueueView":
        return self._view

    def discard(self, query_id: int) -> Query | None:
        """Remove a query if it is still queued (e.g. its client disconnected)."""
        return self.remove([query_id])[0] if query_id in self._by_id else None


@dataclass(frozen=True, slots=True)
class Batch:
    """A dispatch carried out: its queries left the queue and its worker is busy."""

    dispatch: Dispatch
    queries: tuple[Query, ...]
    start_us: int
    expected_latency_us: int


class QueueView:
    """What a policy sees of the EDF queue: read-only access in deadline order."""

    __slots__ = ("_queue",)

    def __init__(self, queue: EdfQueue) -> None:
        self._queue = queue

    def __len__(self) -> int:
        return len(self._queue)

    def peek(self) -> Query:
        """The earliest-deadline query; IndexError when empty."""
        return self._queue.peek()

    def head(self, n: int) -> list[Query]:
        """The ``n`` earliest-deadline queries (fewer if the queue is shorter)."""
        return self._queue.head(n)

    def scan(self) -> Iterator[Query]:
        """All queries in deadline order, fetched lazily."""
        return self._queue.scan()


def apply(decision: Decision, queue: EdfQueue, workers: MutableSequence[WorkerState], now_us: int,
          latency_us: Callable[[str, int], int]) -> tuple[list[Batch], list[Query]]:
    """Carry out ``decision``: take its queries off the queue and mark its workers busy.

    ``latency_us(variant_id, batch_size)`` is how long the driver expects the batch to take
    (a sample in the simulator, the profiled latency in the sidecar). Returns the batches
    and the dropped queries.
    """
    batches = []
    for d in decision.dispatches:
        index = _worker_index(workers, d.worker_id)
        if not workers[index].is_free:
            raise PolicyError(f"worker {d.worker_id} is not free")
        if not d.query_ids:
            raise PolicyError(f"empty batch for worker {d.worker_id}")
        queries = tuple(queue.remove(d.query_ids))
        expected = latency_us(d.variant_id, len(queries))
        workers[index] = replace(workers[index], busy_until_us=now_us + expected)
        batches.append(Batch(d, queries, now_us, expected))
    return batches, queue.remove(decision.dropped)


def _worker_index(workers: MutableSequence[WorkerState], worker_id: int) -> int:
    for i, w in enumerate(workers):
        if w.id == worker_id:
            return i
    raise PolicyError(f"no worker {worker_id}")
