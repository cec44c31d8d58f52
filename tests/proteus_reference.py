"""A second Proteus, written from the paper's text alone (Ahmad et al., ASPLOS '24: §4 Eqs. 1-7 and the capacity
rule, §5 and Fig. 3), for ``test_proteus_reference.py`` to hold the project's against. It shares no code with
``scheduler_sidecar``: plans by brute force (every allocation of variants to devices, each with its best query
assignment), adaptive batching as §5's two cases, and a discrete-event data path, one queue per device.

What the paper leaves open is decided here the plain way, and the tests say where the project decided otherwise:
- Devices of one type are interchangeable, so an allocation is how many devices of each type host each variant.
  Ties between optimal allocations are all returned (the paper names no tie-break).
- P (§4) takes the largest batch in {1, 2, 4, 8} whose latency is at most SLO/2, over that latency; a batch between
  profiled sizes runs as the next profiled size.
- Overload (§4: "we solve the MILP again by decreasing s_q by a small value"): every type's demand times
  1 - k x ``step``, for the first k at which some allocation serves it.
- A type's queries go to its devices in proportion to their planned rates (the y[d,q] of Eq. 2) by smooth weighted
  round-robin, as the project's router does: the paper says "percentage" and no more, and a query-by-query
  comparison needs the same split (the order of the devices is the plan's).
- A device drops the head query while it "would expire" even run alone now (``drop="alone"``); ``drop="batch"``
  drops it while it would expire in the batch the device would run now (min(queue, B_max)).
- Times are whole microseconds. Events at the same microsecond run in the order they were scheduled; the tests keep
  the two types' arrivals apart (odd and even microseconds), and agree query by query with the project's order.
- The project stops lowering an overloaded demand at 0.2 of it (the artifact's floor); this reference goes on to 0.
  No scenario in the tests needs a scale below 0.65.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Variant:
    name: str
    type: str
    accuracy: float
    latency_ms: Mapping[str, Mapping[int, float]]  # device type -> batch size -> batch latency

    def run_us(self, device: str, size: int) -> int:
        """T_process(size) on ``device``: a batch between profiled sizes runs as the next one up."""
        table = self.latency_ms[device]
        return round(table[min(b for b in table if b >= size)] * 1000)

    def max_batch(self, device: str, slo_ms: float) -> int:
        """§4: the largest batch whose latency is at most half the SLO (0: not even one query)."""
        table = self.latency_ms[device]
        return max((b for b in SIZES if b in table and table[b] <= slo_ms / 2), default=0)

    def peak_qps(self, device: str, slo_ms: float) -> float:
        """P[d, m, q] = (maximum allowed batch size) / (profiled latency in seconds)."""
        b = self.max_batch(device, slo_ms)
        return b * 1000.0 / self.latency_ms[device][b] if b else 0.0


Allocation = frozenset  # of ((device type, variant name), devices hosting it)


@dataclass
class Plans:
    scale: float  # the share of the demand served (1 unless overloaded)
    value: float  # the optimum of Eq. 7: sum over served queries of their variant's accuracy, per second
    best: set[Allocation] = field(default_factory=set)


def assignment(hosted: Counter, variants: Mapping[str, Variant], slo_ms: Mapping[str, float],
               demand: Mapping[str, float]) -> tuple[float, dict[tuple[str, str], float]] | None:
    """The best query assignment for one allocation (Eqs. 4-7 with x fixed): each type's demand filled from its most
    accurate hosted variants first, each up to its devices' peak (a fractional knapsack, so greedy is exact). None if
    some type's demand exceeds what its devices serve (Eq. 6)."""
    value, served = 0.0, {}
    for q, s in demand.items():
        left = s
        mine = sorted(((variants[m].accuracy, device, m) for (device, m), n in hosted.items()
                       if variants[m].type == q), reverse=True)
        for accuracy, device, m in mine:
            take = min(left, hosted[device, m] * variants[m].peak_qps(device, slo_ms[q]))
            served[device, m] = take
            value += accuracy * take
            left -= take
        if left > 1e-9 * max(1.0, s):
            return None
    return value, served


def allocations(devices: Mapping[str, int], variants: Mapping[str, Variant], slo_ms: Mapping[str, float]):
    """Every allocation (Eq. 1: at most one variant per device; a variant with P = 0 on a type is never placed)."""
    per_type = []
    for device, count in sorted(devices.items()):
        fits = sorted(m for m, v in variants.items() if v.peak_qps(device, slo_ms[v.type]) > 0)
        per_type.append([Counter((device, m) for m in chosen if m is not None)
                         for chosen in itertools.combinations_with_replacement([None, *fits], count)])
    for parts in itertools.product(*per_type):
        yield sum(parts, Counter())


