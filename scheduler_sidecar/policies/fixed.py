"""Single-variant baselines: Clipper+ and INFaaS (SuperServe section 6.1).

Clipper+ stands for systems that serve one fixed model (Clipper, Clockwork, TF-Serving);
the paper runs six versions whose subnets uniformly span the accuracy range. INFaaS, with
no accuracy constraint given, always serves the least accurate (cheapest) variant.

# Ambiguity (digest A16): the baselines' batching. Chosen: the largest profiled batch whose
# latency fits the head query's slack, the same greedy rule the other policies use, so that
# only the choice of variant differs.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from scheduler_sidecar.core import EMPTY, Decision, Dispatch, EdfQueue, WorkerState
from scheduler_sidecar.policies.base import Policy, free_worker
from scheduler_sidecar.profile import Profile


class ClipperPlus(Policy):
    """Serve every query with one fixed variant (default: the most accurate)."""

    name = "clipper"

    def __init__(self, profile: Profile, *, variant_id: str | None = None, **options) -> None:
        super().__init__(profile, **options)
        self.variant = profile.variant(variant_id) if variant_id else self.default_variant(profile)
        self.sizes = self.variant.latency[self.device].batch_sizes
        self.latencies = [self.latency_us(self.variant, b) for b in self.sizes]

    @staticmethod
    def default_variant(profile: Profile):
        return profile.variants[-1]

    def decide(self, now_us: int, queue: EdfQueue, workers: Sequence[WorkerState]) -> Decision:
        worker = free_worker(workers)
        if worker is None or not queue:
            return EMPTY
        dropped = self.drop_or_serve(now_us, queue, self.latencies[0])
        if dropped:
            return dropped
        i = max(bisect.bisect_right(self.latencies, self.slack_us(now_us, queue.peek())) - 1, 0)
        ids = tuple(q.id for q in queue.head(self.sizes[i]))
        return Decision((Dispatch(worker.id, self.variant.id, ids),))


class Infaas(ClipperPlus):
    """INFaaS as the paper runs it: always the least accurate, cheapest variant."""

    name = "infaas"

    def __init__(self, profile: Profile, **options) -> None:
        super().__init__(profile, variant_id=profile.variants[0].id, **options)
