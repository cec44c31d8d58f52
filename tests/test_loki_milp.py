"""Loki's resource manager: the MILP against exhaustive enumeration, and the demand sweep of Fig. 1 on the
authors' profile (phases in order, as the paper's text describes them)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_sidecar.core.profile import LatencyCurve
from scheduler_sidecar.systems.loki import milp
from scheduler_sidecar.systems.loki.data import CARS, DETECTOR, social_media, traffic_analysis
from scheduler_sidecar.systems.loki.pipeline import Pipeline, StageVariant, Task

SMALL_B = (1, 2, 4)


def _random_pipeline(rng: np.random.Generator, sizes: tuple[int, int]) -> Pipeline:
    def variants(n: int, fanout: bool) -> tuple[StageVariant, ...]:
        out = []
        for k in range(n):  # more accurate is slower, latency grows sublinearly with batch
            base = rng.uniform(4, 12) * (1 + k * 0.6)
            ms = tuple(base * b ** rng.uniform(0.5, 0.9) for b in SMALL_B)
            out.append(StageVariant(f"{'ab'[fanout]}{k}", round(rng.uniform(0.6, 0.8) + 0.1 * k, 3),
                                    LatencyCurve(SMALL_B, ms, ms),
                                    {"second": round(rng.uniform(0.5, 3.0), 2)} if not fanout else {}))
        return tuple(sorted(out, key=lambda v: -v.accuracy))

    return Pipeline("small", (Task("first", variants(sizes[0], False), ("second",)),
                              Task("second", variants(sizes[1], True))), slo_ms=float(rng.uniform(40, 90)),
                    source="test")


@pytest.mark.parametrize("seed", range(8))
def test_milp_equals_exhaustive_enumeration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pipeline = _random_pipeline(rng, ((2, 2), (2, 3), (3, 2))[seed % 3])
    workers = 4 + seed % 3
    for demand in rng.uniform(20, 400, size=3):
        best, fewest = milp.enumerate_plans(pipeline, demand, workers, batch_sizes=SMALL_B)
        solution = milp.plan(pipeline, demand, workers, batch_sizes=SMALL_B)
        if fewest is not None:  # the top variants serve it: hardware scaling with the fewest workers
            assert solution.step == "hardware" and solution.workers == fewest
            assert solution.accuracy == pytest.approx(max(pipeline.accuracy(p) for p in pipeline.paths("second")))
        elif best >= 0:  # accuracy scaling: the same best expected accuracy
            assert solution.step == "accuracy"
            assert solution.accuracy == pytest.approx(best, abs=1e-6)
        else:  # no allocation serves it all
            assert solution.step in ("overload", "infeasible")
        assert solution.workers <= workers


def test_a_plan_respects_load_latency_and_the_cluster() -> None:
    pipeline = traffic_analysis()
    for demand in (40, 300, 1200):
        s = milp.plan(pipeline, demand, 20)
        assert s.workers <= 20 and {a.task for a in s.allocations} == {t.name for t in pipeline.tasks}
        batch_ms = {a.variant: a.batch_ms for a in s.allocations}
        capacity = {a.variant: a.replicas * a.capacity_qps for a in s.allocations}
        load = dict.fromkeys(capacity, 0.0)
        for task in pipeline.leaves:
            total = sum(c for p, c in s.shares.items() if pipeline.task_of(p[-1]) is task)
            assert total == pytest.approx(1.0, abs=1e-6)
        for path, share in s.shares.items():
            assert sum(batch_ms[v] for v in path) <= pipeline.slo_ms / 2 + 1e-6
            for k, v in enumerate(path):
                if k < len(path) - 1 and pipeline.task_of(v) is pipeline.root:
                    continue  # the root's load is counted once below, not per leaf path
                load[v] += demand * pipeline.multiplier(path[:k + 1]) * share
        for v in (a.variant for a in s.allocations if pipeline.task_of(a.variant) is pipeline.root):
            load[v] = demand * sum(c for p, c in s.shares.items() if p[0] == v and pipeline.task_of(p[-1]).name == CARS)
        for v, arriving in load.items():
            assert arriving <= capacity[v] * (1 + 1e-6)


def test_demand_sweep_has_the_three_phases_of_fig1() -> None:
    """Hardware scaling until the cluster runs out (workers up, accuracy at its maximum), then accuracy scaling
    with every worker in use and accuracy non-increasing, the classifier degraded before the detector."""
    pipeline = traffic_analysis(serial=True)
    top = pipeline.accuracy((pipeline.root.top.id, pipeline.task(CARS).top.id))
    demands = [*range(10, 301, 15), *range(400, 2301, 100)]
    solutions = [milp.plan(pipeline, d, 20) for d in demands]
    hardware = [s for s in solutions if s.step == "hardware"]
    assert hardware and hardware == solutions[:len(hardware)]
    workers = [s.workers for s in hardware]
    assert workers == sorted(workers) and all(s.accuracy == pytest.approx(top) for s in hardware)
    end = demands[len(hardware) - 1]
    # the published profile runs out near 205 q/s (the paper's cluster: ~560 q/s, Fig. 1)
    assert end <= 205 < demands[len(hardware)]
    scaled = solutions[len(hardware):]
    assert all(s.workers == 20 for s in scaled)
    accuracy = [s.accuracy * s.served for s in scaled]
    assert all(b <= a + 1e-6 for a, b in zip(accuracy, accuracy[1:]))
    # phase 2: the first accuracy-scaled plans lower the classifier and keep the detector at its best
    first = scaled[0]
    assert first.task_accuracy(pipeline, DETECTOR) == pytest.approx(pipeline.root.top.accuracy)
    assert first.task_accuracy(pipeline, CARS) < pipeline.task(CARS).top.accuracy
    assert scaled[-1].task_accuracy(pipeline, DETECTOR) < pipeline.root.top.accuracy  # phase 3 reaches it


def test_inferline_scales_hardware_only_and_serves_a_fraction_beyond() -> None:
    pipeline = traffic_analysis(serial=True)
    below, beyond = milp.plan(pipeline, 150, 20, top_only=True), milp.plan(pipeline, 600, 20, top_only=True)
    assert below.step == "hardware" and beyond.step == "overload"
    assert beyond.served < 0.5 and {a.variant for a in beyond.allocations} == {t.top.id for t in pipeline.tasks}


def test_the_social_media_pipeline_scales_hardware_with_the_top_variants_that_meet_its_slo() -> None:
    """The artifact's social-media app: every image to the detector and the captioner. Its two large CLIP variants
    take longer than the SLO at batch 1, so hardware scaling (and InferLine) runs the most accurate one that fits."""
    pipeline = social_media()
    assert [t.name for t in pipeline.tasks] == ["source", DETECTOR, "image_captioning"]
    assert pipeline.root.top.fanout == {DETECTOR: 1.0, "image_captioning": 1.0}
    quiet, busy = milp.plan(pipeline, 50.0, 20), milp.plan(pipeline, 300.0, 20)
    assert quiet.step == "hardware" and {a.variant for a in quiet.allocations} == {
        "source", "yolov5x", "clip-vit-base-patch16"}
    assert busy.step == "accuracy" and busy.served == pytest.approx(1.0) and busy.accuracy < quiet.accuracy
    inferline = milp.plan(pipeline, 300.0, 20, top_only=True)
    assert inferline.step == "overload" and inferline.served < 1.0
