"""Pinned simulator results: a restructure of the core must not change any policy's numbers.

Each single-model case runs ``accscale simulate --json`` on a trace generated here with a fixed
seed, and compares the query counts exactly and attainment and accuracy to 12 significant digits.
The Proteus and Loki cases run their systems (planner, routing, batching, dropping) on a short
piece of their published data, with and without lost workers, and compare every metric the same
way. When a deliberate fix changes a number, update the pin in the same commit and say why there.
"""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from loadtest import traces
from scheduler_sidecar.cli import main

# name -> (policy, trace, extra flags, (queries, met, late, dropped), slo_attainment, mean_serving_accuracy)
PINS = {
    # SlackFit below bucket 0 serves the quickest variant only when nothing is queued behind that batch, and
    # otherwise drops (below_buckets="yield", issue 26, chosen by `accscale bench overload-rules`); with "serve"
    # (always serve it): (13943, 6301, 0, 7642), 0.45191135336728105, 0.7425271044278687 and, with tail noise
    # and failures, (13943, 3369, 233, 10341), 0.24162662267804633, 0.7406456307509647
    "slackfit": ("slackfit", "ss", [], (13943, 9754, 0, 4189), 0.699562504482536, 0.7451189352060693),
    "maxacc": ("maxacc", "ss", [], (13943, 3224, 0, 10719), 0.2312271390661981, 0.7608253244416872),
    "maxbatch": ("maxbatch", "ss", [], (13943, 6344, 0, 7599), 0.4549953381625188, 0.7475868989596468),
    "clipper": ("clipper", "ss", [], (13943, 1705, 0, 12238), 0.1222835831600086, 0.8016000000000001),
    "infaas": ("infaas", "ss", [], (13943, 13943, 0, 0), 1.0, 0.7382),
    "slackfit-tail-fail": ("slackfit", "ss", ["--latency-noise", "tail", "--seed", "3", "--fail-at", "0.5,1.0"],
                           (13943, 6253, 242, 7448), 0.4484687656888761, 0.7457846548856549),
    "slackfit-serve": ("slackfit", "ss", ["--below-buckets", "serve"], (13943, 6301, 0, 7642),
                       0.45191135336728105, 0.7425271044278687),
    "ramsis": ("ramsis", "rs", [], (712, 693, 19, 0), 0.973314606741573, 0.7556548917748919),
    "jellyfish": ("jellyfish", "rs", [], (712, 709, 3, 0), 0.9957865168539326, 0.7390986177715091),
    "modelswitching": ("modelswitching", "rs", ["--ms-profile-s", "5"], (712, 712, 0, 0), 1.0, 0.7300399999999999),
    # the engine owns the worker queues: a lost worker's queue is routed again round-robin and the others keep
    # theirs; before, every slot after the lost one moved to the next worker: (712, 652, 60, 0),
    # 0.9157303370786517, 0.7392650306748466
    "ramsis-fail": ("ramsis", "rs", ["--fail-at", "2,4"], (712, 653, 59, 0), 0.9171348314606742, 0.7415884226646247),
    "jellyfish-fail": ("jellyfish", "rs", ["--fail-at", "2,4"], (712, 683, 29, 0), 0.9592696629213483,
                       0.7384825183016105),
}


@pytest.fixture(scope="module")
def trace_args(tmp_path_factory) -> dict[str, list[str]]:
    tmp = tmp_path_factory.mktemp("pinned")
    traces.bursty(base_qps=1500, variant_qps=5550, cv2=8, duration_s=2.0, seed=7).save(tmp / "ss.txt")
    traces.gamma(rate_qps=120, cv2=4, duration_s=6.0, seed=11).save(tmp / "rs.txt")
    return {
        "ss": ["--profile", "profiles/superserve_paper.json", "--trace", str(tmp / "ss.txt"), "--workers", "5",
               "--slo-ms", "36"],
        "rs": ["--profile", "profiles/ramsis/ramsis_cpu_latency.csv", "--profile-set", "image_cloud_cpu",
               "--trace", str(tmp / "rs.txt"), "--workers", "6", "--slo-ms", "150", "--ramsis-loads", "100,200"],
    }


