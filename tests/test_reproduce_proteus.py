"""`accscale reproduce proteus` end to end on the first seconds of the trace: every figure's rows, files and plots."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scheduler_sidecar.cli import main
from scheduler_sidecar.experiments.proteus.reproduce import BATCHING, GAMMA_SHAPE, constant_arrivals
from scheduler_sidecar.experiments.proteus.systems import ABLATIONS, SYSTEMS


@pytest.mark.slow
def test_reproduce_proteus_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "proteus"
    assert main(["reproduce", "proteus", "--seconds", "10", "--fig6-s", "2", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for name in ("fig4.csv", "fig6.csv", "fig7.csv", "fig4.png", "fig6.png", "fig7.png", "summary.md"):
        assert (out / name).stat().st_size > 0
    fig4 = {(r["load"], r["system"]): r for r in result["fig4"]}
    assert {s for _, s in fig4} == set(SYSTEMS) and {ld for ld, _ in fig4} == {"trace", "x1.6"}
    assert {r["system"] for r in result["fig7"]} == {"proteus", *ABLATIONS}
    assert len(result["fig6"]) == 3 * len(BATCHING)
    for load in ("trace", "x1.6"):  # the least accurate variants cost about 18 points
        assert fig4[load, "clipper-ht"]["accuracy"] < fig4[load, "proteus"]["accuracy"] - 15
        assert fig4[load, "proteus"]["late"] == 0
    assert "## Fig. 7: ablation" in (out / "summary.md").read_text()


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
