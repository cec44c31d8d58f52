"""A trace of quiet spells and bursts, sized from a measured profile: what `accscale demo` and `bench payoff` replay.

The point of accuracy scaling is a burst that the most accurate subnet cannot serve and a cheaper one can. So the
rates come from the profile being served, not from fixed numbers: the quiet spells ask about ``QUIET`` times what
the most accurate subnet serves within the SLO, each burst ``BURSTS[k]`` times that, and no burst asks more than
``HEADROOM`` of what the smallest subnet serves.

A variant's capacity is the most queries per second ``slots`` workers serve with it within the SLO: the largest
``slots * b / p50(b)`` over the profiled batch sizes with ``p50(b) <= SLO / 2``, since a query may wait for the
batch ahead of it and then run in its own. Where the policies take an allowance off every slack for the time
outside the sidecar's view, the capacities are those within the SLO less that allowance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadtest.traces import Trace, steps, with_slo
from scheduler_sidecar.core.profile import LatencyCurve, Profile
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments.superserve.paper_profile import capacity_qps as paper_capacity_qps

QUIET = 0.6  # the quiet rate over the most accurate subnet's capacity
BURSTS = (1.5, 2.0, 2.5)  # each burst's rate over that capacity, in order
HEADROOM = 0.9  # a burst asks at most this share of the smallest subnet's capacity
# the shape, in seconds at time_scale 1: quiet QUIET_S, then a burst of BURST_S, for each burst; a final quiet spell
# follows the last, so every burst has QUIET_S after it to show the return to the most accurate subnets
QUIET_S, BURST_S = 10, 6
SHAPE_S = len(BURSTS) * (QUIET_S + BURST_S) + QUIET_S  # 58


def capacity_qps(curve: LatencyCurve, slo_ms: float, slots: int = 1) -> float:
    """The most q/s ``slots`` workers serve with one variant within ``slo_ms``: the rule the paper-scale profile is
    calibrated by (the module docstring's)."""
    return paper_capacity_qps(curve, num_workers=slots, slo_ms=slo_ms)


@dataclass(frozen=True)
class Sizing:
    """How a burst trace was sized: the capacities it read off the profile and the rates it chose."""

    slo_ms: float
    allowance_ms: float  # taken off the SLO for the capacities
    device: str
    slots: int
    most_accurate: str  # variant ids
    smallest: str
    most_accurate_qps: float  # capacities, q/s
    smallest_qps: float
    quiet_qps: float
    burst_qps: tuple[float, ...]
    bursts_s: tuple[tuple[float, float], ...]  # [start, end) of each burst
    duration_s: float

    @property
    def burst_factors(self) -> tuple[float, ...]:
        """Each burst's rate over the most accurate subnet's capacity (below BURSTS where HEADROOM capped it)."""
        return tuple(q / self.most_accurate_qps for q in self.burst_qps)

    def describe(self) -> str:
        bursts = ", ".join(f"{q:.0f} q/s ({f:.2f}x) in {a:g}-{b:g} s"
                           for q, f, (a, b) in zip(self.burst_qps, self.burst_factors, self.bursts_s))
        within = f"{self.slo_ms:g} ms" + (f" less a {self.allowance_ms:g} ms allowance" if self.allowance_ms else "")
        return (f"capacity within {within} on {self.slots} slot(s) ({self.device}), from the profile: "
                f"most accurate subnet {self.most_accurate} {self.most_accurate_qps:.0f} q/s, smallest "
                f"{self.smallest} {self.smallest_qps:.0f} q/s. Quiet at {self.quiet_qps:.0f} q/s "
                f"({QUIET:g}x the most accurate's capacity); bursts: {bursts} (asked {'/'.join(map(str, BURSTS))}x, "
                f"at most {HEADROOM:g}x the smallest's capacity)")

    def in_burst(self, t_s: np.ndarray) -> np.ndarray:
        """Which of the times ``t_s`` fall in a burst."""
        t_s = np.asarray(t_s, dtype=float)
        return np.any([(a <= t_s) & (t_s < b) for a, b in self.bursts_s], axis=0) if self.bursts_s else t_s < 0

    def to_json(self) -> dict:
        return {"slo_ms": self.slo_ms, "allowance_ms": self.allowance_ms, "device": self.device, "slots": self.slots,
                "most_accurate": self.most_accurate, "smallest": self.smallest,
                "most_accurate_qps": round(self.most_accurate_qps, 1), "smallest_qps": round(self.smallest_qps, 1),
                "quiet_qps": round(self.quiet_qps, 1), "burst_qps": [round(q, 1) for q in self.burst_qps],
                "bursts_s": [list(b) for b in self.bursts_s], "duration_s": self.duration_s}


def size(profile: Profile, slo_ms: float, *, slots: int = 1, device: str | None = None,
              duration_s: float = SHAPE_S, allowance_ms: float = 0.0) -> Sizing:
    """The rates and burst windows for ``profile`` served within ``slo_ms`` less ``allowance_ms`` on ``slots``
    workers of ``device`` (default: the profile's first kind), the shape stretched to ``duration_s`` (58 s: 10 s
    quiet, then 6 s of burst, three times, and 10 s quiet)."""
    if not profile.variants:
        raise ConfigError(f"profile {profile.name!r} has no variants to size a trace from")
    device = device or profile.device_kinds[0]
    best, cheapest = profile.variants[-1], min(profile.variants, key=lambda v: v.latency[device].mean_p50_ms)
    top, low = (capacity_qps(v.latency[device], slo_ms - allowance_ms, slots) for v in (best, cheapest))
    if top <= 0:
        raise ConfigError(f"the most accurate subnet {best.id} serves no batch within half of the {slo_ms:g} ms SLO"
                          + (f" less {allowance_ms:g} ms" if allowance_ms else "") + "; give a larger --slo-ms")
    bursts = tuple(min(f * top, HEADROOM * low) for f in BURSTS)
    if not duration_s > 0:
        raise ConfigError(f"a trace's duration must be > 0 s, got {duration_s}")
    scale = duration_s / SHAPE_S
    windows = tuple((scale * (QUIET_S + k * (QUIET_S + BURST_S)), scale * ((k + 1) * (QUIET_S + BURST_S)))
                    for k in range(len(BURSTS)))
    return Sizing(slo_ms, allowance_ms, device, slots, best.id, cheapest.id, top, low, QUIET * top, bursts, windows,
                  duration_s)


def trace(sizing: Sizing, seed: int = 0) -> Trace:
    """Poisson arrivals at the sizing's rates, every query carrying its SLO."""
    rates = np.full(SHAPE_S, sizing.quiet_qps)
    for k, q in enumerate(sizing.burst_qps):
        start = QUIET_S + k * (QUIET_S + BURST_S)
        rates[start:start + BURST_S] = q
    return with_slo(steps(rates, sizing.duration_s / SHAPE_S, seed), sizing.slo_ms)


def needed_line(profile: Profile, sizing: Sizing) -> str:
    """:func:`needed` in words."""
    best = profile.variants[-1].accuracy
    parts = [f"{q:.0f} q/s: " + ("no subnet alone" if n is None else
                                 f"{n[1]:.2%} ({100 * (best - n[1]):.2f} points below the most accurate)")
             for q, n in zip(sizing.burst_qps, needed(profile, sizing))]
    return "the most accurate subnet that serves each burst alone: " + "; ".join(parts)


def needed(profile: Profile, sizing: Sizing) -> list[tuple[str, float] | None]:
    """Per burst, the most accurate variant that serves its rate alone within the SLO less the allowance (id,
    accuracy): how much accuracy the burst asks to give up, at least. None where no variant does."""
    out = []
    for rate in sizing.burst_qps:
        able = [v for v in profile.variants
                if capacity_qps(v.latency[sizing.device], sizing.slo_ms - sizing.allowance_ms, sizing.slots) >= rate]
        best = max(able, key=lambda v: v.accuracy, default=None)
        out.append((best.id, best.accuracy) if best else None)
    return out
