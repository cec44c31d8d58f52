"""`accscale reproduce proteus` end to end on the first seconds of the trace: every figure's rows, files and plots."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from scheduler_sidecar.cli import main
from scheduler_sidecar.experiments.claims import Claim, least
from scheduler_sidecar.experiments.proteus.data import (
    BURSTY,
    PAPER_CLUSTER,
    TRACE_SLO_MS,
    load_counts,
    load_profiles,
)
from scheduler_sidecar.experiments.proteus.reproduce import (
    BATCHING,
    GAMMA_SHAPE,
    OVERLOADED,
    as_coded,
    beyond_fig4s_load,
    bursts,
    classified,
    constant_arrivals,
    load_levels,
    overloaded_sommelier,
)
from scheduler_sidecar.experiments.proteus.systems import ABLATIONS, ARTIFACT, ARTIFACT_INFAAS, SYSTEMS, Setup

# What this short run (the trace's first 10 s; Fig. 6 over 2 s) says of each claim. A claim that holds is held; one
# that does not is held as not holding, with why: a change either way fails here until the list is updated.
CLAIMS = {
    **{f"fig4.{load}.{claim}": holds for load in ("trace", "x1.6") for claim, holds in {
        "fewest_violations": True,
        # Sommelier plans the same variants as Proteus over 10 s (one plan), so their drops tie: not "smaller"
        "max_drop_order": False,
        "violations_infaas-accuracy_over_proteus": True,  # Proteus has none, INFaaS-Accuracy some: infinitely more
        # in 10 s neither Sommelier nor Clipper-HA violates any more than Proteus (none), so no ratio above 1
        "violations_sommelier_over_proteus": False,
        "violations_clipper-ha_over_proteus": False,
        "throughput_over_clipper_ha": False,  # nothing is late in 10 s: both serve the whole demand
    }.items()},
    # 2 s of 1,000 q/s: Nexus' work-conserving batches fill before Proteus' adaptive ones wait out their slack
    "fig6.poisson.proteus_fewest": False,
    "fig6.gamma.proteus_fewest": False,
    "fig6.uniform.all_fine": False,  # at 1,000 q/s AIMD, still ramping up in 2 s, violates 17% (the cause: below)
    # no plan change in 10 s: the ablations that act through plans (MS, MP) cannot show; w/o AB violates most
    **{f"fig7.{load}.{claim}": False for load in ("trace", "x1.6", "overloaded")
       for claim in ("wo_ms_most_violations", "wo_mp_largest_drop")},
    # Fig. 8 at SLO multiples 1 and 3 (Sommelier ties Proteus in 10 s at x1). At x3, since Proteus' burst rule counts
    # the seconds back from each arrival (issue 46), its burst plan comes at another instant and Sommelier, which
    # keeps every worker on its type, violates 0.57% against Proteus' 0.64% in these 10 s (a tie before)
    **{f"fig8.x{k}.{claim}": True for k in (1, 3) for claim in ("fewest_violations", "smallest_drop")},
    "fig8.x3.fewest_violations": False,
    "fig8.proteus_steady_throughput": True,
    # the bursty trace's first burst starts at 47 s: in 10 s every scaling system meets every query with the same
    # plans, so these hold by a tie (the burst claim, fig5.violations_fall_after_replanning, needs a burst)
    "fig5.fewest_violations": True, "fig5.smallest_drop": True,
}


@pytest.mark.slow
def test_reproduce_proteus_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "proteus"
    assert main(["reproduce", "proteus", "--seconds", "10", "--fig6-s", "2", "--fig8-multiples", "1,3", "--overloaded", "2",
                 "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for name in ("summary.md", *(f"fig{k}.{ext}" for k in (4, 5, 6, 7, 8) for ext in ("csv", "png"))):
        assert (out / name).stat().st_size > 0
    fig4 = {(r["load"], r["system"]): r for r in result["fig4"]}
    coded = {a.name for a in ARTIFACT.values()}  # the systems as the authors' code runs them, beside the text's
    assert ARTIFACT_INFAAS.name in coded and {s for _, s in fig4} == {*SYSTEMS, *coded}
    assert {ld for ld, _ in fig4} == {"trace", "x1.6"}
    assert {r["system"] for r in result["fig7"]} == {"proteus", *ABLATIONS}
    assert {r["load"] for r in result["fig7"]} == {"trace", "x1.6", OVERLOADED}
    assert [r["system"] for r in result["fig5"]] == [*SYSTEMS, "proteus (artifact settings)", ARTIFACT_INFAAS.name]
    assert len(result["fig6"]) == 4 * len(BATCHING)  # uniform at two loads
    assert {(r["slo_multiple"], r["system"]) for r in result["fig8"]} == {(k, s) for k in (1.0, 3.0)
                                                                         for s in (*SYSTEMS, *coded)}
    for load in ("trace", "x1.6"):  # the least accurate variants cost about 18 points
        assert fig4[load, "clipper-ht"]["accuracy"] < fig4[load, "proteus"]["accuracy"] - 15
        assert fig4[load, "proteus"]["late"] == 0
    assert {c["id"]: c["holds"] for c in result["claims"]} == CLAIMS
    # the uniform claim's cause is "the paper" only where the batching the paper describes is all fine at Fig. 6's load;
    # in 2 s at 1,000 q/s its AIMD, still ramping up, violates 17% too, and at 500 q/s none of it violates: the load's
    held = {c["id"]: c for c in result["claims"]}
    for load in ("trace", "x1.6"):  # Clipper-HA meets every query: no system can serve 1.6x its throughput
        assert held[f"fig4.{load}.throughput_over_clipper_ha"]["cause"].startswith(
            "inputs: the load: Clipper-HA already meets 100.0% of the queries, so no system can serve more than 1.00x")
    uniform = {(r["qps"], r["batching"]): r["violation_ratio"] for r in result["fig6"] if r["arrivals"] == "uniform"}
    assert uniform[1000.0, "aimd"] > 0.01 and max(uniform[500.0, b] for b in BATCHING if "-" not in b) <= 0.01
    assert held["fig6.uniform.all_fine"]["cause"].startswith(
        "inputs: the load (the paper gives none): at 1000 q/s aimd violates")
    summary = (out / "summary.md").read_text()
    assert "## Fig. 7: ablation" in summary
    assert all(c["statement"] in summary for c in result["claims"])  # summary.md is written from the claims


@pytest.mark.slow
def test_the_overloaded_load_brings_the_traces_peak_to_what_the_cluster_serves_on_any_variants():
    """medium-normal_load at its own speed exceeds what the most accurate variants serve only at its peak (the
    MILP's capacity on the trace's mix: 954 q/s of a 1,065 q/s 10 s peak); the overloaded factor takes the peak to the
    capacity on any variants (about 3x), where the paper's "overload our system" is."""
    rows = {r["load"]: r for r in load_levels(Setup(load_profiles(), PAPER_CLUSTER, TRACE_SLO_MS), load_counts(),
                                              1.6, None)}
    trace, over = rows["trace"], rows[OVERLOADED]
    assert trace["ha_capacity_qps"] < trace["any_capacity_qps"] and trace["factor"] == 1.0
    assert 1.0 < trace["peak_over_ha_capacity"] < 1.5 and 0 < trace["seconds_over_ha_capacity"] < 60
    assert 1.0 <= over["peak_over_any_capacity"] < 1.05 and over["factor"] > rows["x1.6"]["factor"]


