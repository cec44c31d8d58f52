"""The earliest-deadline-first queue, the per-worker queues of a query type whose policy routes, and the
read-only views of them that policies get."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator

from scheduler_sidecar.core.records import Query
from scheduler_sidecar.errors import PolicyError


class EdfQueue:
    """Earliest-deadline-first queue: a heap plus a small sorted front.

    ``head(n)`` moves the n earliest queries from the heap into the sorted front, so a policy
    can look at the next batch in O(n log N) without popping, and removing that batch is a
    slice of the front. Removal of other queries (a client that left) is lazy.
    """

    def __init__(self) -> None:
        # (deadline, seq, query): tuples compare in C, far quicker than the dataclass's generated ordering
        self._heap: list[tuple[int, int, Query]] = []
        self._front: list[Query] = []  # sorted; every query here precedes every query in the heap
        # query id -> its heap entries to skip: a query removed from the heap lazily and queued again (a retry)
        # has two entries there, and removed again, two to skip
        self._removed: dict[int, int] = {}
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
            heapq.heappush(self._heap, (query.deadline_us, query.seq, query))

    def _fill(self, n: int) -> None:
        front, heap, removed = self._front, self._heap, self._removed
        while len(front) < n and heap:
            q = heapq.heappop(heap)[2]
            if q.id in removed:
                if removed[q.id] == 1:
                    del removed[q.id]
                else:
                    removed[q.id] -= 1
            else:
                front.append(q)

    def peek(self) -> Query:
        self._fill(1)
        if not self._front:
            raise IndexError("peek from an empty queue")
        return self._front[0]

    def count_due_by(self, deadline_us: int) -> int:
        """How many queued queries have a deadline no later than ``deadline_us`` (in O(n), the order untouched)."""
        return sum(1 for q in self._by_id.values() if q.deadline_us <= deadline_us)

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
        """Remove queued queries by id and return them; unknown or repeated ids raise PolicyError and remove none."""
        ids = list(query_ids)
        missing = [qid for qid in ids if qid not in self._by_id]
        if missing or len(set(ids)) != len(ids):  # refuse the whole list: the queue stays as it was
            raise PolicyError(f"queries {missing or ids} are not queued, or named twice")
        out = [self._by_id.pop(qid) for qid in ids]
        k = len(ids)
        if self._front[:k] and [q.id for q in self._front[:k]] == ids:
            del self._front[:k]  # the usual case: a policy took the head of the queue
        else:
            gone = set(ids)
            kept = [q for q in self._front if q.id not in gone]
            for qid in gone - {q.id for q in self._front}:
                self._removed[qid] = self._removed.get(qid, 0) + 1
            self._front = kept
        return out

    def view(self) -> QueueView:
        return self._view

    def discard(self, query_id: int) -> Query | None:
        """Remove a query if it is still queued (e.g. its client disconnected)."""
        return self.remove([query_id])[0] if query_id in self._by_id else None


class WorkerQueues:
    """Where a query type's routing policy sent its queued queries: one EDF queue per worker, and one (keyed
    None) for the queries it could not route yet. Every query here is also in the type's own EDF queue; the
    engine adds and removes both together, so no event order can leave the two apart."""

    def __init__(self) -> None:
        self._at: dict[int | None, EdfQueue] = {}  # in the order the queues were first used
        self.where: dict[int, int | None] = {}  # query id -> its worker

    def push(self, query: Query, worker_id: int | None) -> None:
        queue = self._at.get(worker_id)
        if queue is None:
            queue = self._at[worker_id] = EdfQueue()
        queue.push(query)
        self.where[query.id] = worker_id

    def remove(self, query_ids: Iterable[int]) -> None:
        """Forget queries the type's queue no longer holds (served, dropped, cancelled)."""
        by_worker: dict[int | None, list[int]] = {}
        for qid in query_ids:
            if qid in self.where:  # not yet routed when a policy's route() raised
                by_worker.setdefault(self.where.pop(qid), []).append(qid)
        for wid, ids in by_worker.items():
            self._at[wid].remove(ids)  # an emptied queue stays: the order queues were first used is kept

    def take(self, worker_id: int | None) -> list[Query]:
        """Every query routed to ``worker_id``, in EDF order, to be routed again."""
        queue = self._at.pop(worker_id, None)
        if queue is None:
            return []
        out = list(queue.scan())
        for q in out:
            del self.where[q.id]
        return out

    def workers(self) -> list[int | None]:
        """The workers with a queue (None: not routed yet), in the order their queues were first used."""
        return list(self._at)

    def view(self, worker_id: int | None) -> QueueView:
        queue = self._at.get(worker_id)
        return queue.view() if queue is not None else _EMPTY.view()


class QueueView:
    """What a policy sees of the EDF queue: read-only access in deadline order."""

    __slots__ = ("_queue", "_routes")

    def __init__(self, queue: EdfQueue, routes: WorkerQueues | None = None) -> None:
        self._queue = queue
        self._routes = routes

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, query_id: int) -> bool:
        return query_id in self._queue

    def peek(self) -> Query:
        """The earliest-deadline query; IndexError when empty."""
        return self._queue.peek()

    def head(self, n: int) -> list[Query]:
        """The ``n`` earliest-deadline queries (fewer if the queue is shorter)."""
        return self._queue.head(n)

    def scan(self) -> Iterator[Query]:
        """All queries in deadline order, fetched lazily."""
        return self._queue.scan()

    def at(self, worker_id: int | None) -> QueueView:
        """The queries routed to ``worker_id`` (None: not routed yet), for a policy that routes (``Policy.routes``)."""
        if self._routes is None:
            raise PolicyError("this query type's policy does not route: its queries are not per worker")
        return self._routes.view(worker_id)


_EMPTY = EdfQueue()
