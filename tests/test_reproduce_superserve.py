"""`accscale reproduce superserve`: which runs it plans (nothing is simulated here)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

from loadtest import traces
from scheduler_sidecar.cli import main
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.experiments.superserve import reproduce
from tests.builders import make_profile


def clippers(profile) -> list[tuple[str, str]]:
    """(display name, variant id) of the planned Clipper+ runs."""
    return [(name, dict(options)["variant_id"]) for name, registry, options in reproduce.policy_runs(profile)
            if registry == "clipper"]


def test_clipper_plus_runs_the_papers_own_versions_on_the_paper_profile():
    profile = Profile.load(reproduce.PAPER_PROFILE)
    named = profile.metadata["named_variants"]
    runs = clippers(profile)
    assert [name for name, _ in runs] == ["clipper(73.82)", "clipper(75.10)", "clipper(76.69)", "clipper(78.25)",
                                          "clipper(79.44)", "clipper(80.16)"]
    ids = [variant_id for _, variant_id in runs]
    assert len(set(ids)) == 6
    assert {named["76.69"], named["78.25"], named["79.44"]} <= set(ids)
    assert [name for name, registry, _ in reproduce.policy_runs(profile) if registry != "clipper"] == [
        "slackfit", "maxacc", "maxbatch", "infaas"]


def test_a_profile_that_names_no_clipper_version_runs_six_spread_in_accuracy():
    profile = make_profile(12, (1, 2, 4))
    assert [variant_id for _, variant_id in clippers(profile)] == [v.id for v in profile.spread(6)]
    # a named Clipper+ version outside the spread (v5) replaces the spread one nearest in accuracy (v4); one
    # inside it (v9) changes nothing; a named variant that is no Clipper+ version (73.82 %, v1) is not run
    assert [v.id for v in profile.spread(6)] == ["v0", "v2", "v4", "v7", "v9", "v11"]
    named = replace(profile, metadata={"named_variants": {"76.69": "v5", "79.44": "v9", "73.82": "v1"}})
    assert [variant_id for _, variant_id in clippers(named)] == ["v0", "v2", "v5", "v7", "v9", "v11"]


def test_fig10_refuses_a_duration_in_which_its_ramps_cannot_reach_rate2(tmp_path, capsys):
    """Ramps start a quarter in; the slowest (2500 -> 7800 q/s at 250 q/s²) takes 21.2 s, so 28.27 s at least."""
    profile = make_profile(6)
    assert reproduce.fig10_min_duration_s() == pytest.approx(21.2 * 4 / 3)
    for figure in ("10", "all"):
        with pytest.raises(ValueError, match=r"Fig\. 10 needs --duration-s above 28\.27, got 28"):
            reproduce.plan(figure, profile, 28.0, seed=1)
    assert len(reproduce.plan("9", profile, 5.0, seed=1)) == 9 * 10  # Fig. 9 has no ramp
    assert main(["reproduce", "superserve", "--figure", "10", "--duration-s", "10", "--jobs", "1",
                 "--out", str(tmp_path / "out")]) == 2
    assert "Fig. 10 needs --duration-s above 28.27" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_fig10_cells_at_the_shortest_duration_get_distinct_traces_that_end_at_rate2():
    duration_s = 28.5
    specs = {r.cell: r.trace for r in reproduce.plan("10", make_profile(6), duration_s, seed=1)}
    assert len(specs) == 9
    made = {}
    for cell, (generator, kwargs) in specs.items():
        made[cell] = getattr(traces, generator)(**dict(kwargs))
        kwargs = dict(kwargs)
        # the ramp ends inside the trace: after it the generator runs at rate2, the cell's own
        assert kwargs["ramp_start_s"] + (kwargs["rate2_qps"] - kwargs["rate1_qps"]) / kwargs["tau_qps2"] < duration_s
    for (a, ta), (b, tb) in itertools.combinations(made.items(), 2):
        assert len(ta) != len(tb) or not np.array_equal(ta.arrival_s, tb.arrival_s), (a, b)


# What the short runs below say of each claim (a change either way fails here until the list is updated): Fig. 9 on
# 2 s traces (30 s in a full run), Fig. 11a as the paper runs it.
CLAIMS = {
    # the largest gain over the most accurate baseline at 0.9999 attainment is 1.72 points (Clipper+(75.10), at
    # λv 5550, CV² 8), not 4.33: a Clipper+ version keeps that attainment in every cell where SlackFit does (1.8 points
    # below it at most in a full run), and the paper's 4.33 is its INFaaS gap (its cause: "the paper")
    "fig9.accuracy_gain": False,
    "fig9.infaas_gap": True,  # 5.07 points over INFaaS, which serves its least accurate model
    "fig9.attainment_ratio": True,  # 2.60x over the Clipper+ closest in accuracy
    "fig11a.attainment": True,  # 1.0 with 4 of 8 workers left
    "fig11a.accuracy_falls": True,  # 79.16 > 79.00 > 78.65 > 78.04 > 76.91 % between the failures
}


@pytest.mark.slow
def test_reproduce_superserve_holds_its_claims(tmp_path, capsys):
    held, causes = {}, {}
    for figure, seconds in (("9", "2"), ("11a", "30")):  # Fig. 11a's length is the paper's, not --duration-s
        out = tmp_path / figure
        assert main(["reproduce", "superserve", "--figure", figure, "--duration-s", seconds, "--jobs", "2",
                     "--json", "--out", str(out)]) == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        held |= {c["id"]: c["holds"] for c in result["claims"]}
        causes |= {c["id"]: c["cause"].split(":")[0] for c in result["claims"] if not c["holds"]}
        summary = (out / "summary.md").read_text()
        assert all(c["statement"] in summary for c in result["claims"])
    assert held == CLAIMS
    assert causes == {"fig9.accuracy_gain": "the paper"}  # computed: INFaaS's gap reaches the paper's number
