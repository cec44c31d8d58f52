"""HybridServe live (``accscale demo hybridserve``, short): the cascade behind the sidecar and its HybridServe
planner on a real Triton, against the largest model alone on the same instances, AP on the whole family and pruned
by Algorithm 2 (EO's cascades are served by the same code; the planner's tests hold both modes' plans)."""

from __future__ import annotations

import csv

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.triton]


def test_the_demo_serves_cheaper_cascades_live(tmp_path, monkeypatch, hybridserve_family):
    from scheduler_sidecar.cli import main
    from scheduler_sidecar.experiments.hybridserve import demo as hybridserve_demo
    from scheduler_sidecar.experiments.hybridserve.energy import CPU_MODEL, CPU_WATTS_PER_BUSY_CORE

    monkeypatch.setattr(hybridserve_demo, "nvml_meter", lambda: None)  # the same on a host with GPUs
    out = tmp_path / "demo"
    # 8 BLS and 8 model instances, not the demo's 64 and 16: every Triton load and sidecar warm-up costs a process
    # start per instance; the shapes asserted hold at either size
    assert main(["demo", "hybridserve", "--bls-instances", "8", "--instances", "8", "--warmup-s", "2", "--saturate-s", "3",
                 "--duration-s", "2", "--modes", "ap",
                 "--rate-qps", "200", "--build-dir", str(hybridserve_family.folder.parent), "--out", str(out)]) == 0
    with open(out / "modes.csv") as f:
        modes = {r["mode"]: r for r in csv.DictReader(f)}
    assert set(modes) == {"largest", "ap", "ap-pruned"}
    names = [m.removeprefix("cascade_") for m in hybridserve_family.names]
    for mode in ("ap",):  # the pruned cascade is the planner's: what Algorithm 2 keeps, skips where they pay
        pruned = modes[f"{mode}-pruned"]["models"].split()
        assert modes[mode]["models"].split() == names and pruned[-1] == names[-1] and set(pruned) <= set(names)
        assert len(modes[f"{mode}-pruned"]["instances"].split()) == len(pruned)
    # compute worker-seconds per request, the models' own counter: the cascade below the largest model alone (1.4x in
    # this machine's build, 2.8x in a fresh clone's)
    cost = {m: float(r["worker_ms_per_request"]) for m, r in modes.items()}
    assert cost["ap"] < cost["largest"]
    # Triton's busy time includes each batch's emulated sleep; the compute the models count leaves it out
    assert all(float(r["busy_ms_per_request"]) > float(r["worker_ms_per_request"]) > 0 for r in modes.values())
    assert {r["energy_source"] for r in modes.values()} == {CPU_MODEL}
    energy = {m: float(r["energy_mj_per_request"]) for m, r in modes.items()}
    assert all(energy[m] == pytest.approx(cost[m] * CPU_WATTS_PER_BUSY_CORE, abs=1e-3) for m in modes)
    # the shape, not a fraction of the cost model's prediction (what a loaded 2-core machine reaches varies): every
    # cascade serves more requests a second than the largest model alone on the same instances
    for mode, r in modes.items():
        assert float(r["throughput_rps"]) > 0 and float(r["capacity_rps"]) > 0
        if mode != "largest":
            assert float(r["throughput_vs_largest"]) > 1.0
    with open(out / "pruning.csv") as f:
        assert [r["mode"] for r in csv.DictReader(f)] == ["ap"]
    with open(out / "replay.csv") as f:
        replays = {r["mode"]: r for r in csv.DictReader(f)}
    for mode, r in replays.items():
        assert int(r["met"]) + int(r["late"]) + int(r["refused"]) == int(r["sent"]) > 0
        assert float(r["accuracy"]) > 85.0
        # behind the sidecar, the models that answered are the planner's cascade's, the first of them included:
        # the BLS's deployed plan is AP pruned, so an answer by the whole family's first model is the plan sent
        answered = [m.split(":")[0].removeprefix("cascade_") for m in r["answered_by"].split()]
        cascade = modes[mode]["models"].split()
        assert set(answered) <= set(cascade) and cascade[0] in answered
    summary = (out / "summary.md").read_text()
    assert "Saturation" in summary and "Pruning (Algorithm 2) live" in summary
