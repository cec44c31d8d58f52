"""The burst trace sized from a profile (demo, bench payoff), the report's burst trade and plain Triton's batcher."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtest import report
from loadtest.requestlog import Entry, RequestLog
from loadtest.traces import TraceError, steps
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.experiments import bursts
from scheduler_sidecar.experiments.payoff import Batcher, measure

SIZES = (1, 2, 4, 8, 16)


def _variant(name: str, accuracy: float, per_row_ms: float, fixed_ms: float) -> Variant:
    p50 = tuple(fixed_ms + per_row_ms * b for b in SIZES)
    return Variant(name, accuracy, Actuation("supernet", "m", (0,)), {"cpu": LatencyCurve(SIZES, p50, p50)})


def _profile() -> Profile:
    # the most accurate serves 16 rows in 1 + 16 x 1 = 17 ms (fits half of 36): 941 q/s; the smallest 16 in 1 + 1.6
    # = 2.6 ms: 6,154 q/s
    return Profile("p", "test", (_variant("small", 0.80, 0.1, 1.0), _variant("mid", 0.84, 0.4, 1.0),
                                 _variant("big", 0.87, 1.0, 1.0)))


def test_capacity_is_the_best_rate_of_a_batch_within_half_the_slo():
    curve = _profile().variants[-1].latency["cpu"]
    assert bursts.capacity_qps(curve, 36.0) == pytest.approx(16 * 1000 / 17)
    assert bursts.capacity_qps(curve, 10.0) == pytest.approx(4 * 1000 / 5)  # 8 rows take 9 ms > 5
    assert bursts.capacity_qps(curve, 10.0, slots=2) == pytest.approx(2 * 4 * 1000 / 5)
    assert bursts.capacity_qps(curve, 3.0) == 0.0


def test_sizing_reads_both_capacities_and_caps_bursts_at_the_smallest():
    sizing = bursts.size(_profile(), 36.0)
    top = 16 * 1000 / 17
    assert (sizing.most_accurate, sizing.smallest) == ("big", "small")
    assert sizing.quiet_qps == pytest.approx(0.6 * top)
    assert sizing.burst_factors == pytest.approx(bursts.BURSTS)  # the smallest serves 6,154 q/s: no cap
    assert sizing.bursts_s == ((10, 16), (26, 32), (42, 48)) and sizing.duration_s == 58
    # a smallest subnet only 3x as fast as the most accurate caps the bursts at 0.9 of its capacity
    close = Profile("p", "t", (_variant("small", 0.80, 0.5, 1.0), _variant("big", 0.87, 1.0, 1.0)))
    capped = bursts.size(close, 36.0)
    assert max(capped.burst_qps) == pytest.approx(0.9 * 16 * 1000 / 9)
    assert "most accurate subnet big" in capped.describe()
    with pytest.raises(ConfigError, match="larger --slo-ms"):
        bursts.size(_profile(), 1.0)
    # an allowance for the time outside the sidecar's view leaves less of the SLO: 16 rows (17 ms) no longer fit
    # half of 36 - 6 ms, 8 rows (9 ms) do
    allowed = bursts.size(_profile(), 36.0, allowance_ms=6.0)
    assert allowed.most_accurate_qps == pytest.approx(8 * 1000 / 9) and "less a 6 ms allowance" in allowed.describe()


def test_a_burst_needs_the_most_accurate_variant_that_serves_it_alone():
    sizing = bursts.size(_profile(), 36.0)  # bursts of 1,412, 1,882 and 2,353 q/s
    # "mid" serves 16 rows in 7.4 ms, 2,162 q/s: the first two bursts; only "small" serves the third
    assert bursts.needed(_profile(), sizing) == [("mid", 0.84), ("mid", 0.84), ("small", 0.80)]


def test_the_sized_trace_follows_its_rates_and_scales_in_time():
    sizing = bursts.size(_profile(), 36.0, duration_s=29.0)
    assert sizing.bursts_s == ((5, 8), (13, 16), (21, 24))
    trace = bursts.trace(sizing, seed=3)
    t = trace.arrival_s
    assert trace.duration_s == 29.0 and np.all(trace.slo_ms == 36.0)
    for q, (a, b) in zip(sizing.burst_qps, sizing.bursts_s):
        n = ((t >= a) & (t < b)).sum()
        assert abs(n - q * (b - a)) < 5 * math.sqrt(q * (b - a))  # Poisson: within five standard deviations
    quiet = ~sizing.in_burst(t)
    assert abs(quiet.sum() - sizing.quiet_qps * 20) < 5 * math.sqrt(sizing.quiet_qps * 20)


def test_steps_rejects_what_has_no_rate():
    with pytest.raises(TraceError):
        steps([0.0, 0.0], 1.0, 0)
    with pytest.raises(TraceError):
        steps([1.0, -1.0], 1.0, 0)
    assert len(steps([0.0, 50.0], 1.0, 0).arrival_s) > 0


def _run(name: str, rows: list[tuple[float, bool, float]]) -> report.Run:
    """A run whose entries are (scheduled s, met, accuracy)."""
    entries = [Entry(i, t, 10.0, latency_ms=5.0 if met else 20.0, status="ok", accuracy=acc, queue_ms=1.0,
                     service_ms=2.0 if met else 8.5, correct=1.0) for i, (t, met, acc) in enumerate(rows)]
    return report.Run(name, {}, RequestLog(entries))


def test_the_trade_counts_accuracy_given_up_and_attainment_kept_in_each_burst():
    # quiet 0-4 s at 0.87; burst 4-6 s at 0.84, one of four late; quiet again: 0.85 in second 6, 0.87 from 7 on
    rows = [(t + 0.5, True, 0.87) for t in range(4)] + [(4.1, True, 0.84), (4.6, False, 0.84), (5.1, True, 0.84),
                                                         (5.6, True, 0.84), (6.5, True, 0.85), (7.5, True, 0.87)]
    (row,) = report.trade([_run("slackfit", rows)], [(4.0, 6.0)])
    assert row["attainment"] == 0.75 and row["server_attainment"] == 1.0  # late at the client, in time inside
    assert row["worst_second"] == 0.5 and row["given_up"] == pytest.approx(3.0)
    assert row["recovered_s"] == 2.0  # second 6 is 2 points off, second 7 back: by 2 s after the burst
    assert row["below_best"] == 0.0  # the quiet spell served the most accurate any run served
    (line,) = report.trade_lines([row])
    assert "gave up 3.00-3.00 points" in line and "of its accuracy before each within 2 s" in line
    # a burst that starts mid-second counts its seconds from its start; a run the sidecar did not serve has no
    # sidecar attainment, and one with nothing met in a burst gives up nothing it can say
    direct = report.Run("direct", {}, RequestLog([Entry(0, 4.6, 10.0, latency_ms=5.0, status="ok", accuracy=0.8),
                                                  Entry(1, 5.4, 10.0, latency_ms=5.0, status="ok", accuracy=0.8),
                                                  Entry(2, 5.6, 10.0, latency_ms=50.0, status="ok", accuracy=0.8)]))
    (row,) = report.trade([direct], [(4.5, 6.5)])  # its seconds: 4.5-5.5 (both met), 5.5-6.5 (late)
    assert row["worst_second"] == 0.0 and row["server_attainment"] is None and row["given_up"] is None
    assert "gave up - points" in report.trade_lines([row])[0]


def test_plain_tritons_batcher_fits_the_slo():
    curve = _profile().variants[-1].latency["cpu"]  # p50(b) = 1 + b ms
    assert Batcher.for_slo(curve, 36.0) == Batcher(16, 36_000 - 2 * 17_000)
    assert Batcher.for_slo(curve, 10.0) == Batcher(4, 0)
    with pytest.raises(ConfigError):
        Batcher.for_slo(curve, 2.0)


def test_payoffs_goodput_counts_met_requests_per_second_in_and_out_of_bursts():
    sizing = bursts.size(_profile(), 36.0, duration_s=58.0)
    entries = [Entry(0, 1.0, 36.0, latency_ms=5.0, status="ok", accuracy=0.87, correct=1.0),
               Entry(1, 11.0, 36.0, latency_ms=5.0, status="ok", accuracy=0.80, correct=0.0),
               Entry(2, 12.0, 36.0, latency_ms=50.0, status="ok", accuracy=0.80, correct=1.0),
               Entry(3, 13.0, 36.0, status="StatusCode.RESOURCE_EXHAUSTED")]
    figures = measure(RequestLog(entries), sizing)
    assert figures["goodput_qps"] == pytest.approx(2 / 58) and figures["burst_goodput_qps"] == pytest.approx(1 / 18)
    assert figures["burst_attainment"] == pytest.approx(1 / 3) and figures["attainment"] == 0.5
    assert figures["burst_served_accuracy"] == pytest.approx(0.80)