def test_a_claim_that_fails_on_a_light_load_and_holds_overloaded_is_the_loads():
    loads = [{"load": name, "factor": f, "peak_over_ha_capacity": f * 1.1, "ha_capacity_qps": 954.0,
              "seconds_over_ha_capacity": 26} for name, f in (("trace", 1.0), (OVERLOADED, 3.0))]
    found = classified([Claim("fig7.trace.wo_ms_most_violations", "s", "p", "w/o MS 0.007 < proteus 0.008", False),
                        Claim(f"fig7.{OVERLOADED}.wo_ms_most_violations", "s", "p", "w/o MS 0.19 > proteus 0.04", True),
                        Claim("fig7.trace.wo_mp_largest_drop", "s", "p", "o", False),
                        Claim(f"fig7.{OVERLOADED}.wo_mp_largest_drop", "s", "p", "o", False),
                        Claim("fig6.uniform.all_fine", "s", "p", "o", False)], loads)
    causes = [c.cause for c in found]
    assert causes[0].startswith("inputs: the load") and "w/o MS 0.19" in causes[0] and "x3" in causes[0]
    assert causes[1:] == ["", "", "", ""]  # holds; fails overloaded too; not a load's claim


def test_a_fig4_claim_that_holds_on_the_heavier_load_is_the_loads():
    """Fig. 4 runs no overloaded load: the twin is the heaviest load the claim holds on."""
    loads = [{"load": name, "factor": f, "peak_over_ha_capacity": f * 1.1, "ha_capacity_qps": 954.0,
              "seconds_over_ha_capacity": 26} for name, f in (("x1.6", 1.6), ("trace", 1.0), (OVERLOADED, 3.0))]
    found = classified([Claim("fig4.trace.violations_sommelier_over_proteus", "s", "p", "1.3x", False),
                        Claim("fig4.x1.6.violations_sommelier_over_proteus", "s", "p", "6.04x", True),
                        Claim("fig4.x1.6.violations_infaas_over_proteus", "s", "p", "1.4x", False),
                        Claim("fig4.trace.violations_infaas_over_proteus", "s", "p", "2.3x", False)], loads)
    causes = [c.cause for c in found]
    assert causes[0].startswith("inputs: the load") and "at x1.6 (x1.6" in causes[0] and "6.04x" in causes[0]
    assert causes[1:] == ["", "", ""]


