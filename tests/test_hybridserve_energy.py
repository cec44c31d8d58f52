"""HybridServe's energy per request: the GPUs' NVML counters where there are GPUs (a fake NVML here: this machine has
none), the CPU power model where there are not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scheduler_sidecar.experiments.hybridserve.energy import (
    CPU_MODEL,
    CPU_WATTS_PER_BUSY_CORE,
    nvml_meter,
    per_request_mj,
)


class FakeNvmlError(Exception):
    pass


def fake_nvml(counters_mj: list[int], *, supported: bool = True, driver: bool = True) -> SimpleNamespace:
    """pynvml's calls the meter makes, over GPUs whose energy counters read ``counters_mj`` (the test moves them)."""

    def init():
        if not driver:
            raise FakeNvmlError("NVML_ERROR_DRIVER_NOT_LOADED")

    def energy(handle):
        if not supported:
            raise FakeNvmlError("NVML_ERROR_NOT_SUPPORTED")
        return counters_mj[handle]

    return SimpleNamespace(NVMLError=FakeNvmlError, nvmlInit=init, nvmlDeviceGetCount=lambda: len(counters_mj),
                           nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetTotalEnergyConsumption=energy)


def test_the_meter_sums_every_gpus_counter_in_joules():
    counters = [1_000, 250_000]
    meter = nvml_meter(fake_nvml(counters))
    assert meter is not None and meter.source == "nvml"
    before = meter.joules()
    assert before == pytest.approx(251.0)
    counters[0] += 3_000  # 3 J on one GPU, 1.5 J on the other
    counters[1] += 1_500
    assert meter.joules() - before == pytest.approx(4.5)


@pytest.mark.parametrize("nvml", [fake_nvml([]), fake_nvml([5], supported=False), fake_nvml([5], driver=False)],
                         ids=["no GPU", "no energy counter (before Volta)", "no driver"])
def test_no_meter_where_nvml_cannot_measure(nvml):
    assert nvml_meter(nvml) is None


def test_energy_per_request_from_the_gpus_else_from_the_cpu_model():
    meter = nvml_meter(fake_nvml([0]))
    assert per_request_mj(meter, joules=6.0, worker_s=100.0, requests=3000) == (pytest.approx(2.0), "nvml")
    mj, source = per_request_mj(None, joules=0.0, worker_s=3.0, requests=1500)
    assert source == CPU_MODEL and mj == pytest.approx(1000 * 3.0 * CPU_WATTS_PER_BUSY_CORE / 1500)


@pytest.mark.slow
def test_bench_energy_measures_every_model_and_each_modes_energy_per_request(capsys, hybridserve_family):
    """`accscale bench energy`, briefly: the models run where torch finds a GPU (NVML's joules there), else on one CPU
    thread (the CPU power model over its CPU seconds); a mode's energy is its cascade's Σ ρ_i e_i."""
    import json

    from scheduler_sidecar.cli import main

    assert main(["bench", "energy", "--seconds", "0.2", "--build-dir", str(hybridserve_family.folder.parent),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["energy_source"] == ("nvml" if out["device"] == "cuda" else CPU_MODEL)
    e = {r["model"]: r["mj_per_request"] for r in out["models"]}
    assert list(e) == hybridserve_family.names and all(v > 0 for v in e.values())
    modes = {m["mode"]: m for m in out["modes"]}
    for m in modes.values():
        reach = [float(r) for r in m["reach"].split()]
        # the shares are printed to 3 decimals
        assert m["mj_per_request"] == pytest.approx(sum(r * e[n] for r, n in zip(reach, m["models"].split())),
                                                    abs=5e-4 * sum(e.values()))
    assert modes["largest"]["saving"] == 1.0
    assert {c["id"] for c in out["claims"]} == {"table5.ap_energy_saving", "table5.eo_energy_saving",
                                                "table5.eo_saves_most_energy"}


@pytest.mark.parametrize("args", [["--seconds", "0"], ["--batch", "0"]])
def test_bench_energy_refuses_an_empty_measurement(args, capsys):
    from scheduler_sidecar.cli import main

    assert main(["bench", "energy", *args]) == 2
    assert "--seconds must be > 0 and --batch >= 1" in capsys.readouterr().err
