"""RAMSIS's online machinery (§3.2, §6), free of any driver: the load monitor, the round-robin
load balancer with its per-worker queues, and the pick of a per-load table.

``systems/ramsis/policy.py`` wraps these into the three registered policies
(RAMSIS, Jellyfish+, ModelSwitching). Everything here takes time as the ``now_us`` it is
given, so the same objects run on simulated and on wall time.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

from scheduler_sidecar.core.records import Query

LOAD_WINDOW_MS = 500.0  # §6: the load monitor's moving-average window, shared by RAMSIS and the baselines

T = TypeVar("T")


class LoadMonitor:
    """Query load as arrivals in the last ``window_ms``, divided by the window (§6).

    # Ambiguity (digest A9): sliding or tumbling window, and the value before a full window
    # has passed. Chosen: the artifact's, a sliding window recomputed at every decision, and
    # count / window from the start (it reads low during the first window).
    """

    def __init__(self, window_ms: float = LOAD_WINDOW_MS) -> None:
        if not window_ms > 0:
            raise ValueError(f"load window must be > 0 ms, got {window_ms}")
        self.window_us = round(window_ms * 1000)
        self._arrivals: deque[int] = deque()

    def observe(self, now_us: int) -> None:
        self._arrivals.append(now_us)

    def load_qps(self, now_us: int) -> float:
        arrivals, start = self._arrivals, now_us - self.window_us
        while arrivals and arrivals[0] <= start:
            arrivals.popleft()
        return len(arrivals) * 1e6 / self.window_us


class LoadTable(Generic[T]):
    """Entries keyed by load; ``pick`` is the lowest load at or above the estimate (§3.2.2).

    # Ambiguity (digest A8): above every load, the paper generates a new policy. Chosen: the
    # highest-load entry (an online decision cannot wait for a generation), counted in
    # ``out_of_range`` so the caller can report it.
    """

    def __init__(self, entries: Iterable[tuple[float, T]]) -> None:
        ordered = sorted(entries, key=lambda e: e[0])
        if not ordered:
            raise ValueError("a load table needs at least one entry")
        self.loads = [float(load) for load, _ in ordered]
        self.values = [value for _, value in ordered]
        self.out_of_range = 0  # picks above the highest load

    def pick(self, load_qps: float) -> T:
        i = bisect.bisect_left(self.loads, load_qps)
        if i == len(self.loads):
            self.out_of_range += 1
            i -= 1
        return self.values[i]


class WorkerQueues:
    """The round-robin load balancer and one EDF worker queue per slot (§3.2.1).

    Slot k is the k-th worker by id. The round-robin counter is global over central
    arrivals (digest A10): arrival i goes to slot i mod K, skipping slots marked dead.
    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"need at least one worker slot, got {slots}")
        self.slots = slots
        self.queues: list[list[Query]] = [[] for _ in range(slots)]  # heaps by (deadline, seq)
        self.slot_of: dict[int, int] = {}  # query id -> slot
        self.nonempty: set[int] = set()
        self.dead: set[int] = set()  # slots whose worker is absent or unhealthy
        self._next = 0

    def __len__(self) -> int:
        return len(self.slot_of)

    def route(self, query: Query) -> int:
        """Append ``query`` to the next live slot in round-robin order; returns the slot."""
        for _ in range(self.slots):
            slot = self._next
            self._next = (self._next + 1) % self.slots
            if slot not in self.dead:
                break
        heapq.heappush(self.queues[slot], query)
        self.slot_of[query.id] = slot
        self.nonempty.add(slot)
        return slot

    def take(self, slot: int, n: int) -> list[Query]:
        """Remove and return the ``n`` earliest-deadline queries of ``slot``."""
        heap = self.queues[slot]
        out = [heapq.heappop(heap) for _ in range(min(n, len(heap)))]
        for q in out:
            del self.slot_of[q.id]
        if not heap:
            self.nonempty.discard(slot)
        return out

    def forget(self, query_ids: set[int]) -> None:
        """Drop queries that left the central queue without us (a client went away)."""
        touched = {self.slot_of.pop(qid) for qid in query_ids if qid in self.slot_of}
        for slot in touched:
            self.queues[slot] = [q for q in self.queues[slot] if q.id not in query_ids]
            heapq.heapify(self.queues[slot])
            if not self.queues[slot]:
                self.nonempty.discard(slot)

    def evacuate(self, slot: int) -> None:
        """Re-route a dead slot's queries round-robin over the live ones."""
        for q in self.take(slot, len(self.queues[slot])):
            self.route(q)

    def reconcile(self, queued: Iterable[Query]) -> None:
        """Match the central queue: forget what left it, route what we never saw (a retried batch)."""
        present = {q.id: q for q in queued}
        gone = set(self.slot_of) - set(present)
        if gone:
            self.forget(gone)
        for qid, q in present.items():
            if qid not in self.slot_of:
                self.route(q)