def plan(devices: Mapping[str, int], variants: Mapping[str, Variant], slo_ms: Mapping[str, float],
         demand: Mapping[str, float], *, step: float = 0.05, rel: float = 1e-9) -> Plans:
    """Eq. 7's optimum and every allocation that reaches it, lowering the demand in ``step``s while none serves it."""
    everything = list(allocations(devices, variants, slo_ms))
    for k in range(math.ceil(1 / step) + 1):
        scale = max(0.0, 1 - k * step)
        lowered = {q: s * scale for q, s in demand.items()}
        found = [(a, r[0]) for a in everything if (r := assignment(a, variants, slo_ms, lowered)) is not None]
        if found:
            best = max(v for _, v in found)
            return Plans(scale, best, {frozenset(a.items()) for a, v in found if v >= best - rel * max(1.0, best)})
    raise AssertionError("not even zero demand is served")


# ---------------------------------------------------------------------------------------------------- data path
@dataclass(frozen=True)
class Device:
    id: int
    type: str
    variant: Variant
    max_batch: int  # B_max


@dataclass
class Outcome:
    status: str = "pending"  # "met", "late" or "dropped"
    finish_us: int = -1
    device: int = -1


class _Router:
    """Smooth weighted round-robin over a type's (device id, share): each turn every device gains its share, the
    richest takes the query and pays the total."""

    def __init__(self, shares: Sequence[tuple[int, float]]) -> None:
        self.shares = list(shares)
        self.credit = [0.0] * len(self.shares)

    def pick(self) -> int:
        total, best = 0.0, 0
        for i, (_, share) in enumerate(self.shares):
            self.credit[i] += share
            total += share
            if self.credit[i] > self.credit[best]:
                best = i
        self.credit[best] -= total
        return self.shares[best][0]


def simulate(devices: Sequence[Device], routes: Mapping[str, Sequence[tuple[int, float]]],
             queries: Sequence[tuple[int, int, str]], *, drop: str = "alone") -> list[Outcome]:
    """Serve ``queries`` ((arrival us, deadline us, type), by arrival) on ``devices`` under one plan: each routed to a
    device's queue (oldest first), each device batching as §5 does (Fig. 3)."""
    assert drop in ("alone", "batch")
    by_id = {d.id: d for d in devices}
    routers = {q: _Router(r) for q, r in routes.items()}
    queue: dict[int, list[int]] = {d.id: [] for d in devices}
    busy_until = {d.id: 0 for d in devices}
    timer: dict[int, int | None] = {d.id: None for d in devices}
    out = [Outcome() for _ in queries]
    events: list[tuple[int, int, str, int]] = []  # (time, order, what, device or query)
    order = itertools.count()
    for i, (arrival, _, _) in enumerate(queries):
        heapq.heappush(events, (arrival, next(order), "arrive", i))

    def deadline(i: int) -> int:
        return queries[i][1]

    def decide(d: Device, now: int) -> None:
        mine = queue[d.id]
        if busy_until[d.id] > now:
            return  # it looks again when its batch completes
        while mine:  # the head "would expire": dropped, a violation
            size = 1 if drop == "alone" else min(len(mine), d.max_batch)
            if now + d.variant.run_us(d.type, size) <= deadline(mine[0]):
                break
            out[mine.pop(0)] = Outcome("dropped", now, d.id)
        timer[d.id] = None
        q = len(mine)
        if q == 0:
            return
        if q >= d.max_batch:  # the batch cannot grow: run B_max now
            run(d, d.max_batch, now)
            return
        wait = deadline(mine[0]) - d.variant.run_us(d.type, q + 1)  # T_max_wait(q + 1)
        if now < wait:  # safe to wait for one more (Case 1 fires at ``wait``; Case 2 comes back here on arrival)
            timer[d.id] = wait
            heapq.heappush(events, (wait, next(order), "timer", d.id))
        else:
            run(d, q, now)

    def run(d: Device, k: int, now: int) -> None:
        batch, queue[d.id] = queue[d.id][:k], queue[d.id][k:]
        finish = now + d.variant.run_us(d.type, k)
        busy_until[d.id] = finish
        for i in batch:
            out[i] = Outcome("met" if finish <= deadline(i) else "late", finish, d.id)
        heapq.heappush(events, (finish, next(order), "done", d.id))

    while events:
        now, _, what, key = heapq.heappop(events)
        if what == "arrive":
            d = by_id[routers[queries[key][2]].pick()]
            queue[d.id].append(key)
            queue[d.id].sort(key=deadline)
        else:
            d = by_id[key]
            if what == "timer" and timer[d.id] != now:
                continue  # superseded
        decide(d, now)
    return out
