"""Peak throughput of a variant on a device kind (§4): the largest batch whose latency fits SLO/2, over its latency.

A query that arrives just after a batch starts waits for that batch and runs in the next one, so
it is answered within twice the batch latency (the Nexus argument the paper cites); a batch may
therefore take at most half the SLO. ``P = b* / latency(b*)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_sidecar.core.profile import LatencyCurve


@dataclass(frozen=True)
class CapacityRule:
    slo_fraction: float = 0.5  # §4: a batch may take at most this share of the SLO
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)  # the sizes considered; the artifact's set
    # §4 says the latency "cannot exceed" SLO/2 (<=); the artifact's code compares strictly (<)
    strict: bool = False
    # the artifact floors P to whole queries per second; the paper divides
    floor: bool = False

    def max_batch(self, curve: LatencyCurve, slo_ms: float) -> int:
        """The largest considered batch size whose latency fits; 0 if not even one query does."""
        budget = slo_ms * self.slo_fraction
        best = 0
        for b in self.batch_sizes:
            if b > curve.batch_sizes[-1]:  # beyond what was profiled
                break
            ms = curve.p50_at(b)
            if ms < budget or (not self.strict and ms == budget):
                best = b
        return best

    def capacity_qps(self, curve: LatencyCurve, slo_ms: float) -> float:
        b = self.max_batch(curve, slo_ms)
        if b == 0:
            return 0.0
        qps = b * 1000.0 / curve.p50_at(b)
        return float(int(qps)) if self.floor else qps


PAPER = CapacityRule()
ARTIFACT = CapacityRule(strict=True, floor=True)
