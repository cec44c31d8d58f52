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
from scheduler_sidecar.core.policy import HeadSlackPolicy
from scheduler_sidecar.core.profile import Profile


class ClipperPlus(HeadSlackPolicy):
    """Serve every query with one fixed variant (default: the most accurate)."""

    name = "clipper"

    def __init__(self, profile: Profile, *, variant_id: str | None = None, **options) -> None:
        super().__init__(profile, **options)
        self.variant = profile.variant(variant_id) if variant_id else profile.variants[-1]
        self.sizes = self.variant.latency[self.device].batch_sizes
        self.latencies = [self.latency_us(self.variant, b) for b in self.sizes]
        self.fastest_us = self.latencies[0]

    def choose(self, slack_us: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.latencies, slack_us) - 1
        return (self.variant.id, self.sizes[i]) if i >= 0 else None

    def fastest(self) -> tuple[str, int]:
        return self.variant.id, self.sizes[0]


class Infaas(ClipperPlus):
    """INFaaS as the paper runs it: always the least accurate, cheapest variant."""

    name = "infaas"

    def __init__(self, profile: Profile, **options) -> None:
        super().__init__(profile, variant_id=profile.variants[0].id, **options)