@pytest.mark.parametrize("case", sorted(PINS))
def test_simulate_matches_pinned_results(case, trace_args):
    """`accscale simulate` gives the pinned counts, attainment and accuracy for every policy."""
    policy, trace, extra, counts, attainment, accuracy = PINS[case]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["simulate", "--policy", policy, *trace_args[trace], *extra, "--json"]) == 0
    summary = json.loads(out.getvalue())
    assert (summary["queries"], summary["met"], summary["late"], summary["dropped"]) == counts
    assert summary["slo_attainment"] == pytest.approx(attainment, rel=1e-12)
    assert summary["mean_serving_accuracy"] == pytest.approx(accuracy, rel=1e-12)


def proteus_metrics(system: str, **setup) -> dict:
    """Three of the authors' families on 8 workers of 3 kinds, 30 s of their trace at 4x its rate."""
    from scheduler_sidecar.experiments.proteus import systems as ps
    from scheduler_sidecar.experiments.proteus.data import Counts, load_counts, load_profiles

    profiles, counts = load_profiles(), load_counts()
    families = ("efficientnet", "mobilenet", "resnet")
    trace = Counts(families, counts.per_second[:30, [counts.families.index(f) for f in families]] * 4)
    config = ps.Setup({f: profiles[f] for f in families}, {"cpu": 4, "pascal": 2, "ampere": 2}, 300.0, **setup)
    return ps.simulate({**ps.SYSTEMS, **ps.ABLATIONS}[system], config, trace).metrics()


def loki_metrics(system: str, **setup) -> dict:
    """The authors' traffic-analysis pipeline on 20 workers, 14 s of frames with a 2x burst in the middle."""
    from scheduler_sidecar.experiments.loki import systems as ls
    from scheduler_sidecar.experiments.loki.reproduce import poisson_seconds
    from scheduler_sidecar.systems.loki.data import traffic_analysis
    from scheduler_sidecar.systems.loki.planner import LokiConfig

    arrival_us = poisson_seconds(np.array([100.0] * 5 + [200.0] * 4 + [100.0] * 5), 5)
    config = ls.Setup(traffic_analysis(), workers=20, config=LokiConfig(period_s=5.0, headroom=1.25), **setup)
    return ls.metrics(ls.simulate({**ls.SYSTEMS, **ls.ABLATIONS}[system], config, arrival_us,
                                  initial_demand_qps=100.0, seed=5))


