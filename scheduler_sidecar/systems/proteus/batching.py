"""How a worker forms batches from its own queue: Proteus' adaptive batching (§5, Fig. 3) and the baselines'.

Each strategy looks at one free worker's queue (earliest deadline first)
and says what to do now: drop hopeless head queries, dispatch a batch of k, or wait until a
time. ``latency(k)`` is the batch latency on that worker (the profile's p50); ``max_batch`` is
B_max, the largest batch within SLO/2 (§4). A strategy that waits for a last safe moment starts
``guard(k)`` before it (the policy's: the profile's p99 over p50 of that batch on that device
kind, plus any fixed margin), so that a batch slower than its median still makes the deadline.

Decisions on what the paper leaves open, shared by every strategy:
- A head query that would miss its deadline in the batch the worker would run now (the
  strategy's ``next_batch`` of what is queued from it on) is dropped and counted as a
  violation: the paper drops queries that "would expire", and a late answer costs the queries
  behind it as much as a met one. AIMD is the exception: Clipper reacts to timeouts, so it
  serves late what can still finish alone and backs off when it sees them.
- A batch size between profiled sizes runs padded to the next one (the profile's ``p50_at``),
  as the simulator runs it; the artifact rounds down instead.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

from scheduler_sidecar.core.queue import QueueView

Latency = Callable[[int], int]  # batch size -> us on this worker


@dataclass(frozen=True)
class Action:
    drop: int = 0  # head queries to drop
    dispatch: int = 0  # then this many head queries to run as one batch
    wakeup_us: int | None = None  # otherwise look again at this time


WAIT = Action()


class Batching(abc.ABC):
    name: str

    def __init__(self, limit: int = 8) -> None:
        self.limit = limit  # the largest batch the worker can run (the profile's largest size)

    def decide(self, now_us: int, queue: QueueView, latency: Latency, max_batch: int, drop_late: bool = True,
               guard: Latency = lambda k: 0) -> Action:
        """What to do with the queue of a free worker (``queue`` is not empty); ``drop_late`` False serves late
        queries instead of dropping them (a policy's ``late_queries="serve"``)."""
        if drop_late:
            drop, left = 0, len(queue)
            for q in queue.scan():
                if now_us + latency(self.next_batch(left, max_batch)) <= q.deadline_us:
                    break
                drop, left = drop + 1, left - 1
            if drop:
                return Action(drop=drop)
        return self.form(now_us, queue, latency, max_batch, guard)

    def next_batch(self, queued: int, max_batch: int) -> int:
        """The size of the batch a head query would run in now, for the drop test."""
        return min(queued, max_batch)

    @abc.abstractmethod
    def form(self, now_us: int, queue: QueueView, latency: Latency, max_batch: int, guard: Latency) -> Action:
        """The queue's head can still make its deadline."""

    def completed(self, late: bool) -> None:
        """A batch this worker ran finished; ``late`` if any of its queries missed the deadline."""


class Adaptive(Batching):
    """Proteus (§5, Fig. 3): run the q queued queries at T_max_wait(q+1) = d_head - T(q+1), or at once at B_max.

    Waiting for a (q+1)-th query is safe until the head query could no longer finish in a batch
    of q+1; if none came by then, the q run (case 1); if it came, the same test repeats with
    q+1 (case 2). Non-work-conserving: the worker may idle to batch more.
    """

    name = "proteus"

    def form(self, now_us, queue, latency, max_batch, guard):
        q = len(queue)
        if q >= max_batch:
            return Action(dispatch=max_batch)
        wait_until = queue.peek().deadline_us - latency(q + 1) - guard(q + 1)
        if now_us < wait_until:
            return Action(wakeup_us=wait_until)
        return Action(dispatch=q)


class Single(Adaptive):
    """"Proteus w/o AB" (§6.5): batch size 1."""

    name = "single"

    def form(self, now_us, queue, latency, max_batch, guard):
        return Action(dispatch=1)

    def next_batch(self, queued, max_batch):
        return 1


class Nexus(Batching):
    """Nexus as the paper describes it (§2.2, §6.4): work-conserving, a batch as soon as the worker is free,
    with early dropping: up to B_max of what is queued, runs now."""

    name = "nexus"

    def form(self, now_us, queue, latency, max_batch, guard):
        return Action(dispatch=min(len(queue), max_batch))


class NexusFill(Batching):
    """Nexus as the authors' artifact codes it (digest A.7): wait for a full B_max batch, or until the head's
    last safe start for one (d_head - T(B_max)), then run what is there."""

    name = "nexus-artifact"

    def form(self, now_us, queue, latency, max_batch, guard):
        if len(queue) >= max_batch:
            return Action(dispatch=max_batch)
        wait_until = queue.peek().deadline_us - latency(max_batch) - guard(max_batch)
        if now_us < wait_until:
            return Action(wakeup_us=wait_until)
        return Action(dispatch=len(queue))


class Aimd(Batching):
    """Clipper's AIMD (§3.6 of the digest; Clipper §4.3.1): the batch cap grows by ``increase`` after a batch
    with no late query and shrinks by ``backoff`` (Clipper's 10%) after one with a late query; a free
    worker runs up to the cap of what is queued (reactive: neither queue length nor deadlines set it)."""

    name = "aimd"
    increase = 1
    backoff = 0.9

    def __init__(self, limit: int = 8) -> None:
        super().__init__(limit)
        self.cap = 1.0

    def form(self, now_us, queue, latency, max_batch, guard):
        return Action(dispatch=min(len(queue), int(self.cap)))

    def next_batch(self, queued, max_batch):
        return 1  # see the module note

    def completed(self, late: bool) -> None:
        self.cap = max(1.0, int(self.cap) * self.backoff) if late else min(self.limit, self.cap + self.increase)


class AimdFull(Batching):
    """AIMD as the authors' artifact codes it (digest A.7): sizes {1, 2, 4, 8}, one step down after a batch with a
    late query and one up otherwise; only a full batch of the current size is dispatched."""

    name = "aimd-artifact"
    sizes = (1, 2, 4, 8)

    def __init__(self, limit: int = 8) -> None:
        super().__init__(limit)
        self.sizes = tuple(s for s in self.sizes if s <= limit) or (1,)
        self.step = 0

    def form(self, now_us, queue, latency, max_batch, guard):
        size = self.sizes[self.step]
        return Action(dispatch=size) if len(queue) >= size else WAIT

    def next_batch(self, queued, max_batch):
        return 1  # see the module note

    def completed(self, late: bool) -> None:
        self.step = max(0, self.step - 1) if late else min(len(self.sizes) - 1, self.step + 1)


STRATEGIES: dict[str, type[Batching]] = {b.name: b for b in (Adaptive, Single, Nexus, NexusFill, Aimd, AimdFull)}


def make_batching(name: str, limit: int = 8) -> Batching:
    if name not in STRATEGIES:
        raise ValueError(f"unknown batching {name!r}; choose one of {sorted(STRATEGIES)}")
    return STRATEGIES[name](limit)
