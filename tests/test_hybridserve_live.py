"""HybridServe live (``accscale demo hybridserve``, short): the cascade behind the sidecar on a real Triton, against
the largest model alone on the same instances."""

from __future__ import annotations

import csv

import pytest

pytestmark = pytest.mark.slow


def test_the_demo_serves_cheaper_cascades_live(tmp_path, hybridserve_family):
    from scheduler_sidecar.cli import main

    out = tmp_path / "demo"
    assert main(["demo", "hybridserve", "--warmup-s", "3", "--saturate-s", "6", "--duration-s", "3",
                 "--rate-qps", "200", "--build-dir", str(hybridserve_family.folder.parent), "--out", str(out)]) == 0
    with open(out / "modes.csv") as f:
        modes = {r["mode"]: r for r in csv.DictReader(f)}
    cost = {m: float(r["worker_ms_per_request"]) for m, r in modes.items()}
    assert cost["eo"] < cost["ap"] < cost["largest"]  # measured worker-seconds per request, from Triton
    energy = {m: float(r["energy_mj_per_request"]) for m, r in modes.items()}
    assert energy["eo"] < energy["ap"] < energy["largest"]  # no GPU here: the CPU power model's
    for mode in ("ap", "eo"):
        # the cascade serves at least 0.8 of the throughput the cost model predicts for its deployed instances
        assert float(modes[mode]["throughput_vs_largest"]) > 1.0
        assert float(modes[mode]["measured_over_replicas"]) >= 0.8
    with open(out / "replay.csv") as f:
        replays = list(csv.DictReader(f))
    for r in replays:
        assert int(r["met"]) + int(r["late"]) + int(r["refused"]) == int(r["sent"]) > 0
        assert float(r["accuracy"]) > 85.0
    assert "Saturation" in (out / "summary.md").read_text()