# name -> (metrics function, system, setup options, every metric)
# Loki's replica balance (the least work queued) reads each worker's state now that the engine owns the queues;
# before, a worker counted as running a batch from the task policy's last look at it, which could be before the
# batch ended. Before that change: loki (violations 0.4221621621621622, 781 dropped, accuracy 99.57356669638887,
# query violations 0.4188057502932432), loki-fail (0.4681081081081081, 779, 99.50395419049832,
# 0.442647098938869), inferline (0.4713513513513513, 0, 99.66362486528988, 0.46280585940696695), last-task
# (0.4145945945945946, 767, 99.57146748606894, 0.40265691917400914).
SYSTEM_PINS = {
    # Proteus' burst rule counts the seconds back from each arrival (burst_window "sliding", issue 46), not the
    # clock's whole seconds: bursts are planned for at the arrival that tips them. Before (violations, dropped,
    # accuracy, max accuracy drop, throughput): proteus (0.0905797101449275, 1075, 91.08747969054016,
    # 12.90774527872388, 359.76666666666665), proteus-fail (0.10187057633973706, 1209, 85.31040840604186,
    # 20.408873159968408, 355.3), proteus-load (0.10667340748230536, 1266, 91.21514258630448, 12.600462892936434,
    # 353.4)
    "proteus": (proteus_metrics, "proteus", {}, {
        "queries": 11868, "violation_ratio": 0.08720930232558144, "dropped": 1035, "late": 0, "rejected": 0,
        "accuracy": 91.17952016985137, "max_accuracy_drop": 12.080714226896973, "throughput_qps": 361.1}),
    # the overload rule's default is max-min (issue 47: under "uniform" the type served least capped every type's
    # share); only proteus-fail, whose failed workers overload it, plans differently. Before: (0.09361307718233902,
    # 1111, 84.70500464813611, 20.426433348833555, 358.56666666666666)
    "proteus-fail": (proteus_metrics, "proteus", {"fail_at_s": (8.0, 16.0)}, {
        "queries": 11868, "violation_ratio": 0.09100101112234582, "dropped": 1080, "late": 0, "rejected": 0,
        "accuracy": 84.62752532443459, "max_accuracy_drop": 20.582695728465964, "throughput_qps": 359.6}),
    "proteus-load": (proteus_metrics, "proteus", {"load_ms": 500.0}, {
        "queries": 11868, "violation_ratio": 0.10347152005392657, "dropped": 1228, "late": 0, "rejected": 0,
        "accuracy": 91.31516229323309, "max_accuracy_drop": 11.785740752637224, "throughput_qps": 354.6666666666667}),
    "clipper-ha": (proteus_metrics, "clipper-ha", {}, {
        "queries": 11868, "violation_ratio": 0.649561846983485, "dropped": 4868, "late": 2841, "rejected": 0,
        "accuracy": 100.0, "max_accuracy_drop": 0.0, "throughput_qps": 138.63333333333333}),
    "infaas-accuracy": (proteus_metrics, "infaas-accuracy", {}, {
        "queries": 11868, "violation_ratio": 0.1287495786990226, "dropped": 1528, "late": 0, "rejected": 0,
        "accuracy": 86.09337307543521, "max_accuracy_drop": 18.278036414915334, "throughput_qps": 344.6666666666667}),
    # Loki's latency budget defaults to the paper's 1 x l (issue 30); under the proportional rule, the default
    # before: loki (0.42324324324324325, 775, 99.576298317535, 0.4176600561935677), loki-fail (0.4210810810810811,
    # 779, 99.48438940598189, 0.417878283641125)
    # An event admits everything it brings, then the policies decide once (issue 43): a batch's follow-ups (the
    # next stages' queries) all reach their queues before any is dispatched, so the first no longer runs alone on an
    # idle replica. Mean batch 2.852 -> 2.907 (loki), 3.006 -> 3.079 (loki-fail), 4.803 -> 4.828 (inferline),
    # 3.370 -> 3.443 (last-task dropping). Before: loki (0.5205405405405406, 963, 99.5646098991387,
    # 0.5121252625548978), loki-fail (0.5227027027027027, 967, 99.45984684822855, 0.5148258272184184, rerouted 0),
    # inferline (0.4681081081081081, 0, 99.66362486528986, 0.46305136528546875), last-task (0.4151351351351351, 768,
    # 99.57443576952187, 0.40328432308573614)
    # Issue 44: Loki's latency budget defaults to the artifact's 2 x l (the paper's 1 x l met 10 frames/s at most on
    # 20 workers) and, before a batch runs, a query that can no longer meet its frame's SLO is dropped (ours; the
    # paper checks only once a query has run, so the burst's backlog was served to its end, late). Under 2 x l alone
    # loki gave 0.42756756756756753 (791 dropped, accuracy 99.57453995433929, query violations 0.4235521972776126);
    # before both: loki (0.5221621621621622, 966, 99.56361530105713, 0.5137892468425216), loki-fail
    # (0.5221621621621622, 966, 99.45776840878496, 0.5132709566545732, rerouted 19). Rerouting finds no backup here:
    # a hardware-scaling plan hosts the top variants only, none faster than another.
    "loki": (loki_metrics, "loki", {}, {
        "frames": 1850, "violation_ratio": 0.21297297297297302, "dropped_frames": 394, "accuracy": 99.507322974284,
        "query_violation_ratio": 0.17747172769006825, "rerouted": 0}),
    # and no query goes to, or waits on, a lost worker: it goes to a healthy replica of its variant, else to the
    # task's least busy worker (before: 0.4713513513513513, 776, 99.51203425762948, 0.4467934204424562)
    "loki-fail": (loki_metrics, "loki", {"fail_at_s": (4.0, 9.0)}, {
        "frames": 1850, "violation_ratio": 0.21351351351351355, "dropped_frames": 395, "accuracy": 99.36547347172021,
        "query_violation_ratio": 0.1773877505318553, "rerouted": 0}),
    "inferline": (loki_metrics, "inferline", {}, {
        "frames": 1850, "violation_ratio": 0.4664864864864865, "dropped_frames": 0, "accuracy": 99.66362486528986,
        "query_violation_ratio": 0.4616874437382362, "rerouted": 0}),
    # Proteus-per-task plans with the comparison's headroom (1.25 here), as Loki and InferLine do (issue 30); with
    # 1.0 before: 0.08162162162162168, 151, 99.4175732499357, 0.01699570815450646
    "proteus-per-task": (loki_metrics, "proteus-per-task", {}, {
        "frames": 1850, "violation_ratio": 0.05837837837837834, "dropped_frames": 108, "accuracy": 97.55577922133364,
        "query_violation_ratio": 0.011558926059568209, "rerouted": 0}),
    "last-task dropping": (loki_metrics, "last-task dropping", {}, {
        "frames": 1850, "violation_ratio": 0.4075675675675675, "dropped_frames": 754, "accuracy": 99.57097168690849,
        "query_violation_ratio": 0.4001745819580458, "rerouted": 0}),
}


