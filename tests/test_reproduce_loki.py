"""`accscale reproduce loki` end to end on a short trace, and `accscale bench milp --system loki`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scheduler_sidecar.cli import main
from scheduler_sidecar.experiments.loki.reproduce import poisson_seconds, trace_arrivals
from scheduler_sidecar.experiments.loki.systems import ABLATIONS, SYSTEMS


@pytest.mark.slow
def test_reproduce_loki_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "loki"
    assert main(["reproduce", "loki", "--seconds", "10", "--fig1-step", "150", "--capacity-s", "4",
                 "--levels", "40,150,300", "--fig7-s", "2", "--fig7-seeds", "1", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for name in ("fig1.csv", "fig5.csv", "fig7.csv", "fig1.png", "fig5.png", "fig7.png", "summary.md"):
        assert (out / name).stat().st_size > 0
    phases = result["fig1"]
    assert phases["hardware_end_qps"] < phases["classifier_end_qps"] < phases["max_qps"]
    fig5 = {r["system"]: r for r in result["fig5"]}
    assert set(SYSTEMS) < set(fig5)
    # past hardware scaling InferLine cannot keep up at 300 frames/s; Loki scales accuracy instead
    assert fig5["loki"]["effective_capacity_qps"] > fig5["inferline"]["effective_capacity_qps"]
    assert fig5["inferline"]["accuracy"] >= fig5["loki"]["accuracy"]
    assert {r["system"] for r in result["fig7"]} >= set(ABLATIONS)
    assert "## Fig. 7" in (out / "summary.md").read_text()


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
