"""RAMSIS's online machinery (§3.2, §6), free of any driver: the load monitor, the round-robin
load balancer, and the pick of a per-load table.

``systems/ramsis/policy.py`` wraps these into the three registered policies
(RAMSIS, Jellyfish+, ModelSwitching). Everything here takes time as the ``now_us`` it is
given, so the same objects run on simulated and on wall time.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

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


class RoundRobin:
    """The load balancer of §3.2.1: arrival i goes to slot i mod K, skipping slots with no worker.

    The counter is global over central arrivals (digest A10); the per-worker queues themselves are
    the engine's.
    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"need at least one worker slot, got {slots}")
        self.slots = slots
        self._next = 0

    def pick(self, live: int) -> int | None:
        """The next of the first ``live`` slots in round-robin order; None when no slot has a worker."""
        if live < 1:
            return None
        while True:
            slot = self._next
            self._next = (self._next + 1) % self.slots
            if slot < live:
                return slot
