"""`accscale reproduce loki` end to end on a short trace, and `accscale bench milp --system loki`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scheduler_sidecar.cli import main
from scheduler_sidecar.experiments.loki.reproduce import (
    ARTIFACT_BETA,
    AS_THE_ARTIFACT,
    OVER_CAPACITY,
    PAPERS_READING,
    WITHIN_HEADROOM,
    poisson_seconds,
    trace_arrivals,
)
from scheduler_sidecar.experiments.loki.systems import ABLATIONS, SYSTEMS
from scheduler_sidecar.systems.loki.policy import BUDGETS

# What this short run (6 s of trace, a 2-level capacity sweep, Fig. 7 over 1 s) says of each claim, and why one
# does not hold: a change either way fails here until the list is updated.
CLAIMS = {
    "fig1.phase_order": True,
    # the published profile serves about 205 frames/s on 20 workers at the top variants (the paper's cluster ~560),
    # and a weak detector finds 2.0 cars per frame against yolov5x's 17.8, so the servable demand grows far more
    "fig1.hardware_end_qps": False,
    "fig1.max_gain": False,
    # the artifact's 2 x l and the drop of hopeless queries (issue 44): Loki serves 300 frames/s within 1%, InferLine 40
    "fig5.capacity_over_inferline": True,
    # the trace's first 6 s min-max scaled alone swing 50 -> 425 frames/s within seconds: Loki's plan, made from
    # one-second counts, trails each jump and misses 80% (Proteus-per-task 28%); on the whole trace Loki misses 7%
    "fig5.fewer_violations_than_proteus": False,
    "fig5.fewest_offpeak_workers": True,  # all keep their 20 workers in 6 s: a tie
    # the social-media pipeline over the same 6 s: Loki misses 29% of the frames, InferLine 2.8x as many (paper: more
    # than 5x), Proteus-per-task 19%; Loki gives up 0.8 points of accuracy, Proteus-per-task 5.8
    "fig6.inferline_peak_violations_over_loki": False,
    "fig6.fewer_violations_than_proteus": False,
    "fig6.fewest_offpeak_workers": True,  # a tie at 20 again
    "fig6.accuracy_sacrifice": False,
    "fig6.less_drop_than_proteus": True,
    # over the plan's capacity for 1 s no backlog builds that dropping could clear: last-task dropping, which drops
    # only what can no longer make it, violates least (41.5% of frames against 50.1% per task and 52.2% with none);
    # under 1 x l per-task dropping and rerouting drop 94% (the full run's 3 x 30 s: issue 44's note)
    **{f"fig7.{budget}.{count}_violation_order": False for budget in ("paper", "artifact", "proportional")
       for count in ("frame", "query")},
    # Fig. 8 at 200 and 400 ms on 6 s: at 400 ms the plan batches more and the swings catch it with longer queues
    # (94% against 73%); 10 s of trace gave the opposite
    "fig8.violations_fall": False,
    "fig8.artifact_period.violations_fall": False,  # 6 s is the first plan's and few more: the period hardly acts
    "fig8.drop_falls": True,
}


# claims on wall-clock time: under the suite's load the MILP's median solve ran past the paper's 1 s once (fresh run,
# issue 43), so the test checks the claim's arithmetic, not its outcome
TIMED = {"fig1.milp_time"}


@pytest.mark.slow
def test_reproduce_loki_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "loki"
    assert main(["reproduce", "loki", "--seconds", "6", "--fig1-step", "150", "--capacity-s", "4", "--levels", "40,300",
                 "--fig7-s", "1", "--fig7-seeds", "1", "--fig8-slos", "200,400", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for name in ("summary.md", *(f"fig{k}.{ext}" for k in (1, 5, 6, 7, 8) for ext in ("csv", "png"))):
        assert (out / name).stat().st_size > 0
    phases = result["fig1"]
    assert phases["hardware_end_qps"] < phases["classifier_end_qps"] < phases["max_qps"]
    fig5 = {r["system"]: r for r in result["fig5"]}
    # the three systems, and Loki with the paper's headroom, under the paper's and our budgets, each other check
    # before a batch, and as the paper's text reads
    assert set(fig5) == {*SYSTEMS, "loki (headroom 1, the paper's)", "loki (paper budget)",
                         "loki (proportional budget)", "loki (checked before a batch: none)",
                         "loki (checked before a batch: artifact)", PAPERS_READING}
    assert fig5[PAPERS_READING]["violation_ratio"] > fig5["loki"]["violation_ratio"]
    assert [r["system"] for r in result["fig6"]] == list(SYSTEMS)
    # every mode under every budget over the plan's capacity; under the artifact's, within the headroom too, and as
    # the artifact plans it (per-task dropping and rerouting at beta 1 and 1.05)
    assert {(r["system"], r["budget"], r["load"]) for r in result["fig7"]} == {
        *((s, b, OVER_CAPACITY) for s in ABLATIONS for b in BUDGETS), *((s, "artifact", WITHIN_HEADROOM) for s in ABLATIONS),
        *((s, "artifact", AS_THE_ARTIFACT) for s, _ in ARTIFACT_BETA)}
    beta = {(r["system"], r["headroom"]): r for r in result["fig7"] if r["load"] == AS_THE_ARTIFACT}
    assert beta["rerouting", 1.0]["rerouted"] == 0  # at beta 1 no backup fits a late crop: rerouting is per-task dropping
    # a dropped frame compared with last-task dropping's outcome for it: last-task dropping never meets a frame it
    # dropped, no dropping drops none, and no mode counts more than it dropped
    for row in result["fig7"]:
        if row["load"] == AS_THE_ARTIFACT:
            assert row["dropped_met_by_last_task"] == ""  # no last-task run at that beta to compare with
            continue
        assert 0 <= row["dropped_met_by_last_task"] <= row["dropped_frames"]
        if row["system"] in ("no dropping", "last-task dropping"):
            assert row["dropped_met_by_last_task"] == 0
    # Fig. 8 re-planning every 10 s (the paper's) and every 1 s (the artifact's), each SLO's violations split
    assert [(r["period_s"], r["slo_ms"]) for r in result["fig8"]] == [(10.0, 200.0), (10.0, 400.0), (1.0, 200.0),
                                                                      (1.0, 400.0)]
    assert all(0 <= r["over_plan_share"] <= 1 for r in result["fig8"])
    capacity = {r["system"]: r for r in result["fig5"]}["loki"]
    assert capacity["capacity_at_5pct_qps"] >= capacity["effective_capacity_qps"]  # the looser bar serves as much
    held = {c["id"]: c for c in result["claims"]}
    assert {k: c["holds"] for k, c in held.items() if k not in TIMED} == CLAIMS
    # a solve time is the machine's and its load's: the claim must say what its own numbers say, whichever way
    timed = held["fig1.milp_time"]
    median_s, paper_s = float(timed["ours"].split()[1]), float(timed["paper"].strip("~").split()[0])
    assert median_s > 0 and timed["holds"] == (median_s <= paper_s)
    summary = (out / "summary.md").read_text()
    assert "## Fig. 7" in summary and all(c["statement"] in summary for c in result["claims"])


def test_the_trace_is_scaled_into_the_artifacts_range():
    arrivals, rates = trace_arrivals(None, seed=0)
    assert rates.min() == pytest.approx(50) and rates.max() == pytest.approx(425)
    assert len(arrivals) == pytest.approx(rates.sum(), rel=0.02) and np.all(np.diff(arrivals) >= 0)
    assert len(poisson_seconds(np.full(10, 100.0), seed=1)) == pytest.approx(1000, rel=0.1)


def test_bench_milp_reports_the_solve_times(capsys):
    assert main(["bench", "milp", "--system", "loki", "--solves", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["hardware_solves"] >= 1 and out["accuracy_solves"] >= 1
    assert 0 < out["hardware_step_max_s"] < out["accuracy_step_median_s"] and out["routing_ms"] > 0
