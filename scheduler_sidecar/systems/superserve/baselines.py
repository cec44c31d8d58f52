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
from scheduler_sidecar.errors import ConfigError


class OneVariant:
    """One variant's batch sizes and latencies on one device kind."""

    def __init__(self, variant_id: str, sizes: tuple[int, ...], latencies: list[int]) -> None:
        self.variant_id, self.sizes, self.latencies = variant_id, sizes, latencies
        self.fastest_us = latencies[0]

    def choose(self, slack_us: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.latencies, slack_us) - 1
        return (self.variant_id, self.sizes[i]) if i >= 0 else None

    def fastest(self) -> tuple[str, int]:
        return self.variant_id, self.sizes[0]


class ClipperPlus(HeadSlackPolicy[OneVariant]):
    """Serve every query with one fixed variant (default: the most accurate)."""

    name = "clipper"

    def __init__(self, profile: Profile, *, variant_id: str | None = None, **options) -> None:
        super().__init__(profile, **options)
        self.variant = profile.variant(variant_id) if variant_id else profile.variants[-1]

    def build_menu(self, device: str) -> OneVariant:
        sizes = self.variant.latency[device].batch_sizes
        return OneVariant(self.variant.id, sizes, [self.latency.us(self.variant.id, b, device) for b in sizes])


class Infaas(ClipperPlus):
    """INFaaS as the paper runs it: always the least accurate, cheapest variant."""

    name = "infaas"

    def __init__(self, profile: Profile, **options) -> None:
        if "variant_id" in options:
            raise ConfigError("infaas serves the least accurate variant; it takes no variant_id")
        super().__init__(profile, variant_id=profile.variants[0].id, **options)
