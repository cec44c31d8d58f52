"""Demand estimates the paper systems' planners share: one-second arrival counts per query type and their
exponentially weighted mean (the Proteus and Loki artifacts' pandas ``ewm(com=1.6)`` over the last 20 counts;
both papers leave the estimator open)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler_sidecar.core.arith import ordered_sum


@dataclass
class SecondCounts:
    """One-second arrival counts per type, closed as time passes; the newest ``window`` are kept.

    Decision: the seconds count from the first time seen (the planner's start), not from the clock's epoch. A
    simulation's clock starts at 0, where the two agree; a live clock is the host's monotonic one, whose whole
    seconds fall at any fraction of a second after the sidecar's start. Counted from the epoch, a live Loki
    controller closed its seconds 0.2-0.7 s off the simulated one's, saw other counts, and planned other steps
    at other times (bench fidelity --system loki, at 1x: in two runs of three the plans parted within 9 s)."""

    window: int
    second: int | None = None  # the second being counted, from the origin; None until the first time seen
    origin_us: int | None = None  # the first time seen
    current: Counter = field(default_factory=Counter)
    history: dict[str, deque] = field(default_factory=dict)

    def advance(self, now_us: int, types: Sequence[str]) -> bool:
        """Close every whole second before ``now_us``; True if any closed."""
        if self.origin_us is None:
            self.origin_us = now_us
        second = (now_us - self.origin_us) // 1_000_000
        if self.second is None:
            self.second = second
        if second <= self.second:
            return False
        empty = min(second - self.second - 1, self.window)  # seconds with no arrival at all
        for q in types:
            history = self.history.setdefault(q, deque(maxlen=self.window))
            history.append(self.current.get(q, 0))
            history.extend([0] * empty)
        self.current.clear()
        self.second = second
        return True


def ewma(counts: Sequence[float], com: float) -> float:
    """The exponentially weighted mean of ``counts`` (oldest first), as pandas' ``ewm(com).mean()`` with
    ``adjust=True`` gives for the newest; 0 for no counts."""
    if not counts:
        return 0.0
    alpha = 1 / (1 + com)
    weights = [(1 - alpha) ** i for i in range(len(counts))]  # newest first
    return ordered_sum(w * c for w, c in zip(weights, reversed(counts))) / ordered_sum(weights)
