"""Open-loop replay through the sidecar, and the live-vs-simulator fidelity command, on a real Triton."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from loadtest.replay import replay
from loadtest.traces import constant, with_slo
from scheduler_sidecar.cli import main
from scheduler_sidecar.serve import SidecarServer

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def test_replay_scores_every_query(fast_build, triton):
    trace = with_slo(constant(40.0, 1.5), 500.0)
    with SidecarServer(workers=[triton.grpc_url], profile=fast_build.profile_path) as sidecar:
        result = asyncio.run(replay(sidecar.grpc_url, "digits", trace, default_slo_ms=36.0))
    summary = result.summary()
    assert summary["queries"] == len(trace) == 60
    assert summary["answered"] + sum(summary["errors"].values()) == 60
    assert summary["answered"] == 60 and summary["met"] <= 60
    accuracies = {round(v.accuracy, 6) for v in fast_build.profile.variants}  # as the profile file stores them
    assert all(round(float(a), 6) in accuracies for a in result.accuracy[~np.isnan(result.accuracy)])
    lo, hi = min(accuracies), max(accuracies)
    assert summary["met"] == 0 or lo <= summary["mean_serving_accuracy"] <= hi


def test_fidelity_command_compares_live_and_simulated(fast_build, tmp_path, capsys):
    trace = tmp_path / "trace.txt"
    constant(30.0, 2.0).save(trace)
    assert main(["bench", "fidelity", "--profile", str(fast_build.profile_path), "--repository",
                 str(fast_build.repository), "--trace", str(trace), "--slo-ms", "200", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["queries"] == result["live"]["queries"] == 60
    assert result["simulated"]["met"] + result["simulated"]["late"] + result["simulated"]["dropped"] == 60
    for side in (result["live"], result["simulated"]):
        assert 0.0 <= side["slo_attainment"] <= 1.0
    assert result["attainment_gap_pts"] == pytest.approx(
        100 * (result["live"]["slo_attainment"] - result["simulated"]["slo_attainment"]), abs=0.01)
