"""SlackFit (SuperServe section 4.2, A.4, A.5).

NOTE on the policy. Offline, every (Pareto subnet, batch size) pair is placed on one axis,
its profiled latency; the range from the least accurate subnet at batch 1 to the most
accurate at the largest batch is cut into ``num_buckets`` evenly spaced buckets, and each
bucket keeps the pair with the largest batch. Online, when a worker is free, SlackFit takes
the slack of the earliest-deadline query and runs the bucket whose latency is closest to
but not above it, on that many earliest-deadline queries. Bursts shrink the slack, so it
moves to small subnets and large batches; light load moves it to accurate subnets.

# Ambiguity (digest A1): the number of buckets. Chosen: a parameter, default 32.
# Ambiguity (digest A2): bucket membership. Chosen: A.5's band reading (a bucket holds the
# pairs whose latency falls in its band), because the cumulative reading makes almost every
# bucket pick batch 16 and collapses SlackFit into MaxBatch.
# Ambiguity (digest A3): ties within a bucket. Chosen: the more accurate subnet.
# Ambiguity (digest A4): the latency a bucket is matched on. Chosen: the chosen pair's own
# profiled latency, not the band's upper edge, so a choice never exceeds the slack.
# Ambiguity (digest A7): fewer queued queries than the bucket's batch. Chosen: run those.
# Below bucket 0 (review finding): the drop threshold is the quickest option overall (the
# fastest variant at batch 1), not bucket 0, which may hold a larger batch: a query that
# option can still serve is not dropped. It is served with the fastest variant's largest batch
# within its slack, the bucket rule's own choice among the options below bucket 0.
# ``below_buckets`` names the two readings of what to do below bucket 0 (issue 26): "serve" (the
# default, above) serves it whatever is queued behind; "yield" serves it only when nothing is
# queued behind the batch, and otherwise drops it, so that a burst's tiny-slack heads do not spend
# the batches the queries behind them need (compared in `accscale bench overload --rule`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler_sidecar.core.latency import LatencyTable
from scheduler_sidecar.core.policy import HeadSlackPolicy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.queue import QueueView
from scheduler_sidecar.core.records import Decision, WorkerState
from scheduler_sidecar.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Bucket:
    latency_us: int  # profiled latency of (variant, batch_size)
    variant_id: str
    batch_size: int
    accuracy: float


def build_buckets(profile: Profile, device: str, num_buckets: int, latency: LatencyTable) -> list[Bucket]:
    """SlackFit's offline phase; buckets sorted by latency, non-empty bands only."""
    variants = profile.variants  # ascending accuracy
    sizes = variants[0].latency[device].batch_sizes
    lo = latency.us(variants[0].id, sizes[0], device)
    hi = latency.us(variants[-1].id, sizes[-1], device)
    width = max(hi - lo, 1) / num_buckets
    best: dict[int, Bucket] = {}
    for v in variants:
        for b in sizes:
            lat = latency.us(v.id, b, device)
            if lat > hi:
                continue
            band = min(int((lat - lo) / width), num_buckets - 1) if lat > lo else 0
            cand = Bucket(lat, v.id, b, v.accuracy)
            cur = best.get(band)
            if cur is None or (b, v.accuracy) > (cur.batch_size, cur.accuracy):
                best[band] = cand
    return sorted(best.values(), key=lambda k: (k.latency_us, -k.batch_size))


class Buckets:
    """SlackFit's options on one device kind: the buckets, and below them the quickest variant's batches."""

    def __init__(self, buckets: list[Bucket], quickest: list[Bucket]) -> None:
        self.buckets = buckets
        self._latencies = [k.latency_us for k in buckets]
        self.quickest = quickest  # the quickest variant at each batch size, ascending latency
        self._quickest_latencies = [k.latency_us for k in quickest]
        self.fastest_us = quickest[0].latency_us

    def bucket(self, slack_us: int) -> Bucket | None:
        """The bucket with the largest latency <= slack; below bucket 0, the quickest variant's largest
        batch that fits; None if not even its batch 1 does."""
        i = bisect.bisect_right(self._latencies, slack_us)
        if i:
            return self.buckets[i - 1]
        j = bisect.bisect_right(self._quickest_latencies, slack_us)
        return self.quickest[j - 1] if j else None

    def choose(self, slack_us: int) -> tuple[str, int] | None:
        bucket = self.bucket(slack_us)
        return (bucket.variant_id, bucket.batch_size) if bucket else None

    def fastest(self) -> tuple[str, int]:
        return self.quickest[0].variant_id, self.quickest[0].batch_size


class SlackFit(HeadSlackPolicy[Buckets]):
    """On a free worker, serve the bucket nearest below the head query's slack."""

    name = "slackfit"

    def __init__(self, profile: Profile, *, num_buckets: int = 32, below_buckets: str = "yield", **options) -> None:
        super().__init__(profile, **options)
        if num_buckets < 1:
            raise ConfigError("num_buckets must be >= 1")
        if below_buckets not in ("serve", "yield"):
            raise ConfigError(f"below_buckets must be 'serve' or 'yield', got {below_buckets!r}")
        self.num_buckets = num_buckets
        self.below_buckets = below_buckets

    def decide(self, now_us: int, queue: QueueView, workers: Sequence[WorkerState]) -> Decision:
        if self.below_buckets == "yield" and queue:
            worker = next((w for w in workers if w.is_free), None)
            if worker is not None:
                yielded = self._yield(now_us, queue, self.menu(worker.device))
                if yielded:
                    return yielded
        return super().decide(now_us, queue, workers)

    def _yield(self, now_us: int, queue: QueueView, menu: Buckets) -> Decision | None:
        """Drop the head queries below bucket 0 when more are queued than the batch that would serve them."""
        floor_us = menu.buckets[0].latency_us
        slack_us = self.slack_us(now_us, queue.peek())
        choice = menu.choose(slack_us)
        if choice is None or slack_us >= floor_us or len(queue) <= choice[1]:
            return None
        return self.drop_below(now_us, queue, floor_us)

    def build_menu(self, device: str) -> Buckets:
        v = min(self.profile.variants, key=lambda v: (self.latency.us(v.id, 1, device), -v.accuracy))
        quickest = [Bucket(self.latency.us(v.id, b, device), v.id, b, v.accuracy)
                    for b in v.latency[device].batch_sizes]
        return Buckets(build_buckets(self.profile, device, self.num_buckets, self.latency), quickest)

    @property
    def buckets(self) -> list[Bucket]:
        """The buckets on the policy's own device kind."""
        return self.menu().buckets
