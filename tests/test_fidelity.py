"""`accscale bench fidelity` at loads relative to each system's planned capacity: the capacities each system's
planner would plan for on its most accurate configuration, and the spread of several runs' gaps."""

from __future__ import annotations

import argparse

import pytest

from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.experiments.fidelity import _table, common, loki, proteus, spread
from scheduler_sidecar.experiments.proteus import demo
from scheduler_sidecar.systems.loki import milp as loki_milp
from scheduler_sidecar.systems.loki.pipeline import Pipeline, StageVariant, Task
from scheduler_sidecar.systems.proteus.capacity import PAPER

BATCHES = (1, 2, 4, 8)


def _profile(name: str, ms: dict[str, list[float]]) -> Profile:
    """A query type of two variants: the more accurate one's p50 on each kind is ``ms``, the other's half of it."""
    def variant(vid: str, accuracy: float, factor: float) -> Variant:
        return Variant(vid, accuracy, Actuation("model", vid),
                       {kind: LatencyCurve(BATCHES, tuple(factor * x for x in p50), tuple(factor * x for x in p50))
                        for kind, p50 in ms.items()})
    return Profile(name, "tests", (variant(f"{name}-big", 0.9, 1.0), variant(f"{name}-small", 0.7, 0.5)))


def test_proteus_capacity_is_what_every_device_serves_on_the_most_accurate_variant():
    """One query type: each device serves its kind's peak rate of the most accurate variant within SLO/2 (the
    small variant, twice as fast, is not counted), and the MILP's largest common share adds them up."""
    ms = {"slow": [10.0, 12.0, 16.0, 30.0], "slower": [30.0, 36.0, 48.0, 90.0]}
    args = argparse.Namespace(slo_ms=100.0, base_qps=20.0, burst_qps=250.0, duration_s=30.0)
    profile = _profile("digits", ms)
    expected = sum(PAPER.capacity_qps(profile.variants[0].latency[kind], args.slo_ms) for kind in demo.DEVICES)
    assert proteus.planned_capacity({"digits": profile}, args) == pytest.approx(expected, rel=1e-4)
    # a second type at the base rate takes its share of the devices: the mix's capacity is less than digits' alone
    both = {"digits": profile, "wine": _profile("wine", ms)}
    assert 0 < proteus.planned_capacity(both, args) < expected


def _pipeline() -> Pipeline:
    def variants(task: str, fanout: dict[str, float]) -> tuple[StageVariant, ...]:
        return tuple(StageVariant(f"{task}{k}", accuracy, LatencyCurve(BATCHES, ms, ms), fanout)
                     for k, (accuracy, ms) in enumerate(((0.9, (20.0, 24.0, 32.0, 48.0)),
                                                         (0.7, (5.0, 6.0, 8.0, 12.0)))))
    return Pipeline("two", (Task("first", variants("a", {"second": 2.0}), ("second",)),
                            Task("second", variants("b", {}))), slo_ms=200.0, source="tests")


def test_loki_capacity_is_the_most_hardware_scaling_alone_serves():
    """Just below the capacity, the most accurate variants serve the whole demand (hardware scaling); just above
    it they cannot, and accuracy scaling must."""
    pipeline = _pipeline()
    capacity = loki.planned_capacity(pipeline, 4)
    below = loki_milp.plan(pipeline, 0.98 * capacity, 4)
    above = loki_milp.plan(pipeline, 1.05 * capacity, 4)
    assert below.step == "hardware" and above.step != "hardware"


def test_a_load_needs_a_capacity_and_scales_the_default_trace(tmp_path):
    args = argparse.Namespace(system="superserve", load=1.3, trace=None, duration_s=20.0)
    with pytest.raises(ValueError, match="planned capacity"):
        common.at_load(args, None)
    trace = common.default_trace(args, tmp_path, capacity_qps=200.0)
    from loadtest.traces import Trace

    assert Trace.load(trace).mean_rate_qps == pytest.approx(260.0, rel=0.1)


def _result(system: str, load: float, live: float, simulated: float, client: float) -> dict:
    return {"system": system, "load": load, "live_sidecar": {"slo_attainment": live},
            "simulated": {"slo_attainment": simulated},
            "attainment_gap_pts": {"sidecar": round(100 * (live - simulated), 2), "client": client},
            "accuracy_gap_pts": {"sidecar": 0.5, "client": 1.0}}


def test_the_spread_of_runs_is_min_median_max_per_system_and_load():
    results = [_result("loki", 1.3, live, 0.9, c) for live, c in ((0.8, -12.0), (0.85, -6.0), (0.9, -1.0))]
    results.append(_result("loki", 0.5, 1.0, 1.0, 0.0))
    rows = spread(results)
    assert [(r["system"], r["load"], r["runs"]) for r in rows] == [("loki", 1.3, 3), ("loki", 0.5, 1)]
    assert rows[0]["attainment_gap_pts_sidecar"] == [-10.0, -5.0, 0.0]
    assert rows[0]["attainment_gap_pts_client"] == [-12.0, -6.0, -1.0]
    assert rows[0]["live_attainment"] == [0.8, 0.85, 0.9] and rows[1]["accuracy_gap_pts_client"] == [1.0] * 3
    table = _table(rows).splitlines()
    assert table[2].startswith("| loki | 1.3x | 3 | 0.850 / 0.900 | -5.00 (-10.00..0.00) | 0.50 |")
    assert len(table) == 4


def test_a_live_runs_batch_times_are_counted_once_a_batch_over_their_p50():
    from loadtest.requestlog import Entry, RequestLog

    profile = _profile("digits", {"cpu": [10.0, 12.0, 16.0, 30.0]})
    # a batch of two (both its requests logged), one of one, and a request that failed
    entries = [Entry(0, 0.0, 100.0, status="ok", variant="digits-big", batch_size=2, service_ms=18.0, worker="w"),
               Entry(1, 0.0, 100.0, status="ok", variant="digits-big", batch_size=2, service_ms=18.0, worker="w"),
               Entry(2, 0.1, 100.0, status="ok", variant="digits-small", batch_size=1, service_ms=10.0, worker="w"),
               Entry(3, 0.2, 100.0, status="error", variant="digits-big", batch_size=1, worker="w")]
    assert sorted(common.batch_ratios(RequestLog(entries), profile)) == pytest.approx([1.5, 2.0])


def test_a_world_with_latency_ratios_draws_each_batchs_time_from_them():
    from scheduler_sidecar.sim.world import BatchLatency, World

    profile = _profile("digits", {"cpu": [10.0, 12.0, 16.0, 30.0]})
    latency = BatchLatency(World.uniform(1, latency_ratios=(1.0, 3.0)), [profile])
    drawn = {latency.sample_us("digits-big", 4, 0) for _ in range(50)}
    assert drawn == {16_000, 48_000}
    assert BatchLatency(World.uniform(1), [profile]).sample_us("digits-big", 4, 0) == 16_000
    for bad in ({"latency_ratios": (0.0,)}, {"latency_ratios": (1.0,), "latency_noise": "tail"}):
        with pytest.raises(ValueError, match="latency_ratios"):
            World.uniform(1, **bad)