def test_the_bursty_trace_has_the_papers_three_bursts():
    """§6.3's trace, imported: about 150 q/s with three bursts of about 40-50 s near 1,100 q/s."""
    counts = load_counts(BURSTY)
    assert counts.total == 175_818 and len(counts.per_second) == 292
    spans = bursts(counts)
    assert spans == [(47, 94), (141, 188), (235, 282)]
    total = counts.per_second.sum(axis=1)
    assert 140 < np.median(total) < 200 and all(900 < total[a:b].mean() < 1200 for a, b in spans)


def test_constant_arrivals_have_the_rate_and_the_burstiness_asked_for():
    mix = {"a": 0.75, "b": 0.25}
    cvs = {}
    for shape in ("uniform", "poisson", "gamma"):
        arrival, deadline, names = constant_arrivals(500.0, 200.0, shape, mix, seed=1, slo_ms=300.0)
        gaps = np.diff(arrival)
        assert len(arrival) == 100_000 and np.all(deadline - arrival == 300_000)
        assert arrival[-1] / 1e6 == pytest.approx(200.0, rel=0.05)
        assert names.count("a") / len(names) == pytest.approx(0.75, abs=0.01)
        cvs[shape] = gaps.std() / gaps.mean()
    assert cvs["uniform"] < 0.01 and cvs["poisson"] == pytest.approx(1.0, abs=0.05)
    assert cvs["gamma"] == pytest.approx(1 / np.sqrt(GAMMA_SHAPE), rel=0.2)


