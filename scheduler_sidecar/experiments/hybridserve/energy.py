"""Energy per request. §VI-C measures GPU energy with NVML; where the models run on GPUs, so do we (:class:`NvmlMeter`,
the cumulative energy counters of every GPU the host has, which the driver keeps whatever runs on them). Elsewhere,
energy is worker-seconds times ``CPU_WATTS_PER_BUSY_CORE``, a documented power model: a server CPU's package power
over its cores at full load, about 10 W per busy core (e.g. a 150 W, 16-core part). Idle power, which the paper's
metric includes, is left out of the model, so its ratios between modes are those of compute, not the paper's
system-level Table V; NVML's counters include the GPUs' idle power, as the paper's do.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

CPU_WATTS_PER_BUSY_CORE = 10.0
CPU_MODEL = f"cpu model, {CPU_WATTS_PER_BUSY_CORE:g} W per busy core"


def cpu_energy_j(worker_s: float) -> float:
    """Joules of ``worker_s`` busy worker-seconds under the CPU power model."""
    return worker_s * CPU_WATTS_PER_BUSY_CORE


@dataclass(frozen=True)
class NvmlMeter:
    """Every GPU's energy since its driver loaded (``nvmlDeviceGetTotalEnergyConsumption``, Volta and newer)."""

    nvml: ModuleType  # pynvml, initialised
    handles: tuple

    source = "nvml"

    def joules(self) -> float:
        return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1000  # mJ


def nvml_meter(nvml: ModuleType | None = None) -> NvmlMeter | None:
    """The GPUs' meter, or None where NVML cannot give one: no ``pynvml`` (the ``gpu`` extra installs it), no driver,
    no GPU, or a GPU without an energy counter. ``nvml`` stands in for pynvml in tests."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
        handles = tuple(nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount()))
        for handle in handles:  # NVML_ERROR_NOT_SUPPORTED before Volta
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except nvml.NVMLError:
        return None
    return NvmlMeter(nvml, handles) if handles else None


def per_request_mj(meter: NvmlMeter | None, joules: float, worker_s: float, requests: int) -> tuple[float, str]:
    """(millijoules per request, where they come from): the GPUs' ``joules`` over the run where ``meter`` measured
    them, else the CPU power model's for the models' ``worker_s``."""
    if meter is not None:
        return 1000 * joules / requests, meter.source
    return 1000 * cpu_energy_j(worker_s) / requests, CPU_MODEL