@pytest.mark.parametrize("case", sorted(SYSTEM_PINS))
def test_systems_match_pinned_results(case):
    """Proteus and Loki (and the systems they are compared with) give the pinned metrics in the simulator."""
    metrics, system, setup, pinned = SYSTEM_PINS[case]
    assert metrics(system, **setup) == pytest.approx(pinned, rel=1e-12)


def hybridserve_metrics() -> dict:
    """A three-model cascade on two replicas each (a synthetic family: the pin must not depend on a build's weights),
    4 s of gamma arrivals at 900/s with a 40 ms SLO: escalations are follow-up queries on the next model's queue."""
    from scheduler_sidecar.experiments.hybridserve.simulation import simulate  # this test's only
    from tests.builders import synthetic_cascade  # this test's only

    family, cascade, predictions = synthetic_cascade()
    arrival_us = (np.asarray(traces.gamma(rate_qps=900, cv2=4, duration_s=4.0, seed=3).arrival_s) * 1e6).astype(
        np.int64)
    run = simulate(family, cascade, (2, 2, 2), predictions, arrival_us, 40.0, seed=1)
    per_model = {f"{what}.{m}": value for what in ("answered", "mean_batch", "mean_wait_ms")
                 for m, value in zip("sml", getattr(run, what))}
    return {"requests": run.requests, "violation_ratio": run.violation_ratio, "accuracy": run.accuracy, **per_model}


# Escalations all reach the next model's queue before its policy decides (issue 43: no re-entry): m's and l's
# batches grow and wait less. Before: violation_ratio 0.018826739427012296, accuracy 0.9724694104560623, answered.l
# 0.2998635743519782, mean_batch m 1.5151750972762645 and l 1.9079861111111112, mean_wait_ms m 0.9128279404211608
# and l 5.411202911737943
HYBRIDSERVE_PIN = {
    "requests": 3665, "violation_ratio": 0.013642564802182844, "accuracy": 0.9726141078838174,
    "answered.s": 0.4687585266030014, "answered.m": 0.2125511596180082, "answered.l": 0.30504774897680764,
    "mean_batch.s": 1.5008190008190008, "mean_batch.m": 1.5959016393442622, "mean_batch.l": 2.0476190476190474,
    "mean_wait_ms.s": 0.3016944065484311, "mean_wait_ms.m": 0.6687324088341037, "mean_wait_ms.l": 4.843921288014311,
}


def test_a_hybridserve_cascade_matches_its_pin():
    """The cascade's simulation (escalations as follow-up queries) gives the pinned metrics."""
    assert hybridserve_metrics() == pytest.approx(HYBRIDSERVE_PIN, rel=1e-12)