def test_bench_milp_times_proteus_along_its_trace_and_as_the_cluster_grows(capsys):
    assert main(["bench", "milp", "--system", "proteus", "--seconds", "10", "--scales", "1,4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["plans"] >= 1 and 0 < out["median_solve_s"] <= out["max_solve_s"]
    assert [g["devices"] for g in out["grid"]] == [40, 160] and all(g["solve_s"] > 0 for g in out["grid"])
    assert {c["id"]: c["holds"] for c in out["claims"]} == {"mean_solve": True, "largest_cluster": True}


def test_a_fig4_ratio_that_holds_on_the_papers_load_and_fails_heavier_is_the_loads():
    """The paper runs Fig. 4 on the trace at its own speed; on x1.6 Proteus' own violations grow faster than the
    artifact's INFaaS-Accuracy's, and the ratio falls below the paper's."""
    fig4 = [{"load": load, "system": s, "violation_ratio": v} for load, s, v in (
        ("trace", "proteus", 0.0081), ("trace", "infaas-accuracy", 0.0190), ("trace", ARTIFACT_INFAAS.name, 0.0421),
        ("x1.6", "proteus", 0.0185), ("x1.6", "infaas-accuracy", 0.0258), ("x1.6", ARTIFACT_INFAAS.name, 0.0496))]
    heavy = Claim("fig4.x1.6.violations_infaas-accuracy_over_proteus", "s", ">= 4.3x", "1.39x", False)
    cause = beyond_fig4s_load(heavy, fig4).cause
    assert cause.startswith("inputs: the load: on the trace at its own speed") and "violates 5.20x Proteus'" in cause
    assert "Proteus' violations are 2.28x the trace's" in cause and "(2.68x Proteus')" in cause
    on_the_trace = Claim("fig4.trace.violations_infaas-accuracy_over_proteus", "s", ">= 4.3x", "2.35x", False)
    assert beyond_fig4s_load(on_the_trace, fig4).cause == ""  # the paper's own load: not the load's
    fig4 = [r for r in fig4 if r["system"] != ARTIFACT_INFAAS.name]  # and no run that holds on the trace: nothing
    assert beyond_fig4s_load(heavy, fig4).cause == ""


def test_a_fig7_claim_that_fails_overloaded_and_holds_on_a_lighter_overload_is_the_loads():
    loads = [{"load": name, "factor": f, "peak_over_ha_capacity": f * 1.1, "peak_over_any_capacity": f * 0.35,
              "ha_capacity_qps": 954.0, "seconds_over_ha_capacity": 26} for name, f in
             (("trace", 0.8), ("x1.6", 1.6), (OVERLOADED, 2.9))]
    found = classified([Claim("fig7.trace.wo_mp_largest_drop", "s", "p", "w/o MP 2.3 > proteus 0.5", True),
                        Claim("fig7.x1.6.wo_mp_largest_drop", "s", "p", "w/o MP 5.7 > proteus 2.1", True),
                        Claim(f"fig7.{OVERLOADED}.wo_mp_largest_drop", "s", "p", "proteus 17.7 > w/o MP 12.9", False)],
                       loads)
    cause = found[2].cause
    assert cause.startswith("inputs: the load (the paper overloads its system by a factor it does not give): at x1.6")
    assert "w/o MP 5.7 > proteus 2.1" in cause and "peak 1.015x what the cluster serves on any variants" in cause
    trace_only = [replace(found[1], holds=False, cause=""), found[2].because("")]  # no lighter overload holds: none
    assert [c.cause for c in classified([found[0].because(""), *trace_only], loads)][1:] == ["", ""]


def test_a_claim_that_holds_as_the_authors_code_runs_the_systems_is_the_papers():
    rows = {"proteus": {"v": 0.023}, "sommelier": {"v": 0.037}, "infaas-accuracy": {"v": 0.017},
            ARTIFACT["proteus"].name: {"v": 0.018}, ARTIFACT["sommelier"].name: {"v": 0.069},
            ARTIFACT["infaas-accuracy"].name: {"v": 0.040}}
    check = partial(least, "fig8.x3.5.fewest_violations", "s", "p", expected="proteus")
    text = check({s: rows[s]["v"] for s in ("proteus", "sommelier", "infaas-accuracy")})
    cause = as_coded(text, rows, "v", ("proteus", "sommelier", "infaas-accuracy"), check).cause
    assert not text.holds and cause.startswith("the paper: as the authors' code runs them") and "proteus (0.018)" in cause
    rows[ARTIFACT["proteus"].name]["v"] = 0.05  # fails that way too: what was tried
    cause = as_coded(text, rows, "v", ("proteus", "sommelier", "infaas-accuracy"), check).cause
    assert cause.startswith("unclassified: as the authors' code runs them") and "it fails too" in cause


def test_sommelier_against_proteus_overloaded_is_fig7s_wo_mp():
    fig7 = [{"load": OVERLOADED, "system": "proteus", "violation_ratio": 0.035},
            {"load": OVERLOADED, "system": "w/o MP", "violation_ratio": 0.0999}]
    claim = Claim("fig4.trace.violations_sommelier_over_proteus", "s", ">= 2.8x", "1.06x", False)
    assert "violates 2.85x Proteus'" in overloaded_sommelier(claim, fig7).cause
    fig7[1]["violation_ratio"] = 0.05  # 1.43x: not the load either
    assert overloaded_sommelier(claim, fig7).cause == ""
